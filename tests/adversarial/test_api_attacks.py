"""The REST API (``edgectl api serve``, a real process) under hostile clients and hostile numbers.

Issue 27 found: slow clients with no token (a header line every 15 s) pushing the controller to
its descriptor limit until the API stopped answering; two differing ``Content-Length``s
desynchronising the framing; offsets of 2**63 and more and JSON nested 200,000 deep answering 500;
``expires_days`` NaN, Infinity or 1e308 giving a token that never expires; and a selector tag key
with a quote answering "the store is busy; retry" (a client retries forever). The process runs with
256 descriptors and a 2 s header timeout so that each limit shows in seconds.
"""

from __future__ import annotations

import http.client
import json
import resource
import socket
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from edgectl.api.accounts import Accounts
from edgectl.controller.accounts import Role
from edgectl.controller.store import open_url
from tests.adversarial.hostile import closed_within, slow_clients, still_open
from tests.brokers import free_port
from tests.checkout import checkout_env
from tests.fleet import wait_for

NOFILE = 256


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@dataclass
class Api:
    port: int
    admin: str
    viewer: str

    def call(self, method: str, path: str, body: bytes | None = None, token: str | None = None,
             source: str = "127.0.0.1") -> tuple[int, Any, dict[str, str]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10, source_address=(source, 0))
        headers = {"Authorization": f"Bearer {token or self.admin}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=headers)
        answer = conn.getresponse()
        raw = answer.read()
        conn.close()
        kind = answer.getheader("Content-Type") or ""
        return answer.status, json.loads(raw) if kind.startswith("application/json") and raw else raw, dict(answer.headers)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    home = tmp_path_factory.mktemp("api-home")
    (home / "edgectl.yaml").write_text(json.dumps({"api": {"header_timeout_s": 2}}))
    store = open_url(str(home / "controller.db"), packages_dir=home / "packages")
    accounts = Accounts(store)
    accounts.add_user("ann", Role.ADMIN, "test")
    accounts.add_user("val", Role.VIEWER, "test")
    tokens = [accounts.create_token(user, "", None, "test")[1] for user in ("ann", "val")]
    store.close()
    port = free_port()
    log = (home / "api.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "edgectl.cli.main", "api", "serve", "--http", f"127.0.0.1:{port}"],
                               cwd=home, env=checkout_env(EDGECTL_HOME=str(home)), stdout=log, stderr=subprocess.STDOUT,
                               preexec_fn=_low_nofile)
    served = Api(port, *tokens)

    def healthy() -> bool:
        try:
            return served.call("GET", "/api/v1/health")[0] == 200
        except OSError:
            return False

    wait_for(healthy, 60, "the API to answer")
    yield served
    process.terminate()
    process.wait(10)
    log.close()


def test_slow_clients_without_a_token_cannot_take_the_descriptors(api: Api) -> None:
    with slow_clients(api.port, NOFILE + 44) as slow:  # one header line each from 127.0.0.2, never the end of it
        held = still_open(slow, 64)  # the limit per address; the others were answered 503 and closed
        assert api.call("GET", "/api/v1/me")[0] == 200  # another client is served meanwhile
        assert all(closed_within(sock, 10) for sock in held), "slow heads outlived the 2 s header timeout"


def test_two_content_lengths_are_refused_before_any_framing(api: Api) -> None:
    smuggled = b"GET /api/v1/users HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + api.admin.encode() + b"\r\n\r\n"
    head = (f"POST /api/v1/users HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api.admin}\r\n"
            f"Content-Type: application/json\r\nContent-Length: 2\r\nContent-Length: {2 + len(smuggled)}\r\n\r\n")
    for lengths in ((2, 2 + len(smuggled)), (2, 2)):  # differing, and the same twice: both are one too many
        with socket.create_connection(("127.0.0.1", api.port), timeout=10) as sock:
            sock.sendall(head.replace(f"Content-Length: {2 + len(smuggled)}", f"Content-Length: {lengths[1]}").encode()
                         + b"{}" + smuggled)
            answers = b""
            while chunk := sock.recv(65536):
                answers += chunk
        assert answers.count(b"HTTP/1.1 ") == 1 and answers.startswith(b"HTTP/1.1 400 "), answers[:200]
        assert b"Duplicate Content-Length" in answers and b"Connection: close" in answers


@pytest.mark.parametrize("offset", [str(2**63), "99999999999999999999", "9" * 5000, "-1", "1e3", "0x10"])
def test_absurd_offsets_answer_400(api: Api, offset: str) -> None:
    for path in ("/api/v1/devices", "/api/v1/rollouts"):
        status, body, _ = api.call("GET", f"{path}?offset={offset}")
        assert status == 400 and body["error"]["field"] == "offset", (path, body)


def test_json_nested_200000_deep_answers_400(api: Api) -> None:
    for deep in (b"[" * 200_000 + b"]" * 200_000, b'{"user": ' + b"[" * 40 + b"]" * 40 + b"}"):
        status, body, _ = api.call("POST", "/api/v1/tokens", deep)
        assert (status, body["error"]["message"]) == (400, "body: nested deeper than 32 levels")


@pytest.mark.parametrize("days", ["NaN", "Infinity", "-Infinity", "1e308", "1e999", "1" + "0" * 400])
def test_a_token_lifetime_out_of_range_makes_no_token(api: Api, days: str) -> None:
    before = len(api.call("GET", "/api/v1/tokens")[1]["tokens"])
    status, body, _ = api.call("POST", "/api/v1/tokens", f'{{"user": "val", "expires_days": {days}}}'.encode())
    assert status == 400, body
    assert len(api.call("GET", "/api/v1/tokens")[1]["tokens"]) == before


def test_a_tag_key_with_a_quote_is_a_bad_request_not_a_busy_store(api: Api) -> None:
    for query in ("selector=" + urllib.parse.quote('ta"g=1'), "tag=" + urllib.parse.quote('a"b=1')):
        status, body, headers = api.call("GET", f"/api/v1/devices?{query}")
        assert status == 400 and "Retry-After" not in headers, body
        assert body["error"]["field"] in ("selector", "tag")


def _numeric_fields(document: dict[str, Any]) -> Iterator[tuple[str, str, str, str, dict[str, Any]]]:
    """(method, path, where, name, the rest of a valid body) of every number in every query and request body."""
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for param in operation.get("parameters", []):
                schema = param["schema"].get("items", param["schema"])
                if schema["type"] in ("integer", "number"):
                    yield method.upper(), path, "query", param["name"], {}
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            required = {key: ["x"] if body["properties"][key]["type"] == "array" else "x" for key in body.get("required", ())}
            for name, schema in body.get("properties", {}).items():
                if schema.get("type") in ("integer", "number"):
                    yield method.upper(), path, "body", name, required


def test_every_number_a_request_carries_is_finite_and_in_range(api: Api) -> None:
    """Each numeric query parameter and body field of the OpenAPI document, given NaN, infinities and overflows."""
    document = api.call("GET", "/api/v1/openapi.json")[1]
    fields = list(_numeric_fields(document))
    assert {(f[1], f[3]) for f in fields} >= {("/api/v1/tokens", "expires_days"), ("/api/v1/devices", "offset"),
                                              ("/api/v1/rollouts", "max_per_minute")}
    for method, path, where, name, rest in fields:
        concrete = path.replace("{device_id}", "d-1")
        for bad in ("NaN", "Infinity", "-Infinity", "1e308", "-1e308", str(2**64), "1e999"):
            if where == "query":
                status, body, _ = api.call(method, f"{concrete}?{name}={urllib.parse.quote(bad)}")
            else:
                fields_before = json.dumps(rest)[1:-1]
                status, body, _ = api.call(method, concrete, ("{" + fields_before + (", " if fields_before else "")
                                                              + f'"{name}": {bad}}}').encode())
            error = body["error"] if isinstance(body, dict) else {}
            assert status == 400 and (error.get("field") == name or bad in error.get("message", "")), \
                f"{method} {path} {where} {name}={bad}: {status} {body}"
