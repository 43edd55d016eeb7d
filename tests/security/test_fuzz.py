"""Property-based fuzzing (hypothesis) of everything that parses bytes from the network or a package.

Bounded by default (a few seconds per test). For a longer run set EDGE_FUZZ_EXAMPLES, e.g.
``EDGE_FUZZ_EXAMPLES=20000 .venv/bin/pytest tests/security/test_fuzz.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgecore.delivery.download import Download
from edgecore.errors import PackageError, ProtocolError, VerificationError
from edgecore.protocol.envelope import Envelope
from edgecore.protocol.manifest import FileEntry, Manifest, PayloadInfo, TargetInfo, TensorSignature
from edgecore.protocol.messages import Command, DesiredState
from edgecore.protocol.package import extract_payload, open_package
from edgecore.protocol.reports import ChunkRequest, DeviceEvent, Presence

EXAMPLES = int(os.environ.get("EDGE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
EXPECTED = (ProtocolError, VerificationError)

scalars = st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)

FIELDS = {
    DesiredState: ["type", "device_id", "seq", "issued_at", "expires_at", "deployment_id", "model", "options"],
    Command: ["type", "device_id", "seq", "issued_at", "expires_at", "command", "args"],
    ChunkRequest: ["device_id", "artifact_id", "ranges"],
    Presence: ["device_id", "online", "ts"],
    DeviceEvent: ["device_id", "deployment_id", "state", "status", "detail", "ts", "data"],
}
PLAUSIBLE = {"type": st.sampled_from(["desired", "command", "x"]), "device_id": st.sampled_from(["dev-1", "", "../a", "a/b"]),
             "command": st.sampled_from(["report", "rollback", "reboot"]), "schema": st.sampled_from([1, 1, "1", True, 2, None])}


def _dumps(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@st.composite
def message_objects(draw: st.DrawFn, cls: type) -> bytes:
    """A JSON object with the message's own field names (some missing), each a plausible or random value."""
    keys = draw(st.lists(st.sampled_from(["schema", *FIELDS[cls]]), unique=True))
    obj = {k: draw(PLAUSIBLE.get(k, json_values) | json_values) for k in keys}
    return _dumps(obj)


def _only_expected(parse: Any, raw: bytes) -> None:
    with contextlib.suppress(*EXPECTED):
        parse(raw)


@FUZZ
@given(cls=st.sampled_from(sorted(FIELDS, key=lambda c: c.__name__)), data=st.data())
def test_message_schemas_raise_only_protocol_errors(cls: type, data: st.DataObject) -> None:
    raw = data.draw(message_objects(cls) | st.binary(max_size=200) | json_values.map(_dumps))
    _only_expected(cls.from_payload, raw)  # type: ignore[attr-defined]


envelope_like = st.fixed_dictionaries({}, optional={
    "payloadType": st.text(max_size=10) | json_values,
    "payload": st.sampled_from(["", "AAAA", "!!", "e30="]) | json_values,
    "signatures": st.lists(st.fixed_dictionaries({}, optional={"keyid": json_values,
                                                               "sig": st.sampled_from(["AAAA", "??"]) | json_values}),
                           max_size=20) | json_values,
})


@FUZZ
@given(raw=st.binary(max_size=300) | envelope_like.map(_dumps) | json_values.map(_dumps))
def test_envelope_parser_raises_only_protocol_errors(raw: bytes) -> None:
    _only_expected(Envelope.from_bytes, raw)


def _manifest_dict() -> dict[str, Any]:
    sha = "ab" * 32
    manifest = Manifest(
        name="m", version=1, created_at=1.0, expires_at=2e9, min_agent_version="0.1", target=TargetInfo("any"),
        payload=PayloadInfo(3000, sha, 1024, (sha, sha, sha)), files=(FileEntry("model.onnx", 10, sha, "model"),),
        model="model.onnx", inputs=(TensorSignature("x", "float32", (1, "n")),), outputs=(),
    )
    data: dict[str, Any] = json.loads(manifest.to_bytes())
    return data


MANIFEST_PATHS = ["name", "version", "expires_at", "model", "golden", "payload", "payload.size", "payload.chunk_size",
                  "payload.chunks", "payload.sha256", "files", "target", "target.name", "target.device_classes",
                  "inputs", "schema", "health"]


@FUZZ
@given(changes=st.lists(st.tuples(st.sampled_from(MANIFEST_PATHS),
                                  json_values | st.sampled_from(["../x", "/etc/passwd", -1, 2**64])), max_size=4),
       drop=st.lists(st.sampled_from(MANIFEST_PATHS), max_size=2))
def test_manifest_parser_raises_only_protocol_errors(changes: list[tuple[str, Any]], drop: list[str]) -> None:
    data = _manifest_dict()
    Manifest.from_bytes(_dumps(data))  # the unmutated manifest parses
    for path, value in changes:
        *parents, leaf = path.split(".")
        target = data
        for p in parents:
            target = target[p] if isinstance(target.get(p), dict) else {}
        target[leaf] = value
    for path in drop:
        data.pop(path, None)
    _only_expected(Manifest.from_bytes, _dumps(data))


# -- the package extractor ------------------------------------------------------------------------

NAMES = st.sampled_from(["model.onnx", "golden.npz", "/etc/evil", "../evil", "a/../../evil", "sub/model.onnx",
                         "x\\..\\evil", "model.onnx/../../evil", "./model.onnx", ""])
