"""The assembled reference stack, as its operator sees it: edgectl with the stack's env, the REST API, Prometheus.

The tests share one stack (module scope) and run in file order: the rollouts build on each other's
versions (v2, v3 aborted, v4), and the kill test comes last because it leaves a replica and a NATS
node dead.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from collections import Counter
from typing import Any

from tests.assembly.conftest import TELEMETRY_S, Stack, settle
from tests.checkout import REPO
from tests.fleet import wait_for

FINAL = ("done", "rolled-back", "aborted")


def deploy(stack: Stack, version: int, *args: str) -> str:
    """``edgectl deploy PKG --fleet all`` of a new version published to the stack's artifact origin: the rollout id."""
    package, artifact_url = stack.package(version)
    done = stack.edgectl("deploy", str(package), "--fleet", "all", "--artifact-url", artifact_url, "--json", *args)
    answer = json.loads(done.stdout)
    return str(answer.get("rollout_id") or answer["id"])


def healths(stack: Stack) -> list[dict[str, Any]]:
    return [stack.api("/api/v1/health", url=url) for url in stack.api_urls]


def on_version(stack: Stack, version: int) -> None:
    """Every device's record in the store says it runs ``version``; else which device holds what, with the logs."""
    records = {d: stack.api(f"/api/v1/devices/{d}") for d in stack.devices}
    stale = {d: {k: r[k] for k in ("version", "deployment", "last_seen", "status")} for d, r in records.items()
             if r["version"] != version}
    assert not stale, f"the store's device state is not v{version}: {stale}\n{stack.logs()}"


def telemetry_flows(stack: Stack) -> None:
    """Every device's telemetry reaches the store, newer than the last look, on the REST API and in `edgectl devices`."""
    before = {d: stack.api(f"/api/v1/devices/{d}")["last_telemetry"] for d in stack.devices}
    assert all(before.values()), before

    def newer() -> None:
        now = time.time()
        after = {d: stack.api(f"/api/v1/devices/{d}")["last_telemetry"] for d in stack.devices}
        stale = {d: round(now - ts, 1) for d, ts in after.items() if ts <= before[d] or now - ts > 5 * TELEMETRY_S + 2}
        assert not stale, f"telemetry not stored lately (seconds since): {stale}"

    settle(newer, 15)
    listed = json.loads(stack.edgectl("devices", "--json").stdout)
    rows = listed if isinstance(listed, list) else listed["devices"]
    assert sorted(r["device_id"] for r in rows if r["status"] == "online") == sorted(stack.devices), \
        [(r["device_id"], r["status"], r.get("last_seen")) for r in rows]
    for health in healths(stack):
        assert health["status"] == "ok" and not health["problems"] and not health["ingest"]["silent"], health


def test_bake_longer_than_the_silence_gate_succeeds_on_the_ha_stack(stack: Stack) -> None:
    """PostgreSQL + two replicas + NATS: devices stay heard through a bake that outlasts the silence gate's window."""
    rollout_id = deploy(stack, 2, "--waves", "100%", "--bake", "8s", "--gate", "silence <= 3s", "--wait")  # exit 0: done
    rollout = stack.rollout(rollout_id)
    assert rollout["status"] == "done", (rollout, stack.logs())
    assert {d["device_id"]: d["status"] for d in rollout["devices"]} == dict.fromkeys(stack.devices, "ok")
    silence = next(g for g in rollout["gate_values"] if g["metric"] == "silence")
    assert silence["threshold"] == 3.0 and silence["verdict"] == "holds" and silence["value"] <= 3.0, silence
    done = stack.edgectl("rollout", "log", rollout_id, "--json")
    actions = [a["action"] for a in json.loads(done.stdout)]
    assert "wave promoted" in actions and not [a for a in actions if "rolled back" in a or "halted" in a], actions
    # A device's "ok" event and its new retained state are two messages: the state may land a moment after the rollout ends.
    settle(lambda: on_version(stack, 2), 30)


def test_telemetry_reaches_the_store_through_nats(stack: Stack) -> None:
    assert stack.info["broker"] == "nats" and len(stack.info["broker_urls"]) == 3
    telemetry_flows(stack)


def test_telemetry_reaches_the_store_through_mosquitto(mosquitto_stack: Stack) -> None:
    assert mosquitto_stack.info["broker"] == "mosquitto"
    telemetry_flows(mosquitto_stack)


