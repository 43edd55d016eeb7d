"""Host side limits: `build` runs models in a limited child, `verify` checks the signature before it writes a byte.

Hostile inputs: a model that allocates ~20 GiB on its first run, one that never returns, a 3 KB
package whose sparse member would expand to 8 GiB, an unsigned envelope and a payload larger than
the signed manifest says.
"""

from __future__ import annotations

import os
import tarfile
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.errors import PackageError, VerificationError
from edgecore.protocol.envelope import TrustedKeys
from edgecore.protocol.package import open_package
from edgectl.examples import tiny_classifier
from edgectl.keys import Keyring
from edgectl.package import read_package
from tests.fleet import EdgectlHome
from tests.packages.hostile import endless_model, huge_allocation_model
from tests.security.crafted import sparse_tar

SPARSE_BYTES = int(os.environ.get("EDGE_TEST_SPARSE_BYTES", 8 * 2**30))  # smaller when breaking guards on purpose


def _one_line(result: object) -> list[str]:
    return str(getattr(result, "stderr", "")).strip().splitlines()


def test_a_model_allocating_20_gib_fails_the_build_with_exit_5(tmp_path: Path, offline_home: EdgectlHome) -> None:
    out = tmp_path / "h.edgepkg"
    result = offline_home.edgectl("build", str(huge_allocation_model(tmp_path / "huge.onnx")), "--name", "h",
                                  "--version", "1", "-o", str(out), "--memory-mb", "2048")
    lines = _one_line(result)
    assert result.returncode == 5 and len(lines) == 1, result.stderr
    assert "2048 MiB memory limit" in lines[0] and "--memory-mb" in lines[0], lines
    assert not out.exists()


def test_a_model_that_never_returns_fails_the_build_with_exit_5(tmp_path: Path, offline_home: EdgectlHome) -> None:
    out = tmp_path / "e.edgepkg"
    started = time.monotonic()
    result = offline_home.edgectl("build", str(endless_model(tmp_path / "endless.onnx")), "--name", "e",
                                  "--version", "1", "-o", str(out), "--timeout", "3", timeout=60)
    lines = _one_line(result)
    assert result.returncode == 5 and len(lines) == 1 and "within 3s (--timeout)" in lines[0], result.stderr
    assert time.monotonic() - started < 30
    assert not out.exists()


def _tree_bytes(root: Path) -> int:
    """Bytes really allocated under ``root`` (sparse files count by their blocks, not their length)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def test_verify_refuses_a_sparse_package_before_writing_anything(tmp_path: Path, offline_home: EdgectlHome) -> None:
    """A genuine signed envelope beside a sparse payload of 8 GiB: refused, and $TMPDIR stays empty."""
    envelope = _members(_package(offline_home, tmp_path))["envelope.json"]
    bomb = sparse_tar(tmp_path / "bomb.edgepkg", {"envelope.json": envelope}, "payload.tar", SPARSE_BYTES)
    assert bomb.stat().st_size < 10_000
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**offline_home.env(), "TMPDIR": str(scratch)}
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "edgectl.cli.main", "verify", str(bomb)], env=env,
                            capture_output=True, text=True, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode in (2, 3) and len(lines) == 1, result.stderr
    assert _tree_bytes(scratch) < 1_000_000


def _package(home: EdgectlHome, tmp_path: Path) -> Path:
    out = tmp_path / "m-1.edgepkg"
    home.edgectl("build", str(tiny_classifier(tmp_path / "m.onnx", size=8)), "--name", "m", "--version", "1",
                 "-o", str(out), check=True)
    return out


def _members(package: Path) -> dict[str, bytes]:
    with tarfile.open(package) as tar:
        members = {m.name: tar.extractfile(m) for m in tar.getmembers()}
        assert all(f is not None for f in members.values()), "a package holds regular files only"
        return {name: f.read() for name, f in members.items() if f is not None}


def _repack(path: Path, members: dict[str, bytes]) -> Path:
    import io

    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _trusted(home: EdgectlHome) -> TrustedKeys:
    return TrustedKeys([Keyring(root=home.path / "keys").signing_key("package").public_key()])


def test_the_signature_is_checked_before_the_payload_is_written(tmp_path: Path, offline_home: EdgectlHome) -> None:
    package = _package(offline_home, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    stranger = TrustedKeys([Ed25519PrivateKey.generate().public_key()])
    with pytest.raises(VerificationError):
        read_package(package, stranger, work)
    assert list(work.iterdir()) == []
    read_package(package, _trusted(offline_home), work)  # the same package with the right key opens
    assert (work / "payload.tar").is_file()


def test_a_payload_larger_than_signed_is_refused_before_it_is_written(tmp_path: Path, offline_home: EdgectlHome) -> None:
    members = _members(_package(offline_home, tmp_path))
    members["payload.tar"] += b"\0" * 1024 * 1024
    padded = _repack(tmp_path / "padded.edgepkg", members)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(PackageError, match="signed manifest"):
        read_package(padded, _trusted(offline_home), work)
    assert list(work.iterdir()) == []
    result = offline_home.edgectl("verify", str(padded))
    assert result.returncode == 2 and len(_one_line(result)) == 1, result.stderr


def test_verify_caps_the_payload_it_accepts(tmp_path: Path, offline_home: EdgectlHome) -> None:
    package = _package(offline_home, tmp_path)
    result = offline_home.edgectl("verify", str(package), "--max-bytes", "1000")
    lines = _one_line(result)
    assert result.returncode == 2 and len(lines) == 1 and "over the limit of 1000" in lines[0], result.stderr
    assert offline_home.edgectl("verify", str(package)).returncode == 0


def test_a_sparse_payload_of_exactly_the_signed_size_is_refused_as_sparse(tmp_path: Path, offline_home: EdgectlHome) -> None:
    """Only the sparse check can stop this one before writing: its size is the signed one and fits the archive."""
    package = _package(offline_home, tmp_path)
    members = _members(package)
    signed = len(members["payload.tar"])
    envelope = members["envelope.json"] + b" " * signed  # JSON may end in blanks: the archive outgrows the payload
    forged = sparse_tar(tmp_path / "forged.edgepkg", {"envelope.json": envelope}, "payload.tar", signed)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(PackageError, match=r"payload\.tar is sparse"):
        open_package(forged, work, lambda _envelope: signed)
    assert list(work.iterdir()) == []
