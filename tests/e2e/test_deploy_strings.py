"""End to end with string tensors: build (golden strings without pickle), verify, deploy, KServe BYTES."""

from __future__ import annotations

import io
import json
import struct
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.brokers import BrokerProcess
from tests.fleet import AgentProcess, EdgectlHome

WORDS = ["cat", "dog", "café", "🐕", ""]


def words_model(path: Path) -> Path:
    """text (string[N]) -> label (int64: cat 1, dog 2, else 0), name (string: CAT, DOG, OTHER), echo (string)."""
    nodes = [
        helper.make_node("CategoryMapper", ["text"], ["label"], domain="ai.onnx.ml",
                         cats_strings=["cat", "dog"], cats_int64s=[1, 2], default_int64=0),
        helper.make_node("CategoryMapper", ["label"], ["name"], domain="ai.onnx.ml",
                         cats_strings=["CAT", "DOG"], cats_int64s=[1, 2], default_string="OTHER"),
        helper.make_node("Identity", ["text"], ["echo"]),
    ]
    outputs = [helper.make_tensor_value_info(n, t, ["N"])
               for n, t in (("label", TensorProto.INT64), ("name", TensorProto.STRING), ("echo", TensorProto.STRING))]
    graph = helper.make_graph(nodes, "words", [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _golden(package: Path) -> dict[str, np.ndarray]:
    with tarfile.open(package) as outer:
        payload = outer.extractfile("payload.tar")
        assert payload is not None
        with tarfile.open(fileobj=payload) as inner:
            member = inner.extractfile("golden.npz")
            assert member is not None
            with np.load(io.BytesIO(member.read()), allow_pickle=False) as data:  # no pickle needed
                return {k: data[k] for k in data.files}


def _post(agent: AgentProcess, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{agent.http_port}{path}", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _bytes_tensor(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def _split_bytes(raw: bytes) -> list[bytes]:
    items, pos = [], 0
    while pos < len(raw):
        (length,) = struct.unpack_from("<I", raw, pos)
        items.append(raw[pos + 4:pos + 4 + length])
        pos += 4 + length
    return items


def _infer_binary(agent: AgentProcess, items: list[bytes]) -> tuple[int, Any, bytes]:
    raw = _bytes_tensor(items)
    header = json.dumps({
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(items)],
                    "parameters": {"binary_data_size": len(raw)}}],
        "parameters": {"binary_data_output": True},
    }).encode()
    status, headers, body = _post(agent, "/v2/models/words/infer", header + raw, {
        "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))})
    if status != 200:
        return status, json.loads(body), b""
    split = int({k.lower(): v for k, v in headers.items()}["inference-header-content-length"])
    return status, json.loads(body[:split]), body[split:]


@pytest.mark.timeout(600)
def test_string_model_builds_deploys_and_answers_bytes(
    tmp_path: Path, mosquitto: BrokerProcess, home_for: Callable[..., EdgectlHome], agents: Callable[..., AgentProcess]
) -> None:
    home = home_for(tmp_path, mosquitto)
    agent = agents(home, "kiosk-1")
    model = words_model(tmp_path / "words.onnx")

    # v1: golden strings synthesized from the signature
    built = home.edgectl("build", str(model), "--name", "words", "--version", "1", "-o", str(tmp_path / "w1.edgepkg"),
                         "--golden-samples", "3")
    assert built.returncode == 0, built.stdout + built.stderr
    golden = _golden(tmp_path / "w1.edgepkg")
    assert golden["input:text"].dtype.kind == "U" and golden["input:text"].shape == (3,)
    assert golden["output:echo"].tolist() == golden["input:text"].tolist()
    assert golden["output:name"].dtype.kind == "U"

    # v2: real string samples, one of them stored as UTF-8 bytes (S), become U in the golden data
    samples = tmp_path / "samples"
    samples.mkdir()
    np.save(samples / "a.npy", np.array(WORDS[:3]))
    np.save(samples / "b.npy", np.array([w.encode() for w in WORDS[3:]] + [b"dog"]))
    built = home.edgectl("build", str(model), "--name", "words", "--version", "2", "-o", str(tmp_path / "w2.edgepkg"),
                         "--golden", str(samples), "--golden-samples", "2")
    assert built.returncode == 0, built.stdout + built.stderr
    golden = _golden(tmp_path / "w2.edgepkg")
    assert golden["input:text"].tolist() == [*WORDS, "dog"]
    assert golden["output:name"].tolist() == ["CAT", "DOG", "OTHER", "OTHER", "OTHER", "DOG"]
    home.edgectl("verify", str(tmp_path / "w2.edgepkg"), check=True)

    for version in (1, 2):  # v2 replaces v1: the shadow run and health check feed strings too
        result = home.edgectl("deploy", str(tmp_path / f"w{version}.edgepkg"), "-d", "kiosk-1", "--json",
                              "--timeout", "240", timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr + agent.log_text()[-3000:]
        assert agent.active_version() == version

    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(WORDS)], "data": WORDS}]}
    answer = agent.http("/v2/models/words/infer", json.dumps(body).encode())
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["echo"] == {"name": "echo", "datatype": "BYTES", "shape": [5], "data": WORDS}
    assert outputs["name"]["data"] == ["CAT", "DOG", "OTHER", "OTHER", "OTHER"]
    assert outputs["label"]["datatype"] == "INT64" and outputs["label"]["data"] == [1, 2, 0, 0, 0]

    status, header, raw = _infer_binary(agent, [w.encode() for w in WORDS])
    assert status == 200, header
    by_name = {o["name"]: o for o in header["outputs"]}
    assert [o["name"] for o in header["outputs"]] == ["label", "name", "echo"]
    sizes = [by_name[n]["parameters"]["binary_data_size"] for n in ("label", "name", "echo")]
    label, name, echo = raw[:sizes[0]], raw[sizes[0]:sizes[0] + sizes[1]], raw[sizes[0] + sizes[1]:]
    assert np.frombuffer(label, np.int64).tolist() == [1, 2, 0, 0, 0]
    assert _split_bytes(name) == [b"CAT", b"DOG", b"OTHER", b"OTHER", b"OTHER"]
    assert _split_bytes(echo) == [w.encode() for w in WORDS]

    status, error, _ = _infer_binary(agent, [b"cat", b"\xff\xfe"])  # onnxruntime reads strings as UTF-8
    assert status == 400 and "element 1 is not UTF-8" in error["error"]
