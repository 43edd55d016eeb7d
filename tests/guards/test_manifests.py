"""The signed manifest's reader, rule by rule: each case breaks exactly one rule of a valid manifest (so no
other check can refuse it in its place), and every limit is read at its edge: accepted there, refused one past."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from edgecore.errors import ProtocolError, VerificationError
from edgecore.protocol.manifest import FileEntry, Manifest, PayloadInfo, TargetInfo, TensorSignature
from edgecore.protocol.pipeline import PipelineSpec, PipelineStep

SHA = "ab" * 32
GIB, MIB = 1024**3, 1024**2
MAX_FILES, MAX_PAYLOAD_BYTES = 256, 8 * GIB  # the limits docs/packages.md states, written out: a test of the module's own
                                              # constant would move with it


def valid() -> dict[str, Any]:
    manifest = Manifest("m", 1, 1.0, 2e9, "0.1", TargetInfo("jetson-orin", ("CUDAExecutionProvider",), ("jetson",)),
                        PayloadInfo(3000, SHA, 1024, (SHA,) * 3),
                        (FileEntry("model.onnx", 10, SHA, "model"), FileEntry("golden.npz", 5, SHA, "golden")),
                        "model.onnx", (TensorSignature("x", "float32", (1, "n", None)),),
                        (TensorSignature("y", "float32", (1,)),), golden="golden.npz")
    data: dict[str, Any] = json.loads(manifest.to_bytes())
    return data


def read(data: dict[str, Any]) -> Manifest:
    return Manifest.from_bytes(json.dumps(data).encode())


def _payload(size: int, chunk_size: int) -> Callable[[dict[str, Any]], None]:
    """A payload of ``size`` bytes in chunks of ``chunk_size``, with the right number of chunk hashes."""
    return lambda m: m["payload"].update(size=size, chunk_size=chunk_size, chunks=[SHA] * -(-size // chunk_size))


def _files(count: int) -> Callable[[dict[str, Any]], None]:
    return lambda m: m.update(files=m["files"] + [{**m["files"][0], "path": f"f{i}"} for i in range(count - 2)])


def _unsafe(path: str) -> Callable[[dict[str, Any]], None]:
    """The golden file's path, and the reference to it, both ``path``: only the path rule is broken."""
    def change(m: dict[str, Any]) -> None:
        m["files"][1].update(path=path)
        m.update(golden=path)
    return change


BROKEN = [  # (the rule, a change that breaks it and nothing else)
    ("one chunk hash per chunk", lambda m: m["payload"].update(chunks=m["payload"]["chunks"][:-1])),
    ("one chunk hash per chunk", lambda m: m["payload"].update(chunks=[*m["payload"]["chunks"], SHA])),
    ("chunk hashes are lowercase hex", lambda m: m["payload"]["chunks"].__setitem__(0, SHA.upper())),
    ("chunk hashes are 64 digits", lambda m: m["payload"]["chunks"].__setitem__(0, SHA[:-1])),
    ("chunk hashes are strings", lambda m: m["payload"]["chunks"].__setitem__(0, 7)),
    ("the payload hash is hex", lambda m: m["payload"].update(sha256="g" * 64)),
    ("chunks of at least 1 KiB", _payload(3000, 1023)),
    ("chunks of at most 64 MiB", _payload(3000, 64 * MIB + 1)),
    ("a payload of at least a byte", lambda m: m["payload"].update(size=0, chunks=[])),
    ("a payload of at most 8 GiB", _payload(MAX_PAYLOAD_BYTES + 1, 64 * MIB)),
    ("a file of at most 8 GiB", lambda m: m["files"][0].update(size=MAX_PAYLOAD_BYTES + 1)),
    ("a file of no negative size", lambda m: m["files"][0].update(size=-1)),
    ("no absolute path", _unsafe("/golden.npz")),
    ("no parent directory", _unsafe("../golden.npz")),
    ("no parent directory inside", _unsafe("a/../../golden.npz")),
    ("no backslash", _unsafe("a\\golden.npz")),
    ("no empty part", _unsafe("a//golden.npz")),
    ("no current directory", _unsafe("./golden.npz")),
    ("no empty path", _unsafe("")),
    ("the model path is safe too", lambda m: (m["files"][0].update(path="../model.onnx"), m.update(model="../model.onnx"))),
    ("the model is a listed file", lambda m: m.update(model="other.onnx")),
    ("the golden file is a listed file", lambda m: m.update(golden="other.npz")),
    ("file hashes are hex", lambda m: m["files"][0].update(sha256="x")),
    ("versions start at 1", lambda m: m.update(version=0)),
    ("at most 256 files", _files(MAX_FILES + 1)),
    ("shapes are integers, names or null", lambda m: m["inputs"][0].update(shape=[1.5])),
    ("shapes are integers, names or null", lambda m: m["inputs"][0].update(shape=[[1]])),
    ("the schema is 1", lambda m: m.update(schema=2)),
]


@pytest.mark.parametrize(("rule", "change"), BROKEN, ids=[f"{i}-{b[0]}" for i, b in enumerate(BROKEN)])
def test_a_manifest_that_breaks_one_rule_is_a_protocol_error(rule: str, change: Callable[[dict[str, Any]], None]) -> None:
    data = valid()
    assert read(data).golden == "golden.npz"
    change(data)
    with pytest.raises(ProtocolError):
        read(data)


