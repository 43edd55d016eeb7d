"""The .edgepkg reader and the payload extractor, rule by rule: each refusal names what broke, and nothing is
written outside the destination or before the signed size and hashes say it may be."""

from __future__ import annotations

import functools
import hashlib
import io
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgecore.errors import PackageError, VerificationError
from edgecore.protocol.envelope import MAX_ENVELOPE_BYTES, Envelope
from edgecore.protocol.manifest import FileEntry, Manifest, PayloadInfo, TargetInfo
from edgecore.protocol.package import check_payload, extract_payload, open_package, sha256_file

ENVELOPE = Envelope("t", b"{}", ()).to_bytes()


def _tar(path: Path, members: list[tuple[str, bytes]], kinds: dict[str, bytes] | None = None,
         sizes: dict[str, int] | None = None) -> Path:
    """A tar of ``members`` (name, bytes); ``kinds`` gives a member another type, ``sizes`` another header size."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            kind = (kinds or {}).get(name)
            if kind is not None:
                info.type, info.size, info.linkname = kind, 0, "/etc/passwd"
                tar.addfile(info)
            else:
                tar.addfile(info, io.BytesIO(data))
    raw = bytearray(out.getvalue())
    for name, size in (sizes or {}).items():  # rewrite the header's size field and its checksum
        at = raw.index(name.encode())
        raw[at + 124:at + 136] = f"{size:011o}\0".encode()
        raw[at + 148:at + 156] = b" " * 8
        raw[at + 148:at + 156] = f"{sum(raw[at:at + 512]):06o}\0 ".encode()
    path.write_bytes(bytes(raw))
    return path


@pytest.fixture
def work(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


def test_a_package_gives_its_envelope_and_a_copy_of_its_payload(tmp_path: Path, work: Path) -> None:
    package = _tar(tmp_path / "p.edgepkg", [("envelope.json", ENVELOPE), ("payload.tar", b"x" * 5000)])
    seen: list[Envelope] = []

    def check(envelope: Envelope) -> int:
        seen.append(envelope)
        return 5000

    envelope, payload = open_package(package, work, check)
    assert envelope == Envelope.from_bytes(ENVELOPE) and seen == [envelope]
    assert payload == work / "payload.tar" and payload.read_bytes() == b"x" * 5000
    assert sha256_file(payload) == hashlib.sha256(b"x" * 5000).hexdigest()


PACKAGES = [  # members, member kinds, header sizes, the refusal
    ([("envelope.json", ENVELOPE)], {}, {}, "expected exactly envelope.json and payload.tar, found ['envelope.json']"),
    ([("envelope.json", ENVELOPE), ("payload.tar", b"x"), ("extra", b"")], {}, {}, "expected exactly"),
    ([("payload.tar", b"x"), ("envelope.json", ENVELOPE), ("payload.tar", b"y")], {}, {}, "expected exactly"),
    ([("envelope.json", ENVELOPE), ("payload.tar", b"")], {"payload.tar": tarfile.SYMTYPE}, {},
     "member payload.tar is not a regular file"),
    ([("envelope.json", ENVELOPE), ("payload.tar", b"")], {"envelope.json": tarfile.DIRTYPE}, {},
     "member envelope.json is not a regular file"),
    ([("envelope.json", ENVELOPE), ("payload.tar", b"x" * 100)], {}, {"payload.tar": 10**9},
     "not a readable .edgepkg (unexpected end of data)"),  # a header that claims more than the archive holds
]


@pytest.mark.parametrize(("members", "kinds", "sizes", "refusal"), PACKAGES, ids=[p[3][:40] for p in PACKAGES])
def test_a_malformed_package_is_refused_before_anything_is_written(tmp_path: Path, work: Path, members: list[tuple[str, bytes]],
                                                                   kinds: dict[str, bytes], sizes: dict[str, int],
                                                                   refusal: str) -> None:
    package = _tar(tmp_path / "p.edgepkg", members, kinds, sizes)
    with pytest.raises(PackageError) as caught:
        open_package(package, work)
    assert refusal in str(caught.value) and str(package) in str(caught.value)
    assert list(work.iterdir()) == []


def test_a_sparse_member_is_refused(tmp_path: Path, work: Path) -> None:
    package = _tar(tmp_path / "p.edgepkg", [("envelope.json", ENVELOPE), ("payload.tar", b"")],
                   {"payload.tar": tarfile.GNUTYPE_SPARSE})
    with tarfile.open(package) as tar:
        assert tar.getmember("payload.tar").issparse()
    with pytest.raises(PackageError, match=r"member payload\.tar is sparse"):
        open_package(package, work)


def test_the_envelope_may_be_as_large_as_the_envelope_limit_and_no_larger(tmp_path: Path, work: Path) -> None:
    at_limit = ENVELOPE[:-1] + b" " * (MAX_ENVELOPE_BYTES - len(ENVELOPE)) + b"}"
    package = _tar(tmp_path / "p.edgepkg", [("envelope.json", at_limit), ("payload.tar", b"x")])
    assert open_package(package, work)[0].payload == b"{}"
    package = _tar(tmp_path / "p.edgepkg", [("envelope.json", at_limit + b" "), ("payload.tar", b"x")])
    with pytest.raises(PackageError, match=f"envelope.json is larger than {MAX_ENVELOPE_BYTES} bytes"):
        open_package(package, tmp_path)


def test_a_payload_of_another_size_than_the_signed_one_is_refused_unwritten(tmp_path: Path, work: Path) -> None:
    package = _tar(tmp_path / "p.edgepkg", [("envelope.json", ENVELOPE), ("payload.tar", b"x" * 10)])
    for signed in (9, 11):
        with pytest.raises(PackageError, match=r"payload\.tar is 10 bytes, the signed manifest says otherwise"):
            open_package(package, work, functools.partial(_signed_size, signed))
    assert list(work.iterdir()) == []


def _signed_size(size: int, _envelope: Envelope) -> int:
    return size


def test_unreadable_packages_are_package_errors(tmp_path: Path, work: Path) -> None:
    (tmp_path / "junk.edgepkg").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(PackageError, match=r"not a readable \.edgepkg"):
        open_package(tmp_path / "junk.edgepkg", work)
    with pytest.raises(PackageError, match="cannot read"):
        open_package(tmp_path / "missing.edgepkg", work)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs: the kernel's free space, not a seam. Skips where mounting is not allowed."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_payload_larger_than_the_free_space_is_refused_unwritten(tmp_path: Path, small_disk: Path) -> None:
    package = _tar(tmp_path / "p.edgepkg", [("envelope.json", ENVELOPE), ("payload.tar", b"x" * (2 << 20))])
    with pytest.raises(PackageError, match="do not fit in the free space"):
        open_package(package, small_disk)
    assert list(small_disk.iterdir()) == []


# -- the payload, checked and extracted ------------------------------------------------------------------------


def _payload(folder: Path, members: list[tuple[str, bytes]], listed: dict[str, bytes] | None = None,
             kinds: dict[str, bytes] | None = None, sizes: dict[str, int] | None = None) -> tuple[Path, Manifest]:
    """A payload tar and a manifest that signs exactly its bytes, listing ``listed`` (default: the members).

    With ``sizes`` the tar ends right after the first member's data: its header claims more than follows."""
    payload = _tar(folder / "payload.tar", members, kinds, sizes)
    if sizes:
        payload.write_bytes(payload.read_bytes()[:512 + len(members[0][1])])
    data = payload.read_bytes()
    files = tuple(FileEntry(n, len(d), hashlib.sha256(d).hexdigest(), "model") for n, d in (listed or dict(members)).items())
    chunks = tuple(hashlib.sha256(data[i:i + 1024]).hexdigest() for i in range(0, len(data), 1024))
    return payload, Manifest("m", 1, 1.0, 4e9, "0.1", TargetInfo("any"),
                             PayloadInfo(len(data), hashlib.sha256(data).hexdigest(), 1024, chunks), files, files[0].path, (), ())