KINDS = st.sampled_from([tarfile.REGTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE,
                         tarfile.DIRTYPE, tarfile.FIFOTYPE])
members = st.lists(st.tuples(NAMES, KINDS, st.binary(max_size=64), st.sampled_from(["../evil", "/etc/passwd", "model.onnx"])),
                   min_size=1, max_size=4)


def _tar(entries: list[tuple[str, bytes, bytes, str]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data, link in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = link
            if kind == tarfile.REGTYPE:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return out.getvalue()


def _manifest_for(payload: bytes, files: dict[str, bytes], size_skew: int) -> Manifest:
    chunks = tuple(hashlib.sha256(payload[i:i + 1024]).hexdigest() for i in range(0, max(len(payload), 1), 1024))
    entries = tuple(FileEntry(n, len(d) + size_skew, hashlib.sha256(d).hexdigest(), "model") for n, d in files.items())
    return Manifest("m", 1, 1.0, 2e9, "0.1", TargetInfo("any"),
                    PayloadInfo(len(payload), hashlib.sha256(payload).hexdigest(), 1024, chunks),
                    entries, "model.onnx", (), ())


def _outside(root: Path, allowed: set[Path]) -> list[Path]:
    return [p for p in root.rglob("*") if not any(p == a or a in p.parents for a in allowed)]


@FUZZ
@given(entries=members, listed=st.dictionaries(st.sampled_from(["model.onnx", "golden.npz"]), st.binary(max_size=64), min_size=1),
       size_skew=st.sampled_from([0, 0, 1, -1]), cut=st.none() | st.integers(0, 2000))
def test_extractor_writes_only_listed_files_inside_dest(entries: list[tuple[str, bytes, bytes, str]], listed: dict[str, bytes],
                                                         size_skew: int, cut: int | None) -> None:
    payload_bytes = _tar(entries)[:cut]
    manifest = _manifest_for(payload_bytes, listed, size_skew)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "payload.tar").write_bytes(payload_bytes)
        dest = root / "box" / "dest"
        try:
            extract_payload(root / "payload.tar", manifest, dest)
        except (PackageError, VerificationError):
            pass
        else:  # success means exactly the signed files, with the signed bytes
            assert sorted(p.name for p in dest.rglob("*")) == sorted(listed)
            for name, data in listed.items():
                assert (dest / name).read_bytes() == data
        assert _outside(root, {root / "payload.tar", dest}) == [root / "box"]
        assert not [p for p in dest.rglob("*") if p.is_symlink() or not (p.is_file() or p.is_dir())]


@FUZZ
@given(entries=st.lists(st.tuples(st.sampled_from(["envelope.json", "payload.tar", "../evil", "/abs", "x"]), KINDS,
                                  st.binary(max_size=64) | envelope_like.map(_dumps),
                                  st.sampled_from(["../evil", "/etc/passwd"])),
                        max_size=4),
       cut=st.none() | st.integers(0, 3000))
def test_open_package_raises_only_package_errors(entries: list[tuple[str, bytes, bytes, str]], cut: int | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "p.edgepkg").write_bytes(_tar(entries)[:cut])
        (root / "work").mkdir()
        with contextlib.suppress(PackageError, VerificationError, ProtocolError):  # Protocol: the envelope's JSON
            open_package(root / "p.edgepkg", root / "work")
        assert {p.name for p in (root / "work").iterdir()} <= {"payload.tar"}
        assert _outside(root, {root / "p.edgepkg", root / "work"}) == []


# -- the chunk reassembler ------------------------------------------------------------------------

DAMAGE = st.sampled_from(["good", "good", "good", "flip", "short", "long", "empty"])


@FUZZ
@given(payload=st.binary(min_size=1, max_size=600), chunk_size=st.sampled_from([16, 33, 64, 1024]),
       ops=st.lists(st.tuples(st.integers(-3, 45), DAMAGE), max_size=80), finish_in_order=st.booleans())
def test_reassembler_completes_exactly_when_every_good_chunk_arrived(payload: bytes, chunk_size: int,
                                                                      ops: list[tuple[int, str]], finish_in_order: bool) -> None:
    pieces = [payload[i:i + chunk_size] for i in range(0, len(payload), chunk_size)]
    info = PayloadInfo(len(payload), hashlib.sha256(payload).hexdigest(), chunk_size,
                       tuple(hashlib.sha256(p).hexdigest() for p in pieces))
    with tempfile.TemporaryDirectory() as tmp:
        download = Download(Path(tmp), info, free_bytes=lambda _p: 10**12)
        good: set[int] = set()
        for index, damage in ops:
            data = _damaged(pieces[index] if 0 <= index < len(pieces) else b"z" * chunk_size, damage)
            is_good = 0 <= index < len(pieces) and data == pieces[index]
            assert download.accept(index, data) == (is_good and index not in good)
            good |= {index} if is_good else set()
        assert download.complete == (good == set(range(len(pieces))))
        assert (download.missing() == []) == download.complete
        # Whatever came before, the good chunks (in order or reversed) always complete it, byte for byte.
        order = range(len(pieces)) if finish_in_order else reversed(range(len(pieces)))
        for index in order:
            download.accept(index, pieces[index])
        assert download.complete
        assert download.finish().read_bytes() == payload


def _damaged(data: bytes, damage: str) -> bytes:
    if damage == "flip" and data:
        return bytes([data[0] ^ 1]) + data[1:]
    return {"short": data[:-1], "long": data + b"\0", "empty": b""}.get(damage, data)
