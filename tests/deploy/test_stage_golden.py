"""STAGE refuses a correctly signed package whose golden outputs are wrong (issue 13.10: the guard has a test).

The package is built as ``edgectl build`` builds it, then its golden outputs are changed and the
manifest re-signed with the package key, so that every signature and hash check passes and only
staging's golden comparison can catch it. The device's own path runs: signature check, payload
extraction against the signed manifest, then ``stage_in_child``, the function the STAGE state calls.
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
from edgectl.examples import tiny_classifier
from edgectl.package import GOLDEN_FILE, BuildOptions, Package, build_package, read_package

KEY = Ed25519PrivateKey.generate()
TRUSTED = TrustedKeys([KEY.public_key()])


def _open(path: Path, workdir: Path) -> Package:
    workdir.mkdir()
    return read_package(path, TRUSTED, workdir)


def _tar(path: Path, files: dict[str, Path]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, src in files.items():
            tar.add(src, arcname=name)
    return path


def signed_package(tmp: Path, wrong_outputs: bool) -> Package:
    """A signed package of a tiny classifier; with ``wrong_outputs``, its golden outputs are shifted and re-signed."""
    built = tmp / "built.edgepkg"
    build_package(tiny_classifier(tmp / "model.onnx"), BuildOptions("classifier", 1), KEY, built)
    package = _open(built, tmp / "open-built")
    if not wrong_outputs:
        return package
    files = tmp / "files"
    extract_payload(package.payload, package.manifest, files)
    with np.load(files / GOLDEN_FILE) as golden:
        arrays = {k: golden[k] + 0.5 if k.startswith("output:") else golden[k] for k in golden.files}
    np.savez(files / GOLDEN_FILE, **arrays)
    entries = tuple(dataclasses.replace(e, size=(files / e.path).stat().st_size, sha256=sha256_file(files / e.path))
                    for e in package.manifest.files)
    payload = _tar(tmp / PAYLOAD_MEMBER, {e.path: files / e.path for e in entries})
    whole, chunks = chunk_digests(payload, package.manifest.payload.chunk_size)
    info = PayloadInfo(payload.stat().st_size, whole, package.manifest.payload.chunk_size, tuple(chunks))
    manifest = dataclasses.replace(package.manifest, files=entries, payload=info)
    (tmp / ENVELOPE_MEMBER).write_bytes(sign(MANIFEST_TYPE, manifest.to_bytes(), KEY).to_bytes())
    crafted = _tar(tmp / "wrong.edgepkg", {ENVELOPE_MEMBER: tmp / ENVELOPE_MEMBER, PAYLOAD_MEMBER: payload})
    return _open(crafted, tmp / "open-wrong")  # every signature and hash check passes


def stage(package: Package, slot: Path) -> tuple[bool, str]:
    """What VERIFY then STAGE do with the package on a device."""
    extract_payload(package.payload, package.manifest, slot)
    (slot / "manifest.json").write_bytes(package.manifest.to_bytes())
    result = stage_in_child(slot, timeout_s=60, memory_mb=2048)
    return result.ok, result.detail


def test_a_signed_package_with_wrong_golden_outputs_is_refused_at_stage(tmp_path: Path) -> None:
    ok, detail = stage(signed_package(tmp_path, wrong_outputs=True), tmp_path / "slot")
    assert not ok and detail.startswith("golden outputs differ: output "), detail


def test_the_same_package_with_its_true_golden_outputs_stages(tmp_path: Path) -> None:
    ok, detail = stage(signed_package(tmp_path, wrong_outputs=False), tmp_path / "slot")
    assert ok and "golden output(s) match" in detail, detail
