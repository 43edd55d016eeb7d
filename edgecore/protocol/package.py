"""The .edgepkg format and its safe extraction.

An ``.edgepkg`` is an uncompressed tar holding exactly two members: ``envelope.json`` (the DSSE
envelope of the manifest) and ``payload.tar`` (the files). Only ``payload.tar`` travels in chunks;
the envelope rides in the desired-state message, so a device checks the signature before it
downloads a byte, and checks every chunk, the whole payload and every file against the signed
hashes before anything is parsed.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from edgecore.errors import PackageError, VerificationError, listing
from edgecore.protocol.envelope import MAX_ENVELOPE_BYTES, Envelope
from edgecore.protocol.manifest import FileEntry, Manifest

__all__ = ["ENVELOPE_MEMBER", "PAYLOAD_MEMBER", "check_payload", "extract_payload", "open_package", "sha256_file"]

ENVELOPE_MEMBER = "envelope.json"
PAYLOAD_MEMBER = "payload.tar"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def open_package(path: Path, workdir: Path, check: Callable[[Envelope], int] | None = None) -> tuple[Envelope, Path]:
    """Read a .edgepkg: return its envelope and the path of its payload copied into ``workdir``.

    ``check`` verifies the envelope before a byte of payload is written and returns the payload
    size its signed manifest states: a payload member of any other size is refused. Sparse members
    (a 10 KB file that would expand to gigabytes) are refused before anything is written, and so is
    a payload larger than the free space; a member whose header claims more bytes than the archive
    holds is refused by the tar reader itself while it lists the members (``unexpected end of data``).
    A name given twice is refused too: which copy a reader takes would depend on the reader."""
    try:
        with tarfile.open(path, "r:") as tar:
            listed = tar.getmembers()
            members = {m.name: m for m in listed}
            if sorted(m.name for m in listed) != [ENVELOPE_MEMBER, PAYLOAD_MEMBER]:
                found = sorted(m.name for m in listed)
                raise PackageError(f"{path}: expected exactly {ENVELOPE_MEMBER} and {PAYLOAD_MEMBER}, found {found}")
            for m in members.values():
                if not m.isfile() or m.issparse():
                    raise PackageError(f"{path}: member {m.name} is {'sparse' if m.issparse() else 'not a regular file'}")
            if members[ENVELOPE_MEMBER].size > MAX_ENVELOPE_BYTES:  # refused before it is read
                raise PackageError(f"{path}: {ENVELOPE_MEMBER} is larger than {MAX_ENVELOPE_BYTES} bytes")
            envelope = Envelope.from_bytes(_read(tar, members[ENVELOPE_MEMBER]))
            size = members[PAYLOAD_MEMBER].size
            if check is not None and check(envelope) != size:
                raise PackageError(f"{path}: {PAYLOAD_MEMBER} is {size} bytes, the signed manifest says otherwise")
            if shutil.disk_usage(workdir).free < size:
                raise PackageError(f"{path}: {size} bytes of payload do not fit in the free space of {workdir}")
            payload = workdir / PAYLOAD_MEMBER
            with _member(tar, members[PAYLOAD_MEMBER]) as src, payload.open("wb") as dst:
                shutil.copyfileobj(src, dst)
    except (tarfile.TarError, EOFError) as exc:
        raise PackageError(f"{path}: not a readable .edgepkg ({exc})") from exc
    except OSError as exc:
        raise PackageError(f"{path}: cannot read ({exc.strerror})") from exc
    return envelope, payload


def _member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    f = tar.extractfile(member)
    if f is None:
        raise PackageError(f"member {member.name} has no data")
    return f


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    with _member(tar, member) as f:
        return f.read()


def check_payload(payload: Path, manifest: Manifest, what: str = "payload") -> None:
    """Refuse a payload file whose size or sha256 is not the one its signed manifest states."""
    if payload.stat().st_size != manifest.payload.size or sha256_file(payload) != manifest.payload.sha256:
        raise VerificationError(f"{what} does not match the signed size and sha256")


def extract_payload(payload: Path, manifest: Manifest, dest: Path) -> None:
    """Check the payload against the manifest and extract exactly the listed files into ``dest``.

    Rejects absolute paths, ``..``, links, devices and any member whose path or size the signed
    manifest does not list; each file's sha256 is checked while it is written."""
    check_payload(payload, manifest)
    expected = {f.path: f for f in manifest.files}
    seen: set[str] = set()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(payload, "r:") as tar:
            for member in tar:
                _check_member(member, expected, seen)
                _write_checked(tar, member, dest, expected[member.name].sha256)
                seen.add(member.name)
    except tarfile.TarError as exc:
        raise PackageError(f"payload is not a readable tar ({exc})") from exc
    missing = sorted(set(expected) - seen)
    if missing:
        raise PackageError(f"payload lacks file(s) listed in the manifest: {listing(missing)}")


def _check_member(member: tarfile.TarInfo, expected: Mapping[str, FileEntry], seen: set[str]) -> None:
    name = member.name
    if name.startswith("/") or ".." in name.split("/") or "\\" in name:
        raise PackageError(f"payload member {name!r}: unsafe path")
    if not member.isfile() or member.issparse():
        raise PackageError(f"payload member {name!r}: links, devices, directories and sparse files are not allowed")
    entry = expected.get(name)
    if entry is None:
        raise PackageError(f"payload member {name!r} is not listed in the manifest")
    if name in seen:
        raise PackageError(f"payload member {name!r} appears twice")
    if member.size != entry.size:
        raise PackageError(f"payload member {name!r}: {member.size} bytes, manifest says {entry.size}")


def _write_checked(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path, sha256: str) -> None:
    target = dest / member.name
    target.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    # The tar reader stops at the member's end and raises ReadError when the data ends before it.
    with _member(tar, member) as src, target.open("wb") as dst:
        while block := src.read(1 << 20):
            h.update(block)
            dst.write(block)
    if h.hexdigest() != sha256:
        target.unlink()
        raise VerificationError(f"file {member.name} does not match its signed sha256")
