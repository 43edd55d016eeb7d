"""The package a command deploys: a signed ``.edgepkg`` checked against the keyring, or built here from ``.onnx``."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from edgecore.errors import UserError
from edgecore.protocol.envelope import TrustedKeys, load_public_key
from edgecore.protocol.manifest import TargetInfo
from edgectl.controller.planner import package_ref, variant_id
from edgectl.controller.queries import UploadedPackage
from edgectl.controller.store import Store
from edgectl.keys import Keyring
from edgectl.package import BuildOptions, Package, build_package, read_package

__all__ = ["load_package", "package_keys", "upload_package"]


def package_keys(ring: Keyring) -> TrustedKeys:
    """Every package-signing key in the keyring (current and rotated-out ones)."""
    return TrustedKeys([load_public_key(ring.public_pem("package", r["key_id"])) for r in ring.list() if r["role"] == "package"])


def load_package(path: Path, name: str | None, version: int | None, workdir: Path, chunk_size: int = 0) -> Package:
    """A verified package: given as .edgepkg, or built and signed here from an .onnx model."""
    ring = Keyring()
    if path.suffix != ".onnx":
        return read_package(path, package_keys(ring), workdir)
    if not name or version is None:
        raise UserError("deploying a .onnx model needs --name and --version (or build a package with `edgectl build`)")
    out = workdir / f"{name}-{version}.edgepkg"
    build_package(path, BuildOptions(name, version, TargetInfo("any"), chunk_size=chunk_size), ring.signing_key("package"), out)
    return read_package(out, TrustedKeys([ring.signing_key("package").public_key()]), workdir)


def upload_package(store: Store, path: Path, trusted: TrustedKeys, actor: str, max_bytes: int | None = None) -> UploadedPackage:
    """Check a signed ``.edgepkg`` against ``trusted`` as a device would, keep it for rollouts, list it; never signs."""
    with tempfile.TemporaryDirectory(prefix="edgectl-upload-") as tmp:
        package = read_package(path, trusted, Path(tmp), max_bytes)
    variant = variant_id(package)
    ref = package_ref(package, store.keep_package(variant, path))
    uploaded = UploadedPackage(ref, time.time(), actor)
    store.save_package(uploaded)
    store.audit("package uploaded", f"{ref.label} v{ref.version} for {ref.target}, variant {variant[:12]}", actor=actor)
    return uploaded
