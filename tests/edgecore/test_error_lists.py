"""Error messages that list names (package members, model inputs, devices) stay one short line: the first few
names and a count of the rest, however many there are."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from edgecore.errors import LISTED, PackageError, listing
from edgecore.protocol.manifest import FileEntry, Manifest, PayloadInfo, TargetInfo
from edgecore.protocol.package import extract_payload


def test_a_short_list_is_joined_whole() -> None:
    assert listing(["a", "b", "c"]) == "a, b, c"
    assert listing([]) == ""
    assert listing(range(LISTED)) == ", ".join(str(i) for i in range(LISTED))


def test_a_long_list_shows_the_first_names_and_counts_the_rest() -> None:
    assert listing(range(LISTED + 1)) == ", ".join(str(i) for i in range(LISTED)) + ", ... and 1 more"
    assert listing((f"m{i}" for i in range(100_000)), limit=2) == "m0, m1, ... and 99,998 more"


def test_one_very_long_name_is_cut_too() -> None:
    text = listing(["x" * 10_000])
    assert len(text) == 201 and text.endswith("…")


def test_a_payload_lacking_100000_listed_members_is_refused_in_one_short_line(tmp_path: Path) -> None:
    """The 989 KB message of issue 24: a signed manifest listing 100,000 files the payload does not hold."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("model.onnx")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"m"))
    data = buffer.getvalue()
    payload = tmp_path / "payload.tar"
    payload.write_bytes(data)
    files = (FileEntry("model.onnx", 1, hashlib.sha256(b"m").hexdigest(), "model"),
             *(FileEntry(f"golden/sample-{i:06d}.npz", 1, "ab" * 32, "golden") for i in range(100_000)))
    manifest = Manifest("m", 1, 1.0, 4e9, "0.1", TargetInfo("any"),
                        PayloadInfo(len(data), hashlib.sha256(data).hexdigest(), len(data), (hashlib.sha256(data).hexdigest(),)),
                        files, "model.onnx", (), ())
    with pytest.raises(PackageError) as caught:
        extract_payload(payload, manifest, tmp_path / "dest")
    message = str(caught.value)
    assert message.startswith("payload lacks file(s) listed in the manifest: golden/sample-000000.npz, ")
    assert message.endswith(", ... and 99,990 more") and "\n" not in message and len(message) < 600
