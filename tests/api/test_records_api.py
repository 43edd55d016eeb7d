"""Records taken out over the REST API: decommission and delete a device (its certificate revoked by the fleet CA
this host holds), delete a package no rollout names, and the audit log's filters, pages and CSV export.

The real route table and HTTP server run in this process on a SQLite store (the store's answers on both
engines are tests/store/test_retired.py's); every refusal names its field and leaves the store as it was.
"""

from __future__ import annotations

import csv
import io
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgecore.protocol.manifest import TargetInfo
from edgecore.protocol.reports import Birth, DeviceState, RunningModel, Telemetry
from edgectl.api.accounts import Accounts
from edgectl.api.app import api_context, api_routes
from edgectl.api.server import ApiServer
from edgectl.config import EdgectlConfig
from edgectl.controller.accounts import ROLES
from edgectl.controller.history import TelemetryPoint
from edgectl.controller.store import SqliteStore
from edgectl.examples import tiny_classifier
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, build_package
from edgectl.pki import Algorithm, FleetPki


@dataclass
class Api:
    server: ApiServer
    store: SqliteStore
    tokens: dict[str, str]
    root: Path

    def call(self, method: str, path: str, role: str = "operator", raw: bytes | None = None,
             body: Any = None) -> tuple[int, Any, dict[str, str]]:
        headers = {"Authorization": f"Bearer {self.tokens[role]}"}
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.server.url + "/api/v1" + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                status, raw_body, got = answer.status, answer.read(), dict(answer.headers)
        except urllib.error.HTTPError as exc:
            status, raw_body, got = exc.code, exc.read(), dict(exc.headers)
        kind = got.get("Content-Type", "")
        return status, json.loads(raw_body) if kind.startswith("application/json") else raw_body.decode(), got

    def package(self, name: str, version: int) -> bytes:
        onnx = tiny_classifier(self.root / f"{name}-{version}.onnx", size=8)
        out = self.root / f"{name}-{version}.edgepkg"
        build_package(onnx, BuildOptions(name, version, TargetInfo("any"), golden_samples=0),
                      Keyring(self.root / "keys").signing_key("package"), out)
        return out.read_bytes()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    ring = Keyring(tmp_path / "keys")
    ring.init("package")
    store = SqliteStore(tmp_path / "store.db")
    ctx = api_context(store, EdgectlConfig(), keyring=ring)
    accounts = Accounts(store)
    tokens = {}
    for role in ROLES:
        accounts.add_user(f"{role}-user", role, "test")
        tokens[role.value] = accounts.create_token(f"{role}-user", "", None, "test")[1]
    server = ApiServer(ctx, api_routes(ctx), "127.0.0.1", 0).start()
    yield Api(server, store, tokens, tmp_path)
    server.stop()
    store.close()


def _device(store: SqliteStore, device_id: str) -> None:
    store.upsert_device(device_id, birth=Birth(device_id, agent_version="0.9", target="cpu-x86"), birth_at=1.0,
                        state=DeviceState(device_id, active=RunningModel("det", 1)), state_at=1.0)
    store.upsert_device(device_id, online=1, presence_at=1.0, telemetry=Telemetry(device_id, 5.0), telemetry_ts=5.0,
                        telemetry_at=5.0)
    store.add_telemetry(TelemetryPoint(device_id, 5.0, "det", 1, 1.0, 2.0, 10.0, 20.0, 7, 1.0), claimed=5.0)