def test_a_payload_extracts_exactly_its_signed_files(tmp_path: Path) -> None:
    payload, manifest = _payload(tmp_path, [("model.onnx", b"m" * 3000), ("sub/golden.npz", b"g"), ("sub/more.npz", b"h"),
                                            ("deep/er/x.npz", b"x")])
    extract_payload(payload, manifest, tmp_path / "new" / "dest")
    assert (tmp_path / "new" / "dest" / "model.onnx").read_bytes() == b"m" * 3000
    assert (tmp_path / "new" / "dest" / "sub" / "golden.npz").read_bytes() == b"g"
    (tmp_path / "slot").mkdir()  # a slot the device prepared: it exists, empty
    extract_payload(payload, manifest, tmp_path / "slot")
    assert sorted(str(p.relative_to(tmp_path / "slot")) for p in (tmp_path / "slot").rglob("*.*")) == [
        "deep/er/x.npz", "model.onnx", "sub/golden.npz", "sub/more.npz"]


def test_a_payload_must_match_its_signed_size_and_hash(tmp_path: Path) -> None:
    payload, manifest = _payload(tmp_path, [("model.onnx", b"m")])
    check_payload(payload, manifest)
    with open(payload, "ab") as f:
        f.write(b"\0")
    with pytest.raises(VerificationError, match="payload does not match the signed size and sha256"):
        extract_payload(payload, manifest, tmp_path / "dest")
    payload.write_bytes(payload.read_bytes()[:-2] + b"\1")  # the signed size, another hash
    with pytest.raises(VerificationError, match="host: payload does not match"):
        check_payload(payload, manifest, "host: payload")
    assert not (tmp_path / "dest").exists() or list((tmp_path / "dest").iterdir()) == []


