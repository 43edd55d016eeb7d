"""The deployment and trust records: typed in memory, the same JSON on disk as older agents wrote."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from agent.deploy.machine import RECOVERY, Deployment, Options, Outcome, State, load_record
from agent.deploy.record import Findings, Part
from edgecore.errors import ConfigError
from edgecore.protocol.manifest import FileEntry, Manifest, PayloadInfo, TargetInfo
from edgecore.protocol.trust import RoleTrust, TrustStore

MANIFEST = Manifest(name="m", version=2, created_at=1.0, expires_at=2.0, min_agent_version="0.1.0",
                    target=TargetInfo("any"), payload=PayloadInfo(10, "ab" * 32, 1024, ("ab" * 32,)),
                    files=(FileEntry("model.onnx", 10, "ab" * 32, "model"),), model="model.onnx", inputs=(),
                    outputs=()).to_bytes()

# deployment.json exactly as the agent wrote it before the typed records (schema 1, no ticket).
OLD_RECORD: dict[str, Any] = {
    "schema": 1, "deployment_id": "d-1", "state": "health", "manifest": base64.b64encode(MANIFEST).decode(),
    "entries": {"download": 1, "health": 1}, "reason": "", "outcome": "",
    "data": {"allow_downgrade": True, "shadow_min": 0.9, "slot": "b", "stage": "loaded", "backend": "onnxruntime-cpu",
             "selection": {"backend": "onnxruntime-cpu", "figures": []}, "health_p95_ms": 1.25,
             "shadow": {"agreement": 1.0, "min_agreement": 0.9}},
}


def test_a_record_written_before_sets_still_resumes_as_a_unit_of_one(tmp_path: Path) -> None:
    path = tmp_path / "deployment.json"
    path.write_text(json.dumps(OLD_RECORD))
    record = load_record(path)
    assert record is not None
    assert record.state is State.ROLLBACK  # saved in HEALTH: a restart rolls back
    [part] = record.parts
    assert part.deployment_id == record.deployment_id == "d-1" and part.name == "m" and record.unit == "m"
    assert part.options == Options(allow_downgrade=True, shadow_min=0.9)
    # The slot moved with the model under models/<name>/ (agent.deploy.slots migrates the directories).
    assert part.findings.slot == "m/b" and part.findings.health_p95_ms == 1.25 and record.ticket == 0
    assert part.findings.report() == {"backend": "onnxruntime-cpu", "health_p95_ms": 1.25, "stage": "loaded",
                                      "shadow": {"agreement": 1.0, "min_agreement": 0.9}}
    saved = record.to_dict()
    assert saved["parts"][0]["data"] == {**OLD_RECORD["data"], "slot": "m/b"} and saved["schema"] == 2  # the same names


def test_round_trip_keeps_every_field() -> None:
    d = Deployment([Part("d-2", MANIFEST, Options(False, None), Findings(slot="m/a", backend="x", footprints={"x": 1.5})),
                    Part("d-3", MANIFEST, Options(True, 0.5))], State.COMMIT, {"commit": 2}, "why", Outcome.OK, ticket=7)
    back = Deployment.from_dict(json.loads(json.dumps(d.to_dict())), {s: s for s in State})
    assert back == d and back is not None and back.unit == "m+m"


@pytest.mark.parametrize("change", [
    {"data": {"slot": 3}}, {"data": {"allow_downgrade": "yes"}}, {"data": {"health_p95_ms": "fast"}},
    {"data": {"footprints": {"x": "big"}}}, {"data": []}, {"outcome": "great"}, {"schema": 3}, {"manifest": None},
    {"manifest": base64.b64encode(b"{}").decode()},
])
def test_a_damaged_record_is_not_resumed(tmp_path: Path, change: dict[str, object]) -> None:
    path = tmp_path / "deployment.json"
    path.write_text(json.dumps({**OLD_RECORD, **change}))
    assert load_record(path) is None


def test_a_set_record_without_parts_is_not_resumed(tmp_path: Path) -> None:
    path = tmp_path / "deployment.json"
    path.write_text(json.dumps({"schema": 2, "state": "stage", "parts": []}))
    assert load_record(path) is None


def test_an_unknown_saved_state_resumes_as_rollback() -> None:
    record = Deployment.from_dict({**OLD_RECORD, "state": "teleport"}, RECOVERY)
    assert record is not None and record.state is State.ROLLBACK


def test_trust_state_reads_the_saved_names(tmp_path: Path) -> None:
    saved = {"package": {"version": 3, "added": [], "retired": ["abc"]}, "controller": {"version": 0, "added": [], "retired": []}}
    (tmp_path / "trust.json").write_text(json.dumps(saved))
    store = TrustStore(tmp_path, [], [])
    assert store._state["package"] == RoleTrust(3, (), ("abc",))
    assert {r: t.to_dict() for r, t in store._state.items()} == saved


def test_damaged_trust_state_is_refused_not_forgotten(tmp_path: Path) -> None:
    (tmp_path / "trust.json").write_text(json.dumps({"package": {"version": "3", "added": [], "retired": []}}))
    with pytest.raises(ConfigError, match="version must be an integer"):
        TrustStore(tmp_path, [], [])
