"""STAGE with string tensors: golden strings (``U`` arrays, no pickle) are run and compared exactly.

As in ``test_stage_golden``, a package is built as ``edgectl build`` builds it; for the refusal its
golden string output is changed and the manifest re-signed, so only staging's comparison can catch it.
"""

from __future__ import annotations

import dataclasses
import tarfile
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.deploy.stage import stage_in_child
from edgecore.protocol.chunks import chunk_digests
from edgecore.protocol.envelope import MANIFEST_TYPE, TrustedKeys, sign
from edgecore.protocol.manifest import PayloadInfo
from edgecore.protocol.package import ENVELOPE_MEMBER, PAYLOAD_MEMBER, extract_payload, sha256_file
from edgectl.package import GOLDEN_FILE, BuildOptions, Package, build_package, read_package
from tests.e2e.test_deploy_strings import words_model

KEY = Ed25519PrivateKey.generate()
TRUSTED = TrustedKeys([KEY.public_key()])


def _resigned(package: Package, tmp: Path, golden: dict[str, np.ndarray]) -> Package:
    """``package`` with ``golden`` as its golden data, hashed and signed again with the package key."""
    files = tmp / "files"
    extract_payload(package.payload, package.manifest, files)
    np.savez(files / GOLDEN_FILE, allow_pickle=True, **golden)  # numpy's default, named so **golden cannot match it
    entries = tuple(dataclasses.replace(e, size=(files / e.path).stat().st_size, sha256=sha256_file(files / e.path))
                    for e in package.manifest.files)
    payload = tmp / PAYLOAD_MEMBER
    with tarfile.open(payload, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            tar.add(files / entry.path, arcname=entry.path)
    whole, chunks = chunk_digests(payload, package.manifest.payload.chunk_size)
    info = PayloadInfo(payload.stat().st_size, whole, package.manifest.payload.chunk_size, tuple(chunks))
    manifest = dataclasses.replace(package.manifest, files=entries, payload=info)
    (tmp / ENVELOPE_MEMBER).write_bytes(sign(MANIFEST_TYPE, manifest.to_bytes(), KEY).to_bytes())
    crafted = tmp / "crafted.edgepkg"
    with tarfile.open(crafted, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(tmp / ENVELOPE_MEMBER, arcname=ENVELOPE_MEMBER)
        tar.add(payload, arcname=PAYLOAD_MEMBER)
    (tmp / "open-crafted").mkdir()
    return read_package(crafted, TRUSTED, tmp / "open-crafted")


def _built(tmp: Path) -> Package:
    built = tmp / "words.edgepkg"
    build_package(words_model(tmp / "words.onnx"), BuildOptions("words", 1, golden_samples=4), KEY, built)
    (tmp / "open-built").mkdir()
    return read_package(built, TRUSTED, tmp / "open-built")


def _stage(package: Package, slot: Path) -> tuple[bool, str]:
    extract_payload(package.payload, package.manifest, slot)
    (slot / "manifest.json").write_bytes(package.manifest.to_bytes())
    result = stage_in_child(slot, timeout_s=60, memory_mb=2048)
    return result.ok, result.detail


def _golden(package: Package, tmp: Path) -> dict[str, np.ndarray]:
    extract_payload(package.payload, package.manifest, tmp / "golden-files")
    with np.load(tmp / "golden-files" / GOLDEN_FILE, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def test_string_golden_data_is_kept_without_pickle_and_stages(tmp_path: Path) -> None:
    package = _built(tmp_path)
    golden = _golden(package, tmp_path)
    assert {k: v.dtype.kind for k, v in golden.items()} == {
        "input:text": "U", "output:label": "i", "output:name": "U", "output:echo": "U"}
    ok, detail = _stage(package, tmp_path / "slot")
    assert ok and "3 golden output(s) match" in detail, detail


def test_a_wrong_golden_string_output_is_refused_at_stage(tmp_path: Path) -> None:
    package = _built(tmp_path)
    golden = _golden(package, tmp_path)
    golden["output:echo"] = np.array([text + "!" if i == 0 else text for i, text in enumerate(golden["output:echo"])])
    crafted = _resigned(package, tmp_path, golden)
    ok, detail = _stage(crafted, tmp_path / "slot")
    assert not ok and detail == "golden outputs differ: output 'echo' differs on 25.0% of its strings", detail