def _series(stack: Stack, expr: str, *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"].get(label, "") for label in labels): float(r["value"][1]) for r in stack.promql(expr)}


def test_prometheus_scrapes_both_replicas_and_each_panel_counts_once(stack: Stack) -> None:
    """Every PromQL query of the shipped Grafana dashboard, during a baking canary wave, against the REST API's figures."""
    targets = [t for t in stack.targets() if t["health"] == "up"]
    assert sorted(t["scrapeUrl"] for t in targets) == sorted(f"{url}/metrics" for url in stack.api_urls), stack.targets()
    rollout_id = deploy(stack, 3, "--waves", "1,100%", "--bake", "10m")
    wait_for(lambda: stack.rollout(rollout_id)["progress"][0]["ok"] == 1, 60, "the canary to install", 0.5)
    panels = json.loads((REPO / "configs" / "grafana" / "edgectl-dashboard.json").read_text())
    exprs = {t["expr"] for p in panels["panels"] for t in p.get("targets", [])}
    fleet = len(stack.devices)
    rollout = stack.rollout(rollout_id)
    rollouts = Counter(r["status"] for r in stack.api("/api/v1/rollouts")["rollouts"])
    by_status: Counter[str] = Counter()
    for wave in rollout["progress"]:
        by_status.update(wave["by_status"])
    gates = {g["gate"]: g for g in rollout["gate_values"]}
    expected: dict[str, Any] = {
        'max by (target) (edgectl_devices{status="online"})': ({("cpu-x86",): fleet}, ("target",)),
        "sum by (status) (max by (target, status) (edgectl_devices))": ({("online",): fleet}, ("status",)),
        "max by (status) (edgectl_rollouts)": ({(s,): rollouts[s] for s in rollouts}, ("status",)),
        "max by (rollout, wave) (edgectl_rollout_wave_progress_ratio)":
            ({(rollout_id, "1"): 1.0, (rollout_id, "2"): 0.0}, ("rollout", "wave")),
        "max by (rollout) (edgectl_rollout_current_wave)": ({(rollout_id,): 1}, ("rollout",)),
        "max by (rollout) (edgectl_rollout_waves)": ({(rollout_id,): 2}, ("rollout",)),
        "sum by (rollout, status) (max by (rollout, wave, status) (edgectl_rollout_wave_devices))":
            ({(rollout_id, s): n for s, n in by_status.items()}, ("rollout", "status")),
        "max by (rollout, gate) (edgectl_rollout_gate_threshold)":
            ({(rollout_id, g): v["threshold"] for g, v in gates.items()}, ("rollout", "gate")),
        "min by (rollout) (edgectl_rollout_gate_holds)": ({(rollout_id,): 1.0}, ("rollout",)),
        "max by (rollout, wave) (edgectl_rollout_data_deadline_seconds) - time()": ({}, ("rollout", "wave")),
        "max by (rollout, gate) (edgectl_rollout_gate_no_data) == 1": ({}, ("rollout", "gate")),
    }

    def exact() -> None:
        wrong = {}
        for expr, (want, labels) in expected.items():
            got = _series(stack, expr, *labels)
            if expr == "max by (status) (edgectl_rollouts)":
                got = {k: v for k, v in got.items() if v}  # every status has a series, zero when none
            if got != {k: float(v) for k, v in want.items()}:
                wrong[expr] = (got, want)
        assert not wrong, wrong

    settle(exact, 20)
    gate_values = _series(stack, "max by (rollout, gate) (edgectl_rollout_gate_value)", "rollout", "gate")
    assert set(gate_values) == {(rollout_id, g) for g in gates}, gate_values
    lag = _series(stack, 'max(edgectl_ingest_lag_seconds{stat="max"})')
    assert 0 <= lag[()] < 5, lag
    assert _series(stack, 'max(edgectl_ingest_lag_seconds{stat="median"})')[()] <= lag[()] + 1
    assert 0 <= _series(stack, "sum(edgectl_ingest_queue_messages)")[()] < 100
    # On NATS (MQTT 3.1.1, no shared subscriptions) each replica stores every report: the panel sums each replica's work.
    reports_s = fleet / TELEMETRY_S
    rate = _series(stack, "sum(rate(edgectl_ingested_messages_total[1m]))")[()]
    assert reports_s * 0.5 <= rate <= len(stack.api_urls) * reports_s * 2, rate
    # The history keeps one point per device per 5 s of its clock, stored once whichever replicas received it.
    points = _series(stack, "sum(rate(edgectl_stored_reports_total[1m]))")[()]
    assert fleet / 5 * 0.5 <= points <= fleet / 5 * 1.5, (points, fleet)
    drops = _series(stack, "sum by (reason) (rate(edgectl_dropped_messages_total[5m]))", "reason")
    assert all(v == 0 for v in drops.values()), drops
    store = _series(stack, "histogram_quantile(0.95, sum by (le, query) (rate(edgectl_store_query_seconds_bucket[5m])))",
                    "query")
    assert ("device_counts",) in store, store
    api = _series(stack, "sum by (route, status) (rate(edgectl_api_requests_total[5m]))", "route", "status")
    assert api.get(("/metrics", "200"), 0) > 0, api
    assert exprs <= set(expected) | {
        "max by (rollout, gate) (edgectl_rollout_gate_value)", 'max(edgectl_ingest_lag_seconds{stat="max"})',
        'max(edgectl_ingest_lag_seconds{stat="median"})', "sum(edgectl_ingest_queue_messages)",
        "sum(rate(edgectl_ingested_messages_total[1m]))", "sum(rate(edgectl_stored_reports_total[1m]))",
        "sum by (reason) (rate(edgectl_dropped_messages_total[5m]))",
        "histogram_quantile(0.95, sum by (le, query) (rate(edgectl_store_query_seconds_bucket[5m])))",
        "sum by (route, status) (rate(edgectl_api_requests_total[5m]))",
        "histogram_quantile(0.95, sum by (le, route) (rate(edgectl_api_request_seconds_bucket[5m])))",
    }, "a panel of the dashboard is not checked here"
    # The operator aborts through the REST API: the canary rolls back, the fleet stays on v2.
    stack.api(f"/api/v1/rollouts/{rollout_id}/abort", method="POST", body={})
    wait_for(lambda: stack.rollout(rollout_id)["status"] in FINAL, 60, "the abort to finish", 0.5)
    assert stack.rollout(rollout_id)["status"] == "aborted"
    settle(lambda: on_version(stack, 2), 30)


def _nats_node_of(stack: Stack, pid: int) -> str:
    """The NATS node (nats-N) that the MQTT client of process ``pid`` is connected to, from the node's /connz."""
    for name in ("nats-1", "nats-2", "nats-3"):
        conf = (stack.dir / "nats" / name / "nats.conf").read_text()
        monitor = re.search(r"^http: (\S+)$", conf, re.M)
        assert monitor, conf
        with urllib.request.urlopen(f"http://{monitor.group(1)}/connz?limit=1000", timeout=5) as response:
            clients = [c.get("mqtt_client", "") for c in json.loads(response.read()).get("connections", [])]
        if any(f"-{pid}-" in c for c in clients):
            return name
    raise AssertionError(f"no NATS node has a client of pid {pid}")


def test_leader_and_a_nats_node_killed_mid_rollout(stack: Stack) -> None:
    """SIGKILL the leading replica while the canary bakes, then the NATS node the other replica is on: the rollout finishes."""
    rollout_id = deploy(stack, 4, "--waves", "1,100%", "--bake", "5s", "--gate", "silence <= 30s")
    wait_for(lambda: stack.rollout(rollout_id)["progress"][0]["ok"] == 1, 60, "the canary to install", 0.5)
    leading = [h["leader"]["leading"] for h in healths(stack)]
    assert sorted(leading) == [False, True], leading
    leader, standby = ("controller-1", "controller-2") if leading[0] else ("controller-2", "controller-1")
    survivor_url = stack.api_urls[leading.index(False)]
    os.kill(stack.pid(leader), signal.SIGKILL)
    node = _nats_node_of(stack, stack.pid(standby))
    os.kill(stack.pid(node), signal.SIGKILL)
    wait_for(lambda: stack.rollout(rollout_id, survivor_url)["status"] in FINAL, 120,
             "the rollout to end after the kills", 0.5)
    rollout = stack.rollout(rollout_id, survivor_url)
    assert rollout["status"] == "done", (rollout, stack.logs())
    assert {d["device_id"]: d["status"] for d in rollout["devices"]} == dict.fromkeys(stack.devices, "ok")
    assert stack.api("/api/v1/health", url=survivor_url)["leader"]["leading"] is True
    audit = stack.api("/api/v1/audit?limit=1000", url=survivor_url)
    entries = audit["entries"]
    assert any(e["action"] == "controller leading" and e["detail"] == f"pid {stack.pid(standby)}" for e in entries), entries
    status = json.loads(stack.edgectl("rollout", "status", rollout_id, "--json").stdout)
    assert status["status"] == "done", status
