"""The agent's ``/metrics``: written by prometheus_client, and clean for ``promtool check metrics``."""

from __future__ import annotations

import http.client
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from prometheus_client.parser import text_string_to_metric_families

from agent.serving import InferenceServer, ModelRegistry
from agent.serving.metrics import metrics_renderer
from agent.serving.pool import InferencePool, ServingLimits
from agent.telemetry import device_metrics
from tests.agent.test_serving import inputs, ort_runner, scale_model


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[str]:
    """/metrics of a server that published an odd-named model and answered one request and one error."""
    registry = ModelRegistry()
    registry.publish('odd"na\\me', "1", ort_runner(scale_model(tmp_path / "s.onnx", 2.0)))
    server = InferenceServer(registry, device_metrics=lambda: device_metrics(tmp_path).to_json())
    server.start()
    try:
        client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
        client.infer('odd"na\\me', inputs(np.ones((1, 4), np.float32)))
        with pytest.raises(Exception, match="expects datatype FP32"):
            client.infer('odd"na\\me', inputs(np.ones((1, 4), np.float64), x_type="FP64"))
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
        yield response.read().decode()
    finally:
        server.stop()
        registry.close()


def test_promtool_check_metrics_is_clean(scraped: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus; ./scripts/test installs it)")
    checked = subprocess.run([promtool, "check", "metrics"], input=scraped, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and not checked.stdout.strip() and not checked.stderr.strip(), \
        checked.stdout + checked.stderr


def test_metrics_carry_the_served_figures(scraped: str) -> None:
    families = {f.name: f for f in text_string_to_metric_families(scraped)}
    model = 'odd"na\\me'

    def value(family: str, sample: str, **labels: str) -> float:
        return next(s.value for s in families[family].samples if s.name == sample and s.labels == {"model": model, **labels})

    assert value("edge_agent_inference_requests", "edge_agent_inference_requests_total") == 2
    assert value("edge_agent_inference_errors", "edge_agent_inference_errors_total") == 1
    assert value("edge_agent_inference_latency_seconds", "edge_agent_inference_latency_seconds_count") == 1
    assert value("edge_agent_inference_latency_seconds", "edge_agent_inference_latency_seconds", quantile="0.99") > 0
    info = next(s for s in families["edge_agent_model_info"].samples)
    assert info.labels == {"model": model, "version": "1", "backend": "onnxruntime/CPUExecutionProvider", "placement": "cpu"}
    for name in ("edge_agent_process_resident_bytes", "edge_agent_state_disk_free_bytes", "edge_agent_inference_pending_requests",
                 "edge_agent_inference_inflight_bytes"):
        assert families[name].documentation and families[name].samples, name


def test_device_families_appear_only_with_their_values() -> None:
    pool = InferencePool(ModelRegistry(), ServingLimits())
    try:
        device: dict[str, Any] = {"cpu_percent": 12.5, "temperature_c": {"thermal_zone0:cpu": 40.0}}
        text = metrics_renderer(pool, lambda: device)().decode()
    finally:
        pool.close()
    assert "edge_agent_cpu_percent 12.5" in text
    assert 'edge_agent_temperature_celsius{sensor="thermal_zone0:cpu"} 40.0' in text
    assert "edge_agent_memory_total_bytes" not in text and "edge_agent_model_info" in text
