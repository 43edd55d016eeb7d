"""``/api/v1/webhooks`` on the real route table and HTTP server (in this process, a SQLite store): bad input is a 400
naming the field with nothing stored, the secret is answered once, the delivery log and redelivery."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgectl.api.accounts import Accounts
from edgectl.api.app import api_context, api_routes
from edgectl.api.server import ApiServer
from edgectl.config import EdgectlConfig
from edgectl.controller.accounts import ROLES
from edgectl.controller.store import SqliteStore
from edgectl.keys import Keyring

GOOD = {"url": "https://hooks.example.com/edge?team=fleet", "events": ["rollout.*", "device.deployment_failed"]}


@dataclass
class Api:
    server: ApiServer
    store: SqliteStore
    tokens: dict[str, str]

    def call(self, method: str, path: str, body: Any = None, role: str = "admin") -> tuple[int, Any, bytes]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.tokens[role]}", "Content-Type": "application/json"}
        request = urllib.request.Request(f"{self.server.url}/api/v1{path}", data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                raw = answer.read()
                return answer.status, json.loads(raw), raw
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw), raw


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    store = SqliteStore(tmp_path / "store.db")
    ctx = api_context(store, EdgectlConfig(), keyring=Keyring(tmp_path / "keys"))
    accounts = Accounts(store)
    tokens = {}
    for role in ROLES:
        accounts.add_user(f"{role}-user", role, "test")
        tokens[role.value] = accounts.create_token(f"{role}-user", "", None, "test")[1]
    server = ApiServer(ctx, api_routes(ctx), "127.0.0.1", 0).start()
    yield Api(server, store, tokens)
    server.stop()
    store.close()


@pytest.mark.parametrize(("body", "field"), [
    ({"events": ["*"]}, "url"),
    ({**GOOD, "url": "ftp://hooks.example.com/edge"}, "url"),
    ({**GOOD, "url": "http://user:pass@hooks.example.com/"}, "url"),
    ({**GOOD, "url": "http:///no-host"}, "url"),
    ({**GOOD, "url": "https://hooks.example.com/a b"}, "url"),
    ({**GOOD, "url": "https://hooks.example.com:99999/"}, "url"),
    ({**GOOD, "events": []}, "events"),
    ({**GOOD, "events": "rollout.*"}, "events"),
    ({**GOOD, "events": ["rollout.*", "rollout.exploded"]}, "events[1]"),
    ({**GOOD, "secret": "short"}, "secret"),
    ({**GOOD, "secret": 12345678901234567}, "secret"),
    ({**GOOD, "enabled": False}, "enabled"),
])
def test_bad_input_is_a_400_naming_the_field_and_nothing_is_stored(api: Api, body: dict[str, Any], field: str) -> None:
    status, answer, _ = api.call("POST", "/webhooks", body)
    assert (status, answer["error"].get("field")) == (400, field), answer
    assert answer["error"]["message"].startswith(field)
    assert api.store.webhooks() == [] and [a.action for a in api.store.audit_log()].count("webhook added") == 0


def test_the_secret_is_answered_once_and_never_again(api: Api) -> None:
    assert api.call("POST", "/webhooks", GOOD, role="operator")[0] == 403
    status, made, _ = api.call("POST", "/webhooks", GOOD)
    assert status == 201 and made["secret"].startswith("whsec_") and len(made["secret"]) > 40
    assert made["secret_hint"] == "…" + made["secret"][-4:] and made["events"] == GOOD["events"]
    status, given, _ = api.call("POST", "/webhooks", {**GOOD, "secret": "my-own-secret-0123456789"})
    assert status == 201 and given["secret"] == "my-own-secret-0123456789"
    for path in ("/webhooks", f"/webhooks/{made['id']}"):
        status, _, raw = api.call("GET", path, role="operator")
        assert status == 200 and made["secret"].encode() not in raw and b"my-own-secret" not in raw
        assert b'"secret"' not in raw
    listed = api.call("GET", "/webhooks", role="operator")[1]["webhooks"]
    assert [(w["id"], w["url"], w["created_by"]) for w in listed] == [
        (made["id"], GOOD["url"], "api:admin-user"), (given["id"], GOOD["url"], "api:admin-user")]
    added = [a for a in api.store.audit_log() if a.action == "webhook added"]
    assert len(added) == 2 and all("hooks.example.com" in a.detail and "team=fleet" not in a.detail for a in added)


def test_deliveries_filtered_redelivered_and_removed_with_their_webhook(api: Api) -> None:
    hook = api.call("POST", "/webhooks", GOOD)[1]
    other = api.call("POST", "/webhooks", {**GOOD, "events": ["device.*"]})[1]
    api.store.audit("rollout halted", "wave 1: gate failed", "r1")
    api.store.audit("device failed", "install: no space", "r1", "d1")
    status, found, _ = api.call("GET", f"/webhooks/{hook['id']}/deliveries", role="operator")
    assert status == 200 and sorted(d["event"] for d in found["deliveries"]) == ["device.deployment_failed", "rollout.halted"]
    halted = next(d for d in found["deliveries"] if d["event"] == "rollout.halted")
    assert halted["payload"]["detail"] == "wave 1: gate failed" and halted["status"] == "pending"
    status, answer, _ = api.call("GET", f"/webhooks/{hook['id']}/deliveries?status=lost", role="operator")
    assert (status, answer["error"]["field"]) == (400, "status")
    assert api.call("GET", f"/webhooks/{hook['id']}/deliveries?status=delivered", role="operator")[1]["deliveries"] == []
    assert api.call("GET", "/webhooks/wh_none/deliveries", role="operator")[0] == 404

    wrong = api.call("POST", f"/webhooks/{other['id']}/deliveries/{halted['id']}/redeliver")
    assert wrong[0] == 404, "a delivery redelivered under another webhook"
    status, again, _ = api.call("POST", f"/webhooks/{hook['id']}/deliveries/{halted['id']}/redeliver")
    assert status == 202 and again["id"] != halted["id"] and again["event_id"] == halted["event_id"]
    assert (again["status"], again["attempts"], again["payload"]) == ("pending", 0, halted["payload"])

    assert api.call("DELETE", f"/webhooks/{hook['id']}", role="operator")[0] == 403
    assert api.call("DELETE", f"/webhooks/{hook['id']}")[1] == {"removed": hook["id"]}
    assert api.call("DELETE", f"/webhooks/{hook['id']}")[0] == 404
    assert api.call("GET", f"/webhooks/{hook['id']}", role="operator")[0] == 404
    assert api.store.deliveries(hook["id"]) == [] and len(api.store.deliveries(other["id"])) == 1


def test_the_openapi_document_lists_the_webhook_routes(api: Api) -> None:
    request = urllib.request.Request(f"{api.server.url}/api/v1/openapi.json")
    with urllib.request.urlopen(request, timeout=30) as answer:
        paths = json.loads(answer.read())["paths"]
    assert set(paths["/api/v1/webhooks"]) == {"get", "post"}
    assert set(paths["/api/v1/webhooks/{webhook_id}"]) == {"get", "delete"}
    assert "get" in paths["/api/v1/webhooks/{webhook_id}/deliveries"]
    assert "post" in paths["/api/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver"]
    body = paths["/api/v1/webhooks"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["url", "events"]
