"""``edgectl device decommission|delete``, ``edgectl package list|delete`` and ``edgectl audit`` on a SQLite store, run
in this process through the CLI's own entry (``edgectl.cli.main``): outcomes, one-line errors with their exit codes,
nothing changed by a refused command."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

import pytest

from edgecore.protocol.reports import Birth
from edgectl.cli.main import _run
from edgectl.controller.queries import UploadedPackage
from edgectl.controller.records import PackageRef, Phase, RolloutRow, RolloutSpec, RolloutStatus
from edgectl.controller.store import SqliteStore
from edgectl.pki import Algorithm, FleetPki


def edgectl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = _run(list(args), False)
    except SystemExit as exc:  # typer ends a command that returned with SystemExit(0)
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SqliteStore:
    monkeypatch.setenv("EDGECTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    kept = SqliteStore(tmp_path / "home" / "controller.db")
    for device_id in ("cam-1", "cam-2"):
        kept.upsert_device(device_id, birth=Birth(device_id, target="cpu-x86"), birth_at=1.0)
    return kept


def _package(store: SqliteStore, tmp_path: Path, variant: str, used: bool) -> Path:
    source = tmp_path / f"{variant[:4]}.edgepkg"
    source.write_bytes(b"bytes")
    kept = store.keep_package(variant, source)
    ref = PackageRef(variant, "c" * 64, "det", 1, "any", "det", str(kept), 5)
    store.save_package(UploadedPackage(ref, 1.0, "api:op"))
    if used:
        spec = RolloutSpec("all", (ref,), 1, 0.05, 0.0, (), 60.0)
        store.create_rollout(RolloutRow("r-used", 1.0, RolloutStatus.DONE, spec, 1, Phase.BAKING), [])
    return kept


def test_decommission_and_delete_a_device(store: SqliteStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pki = FleetPki.init(tmp_path / "pki", Algorithm.P256)
    serial = pki.enroll("cam-2", 30).cert.serial_number
    code, out, _ = edgectl(capsys, "device", "decommission", "cam-2", "--pki", str(pki.root), "--json")
    assert code == 0 and json.loads(out)["certificate"] == "revoked" and pki.is_revoked(serial)
    assert edgectl(capsys, "device", "decommission", "cam-2", "--pki", str(pki.root))[::2] == (
        5, "error: device 'cam-2' was decommissioned already\n")
    assert edgectl(capsys, "device", "decommission", "nope")[::2] == (
        2, "error: device 'nope' is not in the controller store\n")
    code, out, _ = edgectl(capsys, "device", "decommission", "cam-1", "--pki", str(tmp_path / "no-pki"))
    assert code == 0 and "no fleet CA here" in out
    assert [d.id for d in store.devices()] == []

    code = edgectl(capsys, "device", "delete", "cam-1")[0]
    assert code == 0 and store.device("cam-1") is None
    store.upsert_device("cam-3", birth=Birth("cam-3"), birth_at=1.0)
    assert edgectl(capsys, "device", "delete", "cam-3")[::2] == (
        5, "error: device 'cam-3' is a fleet member: decommission it before deleting it\n")
    assert store.device("cam-3") is not None


def test_delete_a_package_and_read_the_audit_log(store: SqliteStore, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    used, spare = "ab" * 32, "cd" * 32
    used_file, spare_file = _package(store, tmp_path, used, True), _package(store, tmp_path, spare, False)
    code, out, _ = edgectl(capsys, "package", "list", "--json")
    assert code == 0 and [(p["variant"], p["rollouts"]) for p in json.loads(out)] == [(used, ["r-used"]), (spare, [])]
    assert edgectl(capsys, "package", "delete", "not-a-variant")[0] == 2
    code, _, err = edgectl(capsys, "package", "delete", used)
    assert code == 5 and err.startswith(f"error: package {used[:12]} is used by rollout(s) r-used") and used_file.exists()
    assert edgectl(capsys, "package", "delete", spare)[0] == 0
    assert [p.ref.variant for p in store.packages()] == [used] and not spare_file.exists()

    store.audit("=HYPERLINK(\"http://x\")", "-1", device_id="cam-1", actor="@evil")
    code, out, _ = edgectl(capsys, "audit", "--actor", "cli:*", "--json")
    assert code == 0 and [e["action"] for e in json.loads(out)["entries"]] == ["package deleted"]
    code, out, _ = edgectl(capsys, "audit", "--device", "cam-1", "--actor", "@evil", "--csv")
    assert code == 0 and list(csv.reader(io.StringIO(out)))[1][3:5] == ["'@evil", "'=HYPERLINK(\"http://x\")"]
    code, out, _ = edgectl(capsys, "audit", "--since", time.strftime("%Y-%m-%d", time.gmtime()), "--action", "package *")
    assert code == 0 and out.startswith("audit (1 of 1)")
    for args, message in ((("--since", "yesterday"), "error: --since: 'yesterday' is neither Unix seconds nor an ISO "
                                                     "8601 time (2026-01-31 or 2026-01-31T12:00:00Z)\n"),
                          (("--since", "10", "--until", "5"), "error: --until: must be after --since\n"),
                          (("--json", "--csv"), "error: --json and --csv: give one of them\n")):
        assert edgectl(capsys, "audit", *args)[::2] == (2, message)
