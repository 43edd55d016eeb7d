"""/metrics from a real controller during a rollout, and the shipped Grafana dashboard queries only what it exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from edgectl.api.metrics import METRICS
from tests.api.conftest import ApiPlane
from tests.checkout import REPO
from tests.fleet import wait_for

DASHBOARD = REPO / "configs" / "grafana" / "edgectl-dashboard.json"
SCRAPE = REPO / "configs" / "prometheus" / "edgectl.yml"
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")
PROMQL_WORDS = {"sum", "by", "rate", "min", "max", "histogram_quantile", "le", "without", "avg", "on"}


def dashboard_metrics(path: Path = DASHBOARD) -> set[str]:
    """Every metric name the dashboard's PromQL expressions read."""
    exprs = [t["expr"] for panel in json.loads(path.read_text())["panels"] for t in panel.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    names = set()
    for expr in exprs:
        without_labels = re.sub(r"\{[^}]*\}", "", re.sub(r"\[[^\]]*\]", "", expr))
        without_groupings = re.sub(r"\b(by|without|on)\s*\([^)]*\)", "", without_labels)
        words = re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?![a-zA-Z0-9_:])(?!\s*\()", without_groupings)  # a call is no metric
        names |= {w for w in words if w not in PROMQL_WORDS}
    return names


def exported(text: str) -> set[str]:
    """Sample names and family names (a counter with no sample yet still declares its family)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names |= {s.name for s in family.samples}
    return names


def _missing(wanted: set[str], names: set[str]) -> list[str]:
    return sorted(n for n in wanted if n not in names and not any(n.endswith(s) and n[: -len(s)] in names for s in SUFFIXES))


def test_dashboard_queries_only_exported_metrics(api: ApiPlane) -> None:
    api.agents(2)
    wait_for(lambda: api.call("GET", "/api/v1/devices?status=online", token="viewer").body["total"] == 2, 60, "2 devices")
    variant = api.call("POST", "/api/v1/packages", raw=api.package("det", 1).read_bytes()).body["variant"]
    rollout_id = api.call("POST", "/api/v1/rollouts", {"packages": [variant], "selector": "all", "waves": "1,100%",
                                                       "bake": "10m", "gates": ["p95_latency <= 2x"]}).body["rollout_id"]
    wait_for(lambda: api.call("GET", f"/api/v1/rollouts/{rollout_id}", token="viewer").body["phase"] == "baking", 60,
             "the first wave to bake")
    answer = api.call("GET", "/metrics", token="viewer")
    assert answer.status == 200 and answer.headers["Content-Type"].startswith("text/plain")
    text = answer.body.decode()
    names = exported(text)
    wanted = dashboard_metrics()
    assert not _missing(wanted, names), f"the dashboard queries metrics /metrics does not export: {_missing(wanted, names)}"
    assert not _missing(set(METRICS), names), "documented metrics not exported"
    assert 'edgectl_devices{status="online",target="cpu-x86"} 2.0' in text
    assert 'edgectl_rollouts{status="running"} 1.0' in text
    assert re.search(rf'edgectl_rollout_wave_progress_ratio{{rollout="{rollout_id}",wave="1"}} 1\.0', text)
    gate = f'gate="p95_latency <= 2x",metric="p95_latency",rollout="{rollout_id}"'
    assert f"edgectl_rollout_gate_threshold{{{gate}}} 2.0" in text
    assert api.call("GET", "/metrics", token=None).status == 401


def test_the_parser_finds_what_a_broken_dashboard_asks_for(tmp_path: Path) -> None:
    """The check is not vacuous: a query for a metric nobody exports is caught by name."""
    broken = json.loads(DASHBOARD.read_text())
    broken["panels"][0]["targets"][0]["expr"] = 'sum by (target) (edgectl_devices_nowhere{status="online"})'
    path = tmp_path / "d.json"
    path.write_text(json.dumps(broken))
    assert "edgectl_devices_nowhere" in dashboard_metrics(path)
    assert dashboard_metrics() >= {"edgectl_devices", "edgectl_store_query_seconds_bucket", "edgectl_rollout_gate_value"}


def test_scrape_config_points_at_metrics_with_a_token() -> None:
    job = yaml.safe_load(SCRAPE.read_text())["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics" and job["authorization"]["type"] == "Bearer"
