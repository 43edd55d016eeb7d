"""The OpenAPI document matches what the server answers: every documented operation is served, nothing else is."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate

from edgectl.api import ApiServer, api_context, api_routes
from edgectl.api.accounts import Accounts
from edgectl.config import EdgectlConfig
from edgectl.controller.accounts import Role
from edgectl.controller.store import SqliteStore


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ApiServer, str]]:
    store = SqliteStore(tmp_path / "controller.db")
    ctx = api_context(store, EdgectlConfig())
    Accounts(store).add_user("root", Role.ADMIN, "test")
    _, token = Accounts(store).create_token("root", "", None, "test")
    server = ApiServer(ctx, api_routes(ctx), "127.0.0.1", 0).start()
    yield server, token
    server.stop()


def _call(server: ApiServer, method: str, path: str, token: str) -> tuple[int, Any]:
    request = urllib.request.Request(server.url + path, method=method, headers={"Authorization": f"Bearer {token}"},
                                     data=b"{}" if method in ("POST", "DELETE") else None)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_document_is_valid_openapi_and_lists_every_route(served: tuple[ApiServer, str]) -> None:
    server, token = served
    status, raw = _call(server, "GET", "/api/v1/openapi.json", token)
    assert status == 200
    doc = json.loads(raw)
    validate(doc)
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    served_routes = {(r.method, r.path) for r in server.router.routes}
    assert documented == served_routes
    for route in server.router.routes:
        operation = doc["paths"][route.path][route.method.lower()]
        assert operation["x-role"] == (route.role.value if route.role else None)
        names = {p["name"] for p in operation["parameters"]}
        assert names == {p.name for p in route.params} | set(route.path_names), route.path


def test_every_documented_operation_is_served_and_nothing_else(served: tuple[ApiServer, str]) -> None:
    server, token = served
    doc = json.loads(_call(server, "GET", "/api/v1/openapi.json", token)[1])
    for path, operations in doc["paths"].items():
        concrete = path.replace("{rollout_id}", "r-x").replace("{device_id}", "d-x").replace("{name}", "nobody") \
                       .replace("{token_id}", "000000000000")
        for method in operations:
            status, body = _call(server, method.upper(), concrete, token)
            endpoint_missing = (status == 404 and "no such endpoint" in str(body)) or status == 405
            assert not endpoint_missing, (method, path, status, body)
    for method, path in [("GET", "/api/v1/nothing"), ("GET", "/api/v2/devices"), ("GET", "/api/v1/devices/a/b")]:
        status, body = _call(server, method, path, token)
        assert status == 404 and body["error"]["message"].startswith("no such endpoint"), (path, body)
    status, body = _call(server, "DELETE", "/api/v1/devices", token)
    assert status == 405 and "GET" in body["error"]["message"]


def test_document_shows_the_device_history_and_the_pacing_field(served: tuple[ApiServer, str]) -> None:
    server, token = served
    doc = json.loads(_call(server, "GET", "/api/v1/openapi.json", token)[1])
    detail = doc["paths"]["/api/v1/devices/{device_id}"]["get"]
    history = detail["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["telemetry_history"]
    assert set(history["items"]["properties"]) == {"ts", "model", "version", "p50_ms", "p95_ms", "cpu_percent",
                                                   "memory_percent", "requests", "rate_rps"}
    assert [p["name"] for p in detail["parameters"]] == ["device_id", "history"]
    create = doc["paths"]["/api/v1/rollouts"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert create["properties"]["max_per_minute"] == {**create["properties"]["max_per_minute"], "type": "integer", "minimum": 0}