def test_decommission_revokes_the_certificate_and_delete_removes_the_device(
        api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _device(api.store, "cam-1")
    _device(api.store, "cam-2")
    pki = FleetPki.init(tmp_path / "pki", Algorithm.P256)
    serial = pki.enroll("cam-2", 30).cert.serial_number
    monkeypatch.setenv("EDGECTL_PKI", str(pki.root))

    assert api.call("POST", "/devices/nope/decommission")[0] == 404
    status, done, _ = api.call("POST", "/devices/cam-2/decommission")
    assert status == 200 and done["certificate"] == "revoked" and str(pki.crl_path) in done["crl_written"]
    assert pki.is_revoked(serial)
    status, again, _ = api.call("POST", "/devices/cam-2/decommission")
    assert status == 409 and again["error"]["field"] == "device_id" and "already" in again["error"]["message"]

    listed = api.call("GET", "/devices", "viewer")[1]
    assert [d["device_id"] for d in listed["devices"]] == ["cam-1"] and listed["total"] == 1
    gone = api.call("GET", "/devices?decommissioned=true", "viewer")[1]
    assert [d["device_id"] for d in gone["devices"]] == ["cam-2"]
    assert api.call("GET", "/devices/cam-2", "viewer")[1]["decommissioned"] == pytest.approx(done["decommissioned"])
    assert api.call("GET", "/fleet/summary", "viewer")[1]["total"] == 1
    assert b'edgectl_devices{status="online",target="cpu-x86"} 1.0' in _metrics(api)
    audit = api.call("GET", "/audit?device_id=cam-2&action=device%20decommissioned", "viewer")[1]["entries"]
    assert [(e["actor"], e["detail"]) for e in audit] == [("api:operator-user", "certificate: revoked")]

    status, refused, _ = api.call("DELETE", "/devices/cam-1", "admin")
    assert status == 409 and refused["error"]["field"] == "device_id" and "decommission it" in refused["error"]["message"]
    assert api.store.device("cam-1") is not None and api.store.telemetry_history("cam-1")
    assert api.call("DELETE", "/devices/cam-2", "admin")[:2] == (200, {"deleted": "cam-2"})
    assert api.call("GET", "/devices/cam-2", "viewer")[0] == 404 and api.store.telemetry_history("cam-2") == []


def _metrics(api: Api) -> bytes:
    request = urllib.request.Request(api.server.url + "/metrics", headers={"Authorization": f"Bearer {api.tokens['viewer']}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        body: bytes = answer.read()
    return body


def test_a_package_is_deleted_only_while_no_rollout_names_it(api: Api) -> None:
    _device(api.store, "cam-1")
    used = api.call("POST", "/packages", raw=api.package("det", 1))[1]["variant"]
    spare = api.call("POST", "/packages", raw=api.package("det", 2))[1]["variant"]
    status, created, _ = api.call("POST", "/rollouts", body={"packages": [used], "selector": "all", "bake": "0s"})
    assert status == 201
    files = {p.ref.variant: Path(p.ref.path) for p in api.store.packages()}

    for variant, code in (("..", 400), ("A" * 64, 400), ("0" * 64, 404), ("..%2F..%2Fstore.db", 404)):  # the last: no route
        status, answer, _ = api.call("DELETE", f"/packages/{variant}")
        assert status == code, (variant, answer)
        assert code == 404 or answer["error"]["field"] == "variant"
    status, refused, _ = api.call("DELETE", f"/packages/{used}")
    assert status == 409 and refused["error"]["field"] == "variant" and created["rollout_id"] in refused["error"]["message"]
    assert files[used].exists() and len(api.store.packages()) == 2

    assert api.call("DELETE", f"/packages/{spare}", "viewer")[0] == 403
    status, deleted, _ = api.call("DELETE", f"/packages/{spare}")
    assert status == 200 and deleted["deleted"]["variant"] == spare and "path" not in deleted["deleted"]
    assert [p["variant"] for p in api.call("GET", "/packages", "viewer")[1]["packages"]] == [used]
    assert not files[spare].exists() and files[used].exists()
    audit = api.call("GET", "/audit?action=package%20deleted", "viewer")[1]["entries"]
    assert [(e["actor"], e["detail"][-12:]) for e in audit] == [("api:operator-user", spare[:12])]


def test_the_audit_log_filters_pages_and_exports_csv_a_spreadsheet_cannot_run(api: Api) -> None:
    hostile = [("=cmd|' /C calc'!A0", "device decommissioned", 'a "quoted", multi\nline detail'),
               ("user:bob", "+SUM(1)", "-2"), ("user:carol", "package deleted", "@import")]
    for actor, action, detail in hostile:
        api.store.audit(action, detail, actor=actor)
        time.sleep(0.01)
    entries = api.call("GET", "/audit", "viewer")[1]["entries"]
    ours = [e for e in entries if e["actor"] != "test"]
    assert [e["action"] for e in ours] == [a for _, a, _ in hostile]

    assert [e["actor"] for e in api.call("GET", "/audit?actor=user:*", "viewer")[1]["entries"]] == ["user:bob", "user:carol"]
    since = ours[1]["ts"]
    status, page, _ = api.call("GET", f"/audit?since={since}&limit=1", "viewer")
    assert status == 200 and page["total"] == 2 and [e["actor"] for e in page["entries"]] == ["user:carol"]
    assert [e["actor"] for e in api.call("GET", f"/audit?since={since}&limit=1&offset=1", "viewer")[1]["entries"]] == [
        "user:bob"]
    assert api.call("GET", "/audit?since=2000-01-01T00:00:00Z&until=2000-01-02", "viewer")[1]["total"] == 0
    for query, field in (("since=yesterday", "since"), ("until=-5", "until"), ("since=10&until=5", "until"),
                         ("format=xml", "format"), ("offset=-1", "offset")):
        status, error, _ = api.call("GET", f"/audit?{query}", "viewer")
        assert status == 400 and error["error"]["field"] == field, (query, error)

    paths = api.call("GET", "/openapi.json")[1]["paths"]
    assert "text/csv" in paths["/api/v1/audit"]["get"]["responses"]["200"]["content"]
    assert {"post"} <= set(paths["/api/v1/devices/{device_id}/decommission"]) and "delete" in paths["/api/v1/packages/{variant}"]
    status, text, headers = api.call("GET", "/audit?actor=*&format=csv&limit=3", "viewer")
    assert status == 200 and headers["Content-Type"].startswith("text/csv") and "attachment" in headers["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["id", "time", "ts", "actor", "action", "rollout_id", "device_id", "detail"]
    cells = [(r[3], r[4], r[7]) for r in rows[1:]]
    assert cells == [("'=cmd|' /C calc'!A0", "device decommissioned", 'a "quoted", multi\nline detail'),
                     ("user:bob", "'+SUM(1)", "'-2"), ("user:carol", "package deleted", "'@import")]