PAYLOADS = [  # members, listed, kinds, sizes, error class, the refusal
    ([("/abs", b"a")], None, {}, {}, PackageError, "payload member '/abs': unsafe path"),
    ([("../up", b"a")], None, {}, {}, PackageError, "payload member '../up': unsafe path"),
    ([("a/../../up", b"a")], None, {}, {}, PackageError, "unsafe path"),
    ([("a\\b", b"a")], None, {}, {}, PackageError, "unsafe path"),
    ([("link", b"")], {"link": b""}, {"link": tarfile.SYMTYPE}, {}, PackageError,
     "payload member 'link': links, devices, directories and sparse files are not allowed"),
    ([("hard", b"")], {"hard": b""}, {"hard": tarfile.LNKTYPE}, {}, PackageError, "links, devices"),
    ([("dir", b"")], {"dir": b""}, {"dir": tarfile.DIRTYPE}, {}, PackageError, "links, devices"),
    ([("model.onnx", b"m"), ("extra", b"e")], {"model.onnx": b"m"}, {}, {}, PackageError,
     "payload member 'extra' is not listed in the manifest"),
    ([("model.onnx", b"m"), ("model.onnx", b"m")], {"model.onnx": b"m"}, {}, {}, PackageError,
     "payload member 'model.onnx' appears twice"),
    ([("model.onnx", b"mm")], {"model.onnx": b"m"}, {}, {}, PackageError,
     "payload member 'model.onnx': 2 bytes, manifest says 1"),
    ([("model.onnx", b"m")], {"model.onnx": b"x"}, {}, {}, VerificationError, "file model.onnx does not match its signed sha256"),
    ([("model.onnx", b"m")], {"model.onnx": b"m", "golden.npz": b"g"}, {}, {}, PackageError,
     "payload lacks file(s) listed in the manifest: golden.npz"),
    ([("model.onnx", b"m" * 700)], {"model.onnx": b"m" * 2000}, {}, {"model.onnx": 2000}, PackageError,
     "payload is not a readable tar (unexpected end of data)"),  # the data ends before the header's size
]


@pytest.mark.parametrize(("members", "listed", "kinds", "sizes", "error", "refusal"), PAYLOADS,
                         ids=[f"{i}-{p[5][:30]}" for i, p in enumerate(PAYLOADS)])
def test_a_payload_breaking_one_rule_is_refused_naming_the_member(tmp_path: Path, members: list[tuple[str, bytes]],
                                                                   listed: dict[str, bytes] | None, kinds: dict[str, bytes],
                                                                   sizes: dict[str, int], error: type[Exception],
                                                                   refusal: str) -> None:
    payload, manifest = _payload(tmp_path, members, listed, kinds, sizes)
    dest = tmp_path / "box" / "dest"
    with pytest.raises(error) as caught:
        extract_payload(payload, manifest, dest)
    assert refusal in str(caught.value)
    written = [p for p in (tmp_path / "box").rglob("*") if p.is_file()]
    assert all(dest in p.parents and p.name in (listed or dict(members)) for p in written), written  # the caller clears dest
    if error is VerificationError:
        assert written == []  # a file that fails its hash is removed at once; the rest is the caller's to clear


def test_a_payload_that_is_not_a_tar_is_a_package_error(tmp_path: Path) -> None:
    payload = tmp_path / "payload.tar"
    payload.write_bytes(b"\x1f\x8b not a tar" * 200)
    data = payload.read_bytes()
    manifest = Manifest("m", 1, 1.0, 4e9, "0.1", TargetInfo("any"),
                        PayloadInfo(len(data), hashlib.sha256(data).hexdigest(), 1024, ("ab" * 32,) * 3),
                        (FileEntry("model.onnx", 1, "ab" * 32, "model"),), "model.onnx", (), ())
    with pytest.raises(PackageError, match="payload is not a readable tar"):
        extract_payload(payload, manifest, tmp_path / "dest")
