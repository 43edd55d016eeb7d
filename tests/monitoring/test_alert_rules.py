"""The shipped alert rules: promtool checks them, their unit tests pass and fail on a wrong expression, every
metric and label value they read is one the controller exports, and the stack's Prometheus config loads them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from edgecore.protocol.reports import Telemetry
from edgectl.api.app import api_context
from edgectl.api.metrics import render
from edgectl.config import EdgectlConfig
from edgectl.controller.health import ControllerHealth, HealthCollector
from edgectl.controller.store import SqliteStore
from tests.brokers import free_port
from tests.checkout import REPO
from tests.fleet import wait_for

sys.path.insert(0, str(REPO / "scripts"))
from stack_fleet import SHIPPED_SCRAPE, prometheus_config

RULES = REPO / "configs" / "prometheus" / "alerts.yml"
UNIT_TESTS = REPO / "configs" / "prometheus" / "alerts_test.yml"
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def _alerts(path: Path = RULES) -> dict[str, str]:
    """Alert name -> its expression."""
    groups = yaml.safe_load(path.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian package prometheus; ./scripts/test installs it)")
    return found


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def test_promtool_checks_the_rules(promtool: str) -> None:
    done = _run(promtool, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in done.stdout


def test_the_unit_tests_pass(promtool: str) -> None:
    done = _run(promtool, "test", "rules", str(UNIT_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() -> None:
    cases = [case for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    for alert in _alerts():
        mine = [case for case in cases if case["alertname"] == alert]
        assert any(case["exp_alerts"] for case in mine), f"no unit test fires {alert}"
        assert any(not case["exp_alerts"] for case in mine), f"no unit test keeps {alert} quiet"


# A wrong expression (a label value, a threshold, a comparison, an aggregation) fails the unit tests.
MUTANTS = [
    ("EdgectlDevicesOffline", 'edgectl_devices{status="offline"}', 'edgectl_devices{status="unknown"}'),
    ("EdgectlDevicesOffline", ") > 0.1", ") > 0.25"),
    ("EdgectlRolloutHalted", 'status="rolling-back"', 'status="aborting"'),
    ("EdgectlIngestLagHigh", 'stat="median"', 'stat="max"'),
    ("EdgectlControllerStoreDown", "edgectl_controller_store_up == 0", "edgectl_controller_store_up == 1"),
    ("EdgectlNoEngineLeader", "max by (job)", "min by (job)"),
    ("EdgectlRolloutHaltsWithoutData", "< 300", "> 300"),
    ("EdgectlDevicesClockOff", "> 0", ">= 0"),
]


def test_a_wrong_expression_fails_its_unit_tests(promtool: str, tmp_path: Path) -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text())
    runs = []
    for n, (alert, old, new) in enumerate(MUTANTS):
        rules = yaml.safe_load(RULES.read_text())
        rule = next(r for group in rules["groups"] for r in group["rules"] if r.get("alert") == alert)
        assert old in rule["expr"], (alert, old)
        rule["expr"] = rule["expr"].replace(old, new)
        (tmp_path / f"rules{n}.yml").write_text(yaml.safe_dump(rules))
        own = [{**t, "alert_rule_test": [c for c in t["alert_rule_test"] if c["alertname"] == alert]}
               for t in tests["tests"]]
        unit = {**tests, "rule_files": [f"rules{n}.yml"], "tests": [t for t in own if t["alert_rule_test"]]}
        (tmp_path / f"test{n}.yml").write_text(yaml.safe_dump(unit))
        runs.append(subprocess.Popen([promtool, "test", "rules", str(tmp_path / f"test{n}.yml")],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for (alert, old, new), run in zip(MUTANTS, runs, strict=True):
        output, _ = run.communicate(timeout=60)
        assert run.returncode != 0 and alert in output, f"{alert} with {old!r} -> {new!r} passed its unit tests"


def _exported(tmp_path: Path) -> str:
    """/metrics of a controller over a store with an online, an offline and an unknown device and a fresh report."""
    store = SqliteStore(tmp_path / "controller.db")
    now = time.time()
    store.upsert_device("cam-1", online=1, telemetry=Telemetry("cam-1", now - 1.5), telemetry_ts=now, telemetry_at=now)
    store.upsert_device("cam-2", online=0)
    store.upsert_device("cam-3")
    ctx = api_context(store, EdgectlConfig())
    ctx.registry.register(HealthCollector(ControllerHealth()))  # as api_context does inside `controller run`
    try:
        return render(ctx.registry).decode()
    finally:
        store.close()


def unexported(rules: dict[str, str], text: str) -> list[str]:
    """Metric names and ``name{label="value"}`` matchers in ``rules`` that the /metrics ``text`` never shows."""
    samples: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        samples.setdefault(family.name, [])
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample.labels)
    missing = []
    for alert, expr in rules.items():
        for name in set(re.findall(r"\bedgectl_[a-z0-9_]+", expr)):
            base = next((name[: -len(s)] for s in SUFFIXES if name.endswith(s) and name[: -len(s)] in samples), name)
            if base not in samples:
                missing.append(f"{alert}: {name}")
        for name, matchers in re.findall(r"\b(edgectl_[a-z0-9_]+)\{([^}]*)\}", expr):
            for label, value in re.findall(r'(\w+)="([^"]*)"', matchers):
                if not any(labels.get(label) == value for labels in samples.get(name, [])):
                    missing.append(f'{alert}: {name}{{{label}="{value}"}}')
    return sorted(set(missing))


def test_the_rules_read_only_metrics_and_label_values_the_controller_exports(tmp_path: Path) -> None:
    rules = _alerts()
    read = {name for expr in rules.values() for name in re.findall(r"\bedgectl_[a-z0-9_]+", expr)}
    assert read >= {"edgectl_devices", "edgectl_rollouts", "edgectl_ingest_lag_seconds", "edgectl_controller_store_up"}
    assert not unexported(rules, _exported(tmp_path))


def test_a_renamed_metric_or_label_value_is_caught(tmp_path: Path) -> None:
    text = _exported(tmp_path)
    renamed = {"A": 'edgectl_devices_nowhere{status="offline"}', "B": 'max(edgectl_rollouts{status="halted"}) > 0',
               "C": "edgectl_controller_store_down == 1"}
    assert unexported(renamed, text) == ["A: edgectl_devices_nowhere", 'A: edgectl_devices_nowhere{status="offline"}',
                                         'B: edgectl_rollouts{status="halted"}', "C: edgectl_controller_store_down"]


def _stack_config(tmp_path: Path) -> Path:
    """The Prometheus config ./scripts/stack writes (scripts/stack_fleet.py), in a folder of its own."""
    token = tmp_path / "edgectl.token"
    token.write_text("token\n")
    config = tmp_path / "prometheus" / "prometheus.yml"
    config.parent.mkdir()
    config.write_text(yaml.safe_dump(prometheus_config(5, token, ["127.0.0.1:8470"])))
    return config


def test_the_stack_prometheus_config_loads_the_rules(promtool: str, tmp_path: Path) -> None:
    shipped: dict[str, Any] = yaml.safe_load(SHIPPED_SCRAPE.read_text())
    assert shipped["rule_files"] == ["alerts.yml"] and (SHIPPED_SCRAPE.parent / "alerts.yml") == RULES
    job = shipped["scrape_configs"][0]["job_name"]  # Prometheus' own `up` of each replica carries it
    assert f'up{{job="{job}"}}' in _alerts()["EdgectlControllerDown"]
    done = _run(promtool, "check", "config", str(_stack_config(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in done.stdout


def test_prometheus_on_the_stack_config_evaluates_every_rule(tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (Debian package prometheus; ./scripts/test installs it)")
    port = free_port()
    with subprocess.Popen([binary, f"--config.file={_stack_config(tmp_path)}", f"--storage.tsdb.path={tmp_path / 'data'}",
                           f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL) as prometheus:
        try:
            wait_for(lambda: _rule_groups(port) is not None, 30, "Prometheus' rules API")
            loaded = _rule_groups(port) or {}
        finally:
            prometheus.terminate()
            prometheus.wait(timeout=30)
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert loaded == {g["name"]: sorted(r["alert"] for r in g["rules"]) for g in groups}


def _rule_groups(port: int) -> dict[str, list[str]] | None:
    """Group name -> alert names, as a running Prometheus has loaded them; None until it answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules?type=alert", timeout=2) as answer:
            data = json.loads(answer.read())["data"]["groups"]
    except OSError:
        return None
    return {g["name"]: sorted(r["name"] for r in g["rules"]) for g in data}