LIMITS = [  # (what, how to put n of it in the manifest, the limit)
    ("name", lambda m, n: m.update(name="n" * n), 128),
    ("min_agent_version", lambda m, n: m.update(min_agent_version="1" * n), 32),
    ("target.name", lambda m, n: m["target"].update(name="t" * n), 64),
    ("target.execution_providers", lambda m, n: m["target"].update(execution_providers=["P"] * n), 32),
    ("target.device_classes", lambda m, n: m["target"].update(device_classes=["c"] * n), 64),
    ("files", lambda m, n: _files(n)(m), MAX_FILES),
    ("files[].path", lambda m, n: _unsafe("g" * n)(m), 256),
    ("files[].role", lambda m, n: m["files"][0].update(role="r" * n), 32),
    ("inputs", lambda m, n: m.update(inputs=m["inputs"] * n), 256),
    ("outputs", lambda m, n: m.update(outputs=m["outputs"] * n), 256),
    ("inputs[].name", lambda m, n: m["inputs"][0].update(name="x" * n), 256),
    ("outputs[].dtype", lambda m, n: m["outputs"][0].update(dtype="d" * n), 32),
    ("inputs[].shape", lambda m, n: m["inputs"][0].update(shape=[1] * n), 16),
]


@pytest.mark.parametrize(("what", "put", "limit"), LIMITS, ids=[w for w, _, _ in LIMITS])
def test_each_limit_holds_at_its_edge(what: str, put: Callable[[dict[str, Any], int], None], limit: int) -> None:
    at, past = valid(), valid()
    put(at, limit)
    put(past, limit + 1)
    read(at)
    with pytest.raises(ProtocolError):
        read(past)


@pytest.mark.parametrize(("size", "chunk_size"), [(MAX_PAYLOAD_BYTES, 64 * MIB), (1, 1024), (3000, 64 * MIB), (8 * GIB, MIB)])
def test_payload_sizes_and_chunk_sizes_at_their_limits_read(size: int, chunk_size: int) -> None:
    data = valid()
    _payload(size, chunk_size)(data)
    data["files"][0]["size"] = MAX_PAYLOAD_BYTES
    manifest = read(data)
    assert (manifest.payload.size, manifest.payload.chunk_size) == (size, chunk_size)


def test_a_manifest_of_up_to_4_mib_is_read_and_no_larger() -> None:
    text = json.dumps(valid())
    at_limit = text[:-1] + " " * (4 * MIB - len(text)) + "}"
    assert Manifest.from_bytes(at_limit.encode()).name == "m"
    with pytest.raises(ProtocolError, match="exceeds the 4194304 byte limit"):
        Manifest.from_bytes((at_limit + " ").encode())


def test_an_empty_file_is_listed_like_any_other() -> None:
    data = valid()
    data["files"][1]["size"] = 0
    assert read(data).file("golden.npz").size == 0


def test_health_and_reports_are_read_when_present_and_empty_when_absent() -> None:
    data = valid()
    assert (read(data).health, read(data).reports) == ({}, {})
    data.update(health={"runs": 3}, reports={"quantize": {"drop": 0.1}})
    assert (read(data).health, read(data).reports) == ({"runs": 3}, {"quantize": {"drop": 0.1}})
    data.pop("health")
    data.pop("reports")
    assert (read(data).health, read(data).reports) == ({}, {})


def test_the_signed_form_is_canonical_and_reads_back_equal() -> None:
    data = valid()
    manifest = read(data)
    assert manifest.to_bytes() == json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    assert read(json.loads(manifest.to_bytes())) == manifest


def test_a_package_for_any_target_runs_anywhere_else_only_where_listed() -> None:
    assert TargetInfo("any").accepts("cpu-x86") and TargetInfo("any").accepts(None)
    orin = TargetInfo("jetson-orin", (), ("jetson",))
    assert orin.accepts("jetson-orin") and orin.accepts("jetson")
    assert not orin.accepts("jetson-nano") and not orin.accepts(None) and not orin.accepts("any")


def test_a_file_is_found_by_its_path() -> None:
    manifest = read(valid())
    assert manifest.file("golden.npz").role == "golden" and manifest.file("model.onnx").size == 10
    with pytest.raises(ProtocolError, match="manifest: no file 'other'"):
        manifest.file("other")


def test_an_expired_manifest_is_refused_at_its_expiry_and_after() -> None:
    manifest = read(valid())  # expires at 2e9
    manifest.check_fresh(now=2e9)
    with pytest.raises(VerificationError, match="manifest of m v1 expired at"):
        manifest.check_fresh(now=2e9 + 0.5)
    stale = Manifest.from_bytes(json.dumps({**valid(), "expires_at": time.time() - 5}).encode())
    with pytest.raises(VerificationError, match="expired"):
        stale.check_fresh()
    Manifest.from_bytes(json.dumps({**valid(), "expires_at": time.time() + 60}).encode()).check_fresh()


def _pipeline(inputs: tuple[str, ...], outputs: tuple[str, ...]) -> bytes:
    step = PipelineStep("detect", "det", None, (("x", "image"),), (("y", "scores"),))
    manifest = Manifest("p", 1, 1.0, 2e9, "0.1", TargetInfo("any"), PayloadInfo(10, SHA, 1024, (SHA,)),
                        (FileEntry("crop.onnx", 10, SHA, "graph"),), "",
                        tuple(TensorSignature(n, "float32", (1,)) for n in inputs),
                        tuple(TensorSignature(n, "float32", (1,)) for n in outputs), kind="pipeline",
                        pipeline=PipelineSpec((step,)))
    return manifest.to_bytes()


@pytest.mark.parametrize(("inputs", "outputs"), [((), ("scores",)), (("image",), ()), ((), ())])
def test_a_pipeline_without_its_inputs_or_outputs_is_refused_for_that(inputs: tuple[str, ...], outputs: tuple[str, ...]) -> None:
    assert Manifest.from_bytes(_pipeline(("image",), ("scores",))).is_pipeline
    with pytest.raises(ProtocolError, match="manifest: a pipeline needs its inputs and outputs"):
        Manifest.from_bytes(_pipeline(inputs, outputs))
