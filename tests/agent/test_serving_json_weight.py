"""The in-flight budget weighs a JSON body at 9x its size (itself, and JSON_WEIGHT = 8x for what decoding makes),
and the docs say the factor the server applies (they said 8x while the server counted 9x)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.serving import ModelRegistry
from agent.serving.pool import JSON_WEIGHT
from tests.agent.test_serving import ort_runner, scale_model
from tests.agent.test_serving_limits import call, infer_body, start

ROOT = Path(__file__).resolve().parents[2]
IN_ALL = JSON_WEIGHT + 1


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[ModelRegistry]:
    reg = ModelRegistry()
    reg.publish("scale", "1", ort_runner(scale_model(tmp_path / "s.onnx", 2.0)))
    yield reg
    reg.close()


@pytest.mark.parametrize(("limit_over_body", "status"), [(IN_ALL, 200), (IN_ALL - 0.01, 413)])
def test_a_json_body_weighs_nine_times_its_size(registry: ModelRegistry, limit_over_body: float, status: int) -> None:
    body = infer_body(50)
    server = start(registry, max_inflight_bytes=int(len(body) * limit_over_body))
    try:
        got, answer, _ = call(server.port, body)
        assert got == status, answer
        if status == 413:
            assert f"would hold {IN_ALL * len(body)} bytes" in answer["error"] and f"{IN_ALL}x in all" in answer["error"]
    finally:
        server.stop()


def test_only_the_json_header_of_a_binary_request_is_weighted(registry: ModelRegistry) -> None:
    header = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"parameters":{"binary_data_size":16}}]}'
    body = header + bytes(16)
    server = start(registry, max_inflight_bytes=IN_ALL * len(header) + 15)  # one byte short of header x9 + data
    try:
        got, answer, _ = call(server.port, body, headers={"Inference-Header-Content-Length": str(len(header))})
        assert got == 413 and f"would hold {IN_ALL * len(header) + 16} bytes" in answer["error"]
    finally:
        server.stop()


@pytest.mark.parametrize("page", ["docs/reliability.md", "docs/runtime.md", "docs/benchmarks.md"])
def test_the_docs_state_the_factor_the_server_applies(page: str) -> None:
    text = (ROOT / page).read_text()
    stated = {int(m) for m in re.findall(r"(?:JSON body counts|JSON counts|weighing) (\d+)x", text)}
    assert stated == {IN_ALL}, f"{page} says JSON counts {sorted(stated)}x; the server counts {IN_ALL}x"
