"""The one atomic writer: permissions before the first byte, nothing left behind on a full disk."""

from __future__ import annotations

import errno
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgecore.durable import atomic_write, atomic_write_json, read_json, remove_stale_temps
from tests.deploy.conftest import fill, mount_small_disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = mount_small_disk(tmp_path / "small-disk")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_replaces_and_keeps_the_asked_mode(tmp_path: Path) -> None:
    key = tmp_path / "keys" / "ca.key"
    atomic_write(key, b"old", mode=0o600)
    atomic_write(key, b"new", mode=0o600)
    assert key.read_bytes() == b"new" and stat.S_IMODE(key.stat().st_mode) == 0o600
    atomic_write_json(tmp_path / "state.json", {"b": 1})
    assert stat.S_IMODE((tmp_path / "state.json").stat().st_mode) == 0o644 and read_json(tmp_path / "state.json") == {"b": 1}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_full_disk_raises_enospc_and_leaves_the_old_file_and_no_temp(small_disk: Path) -> None:
    target = small_disk / "ledger.json"
    atomic_write(target, b"old")
    fill(small_disk)
    with pytest.raises(OSError) as caught:
        atomic_write(target, b"x" * 65536)
    assert caught.value.errno == errno.ENOSPC
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "ledger.json"]


def test_stale_temps_of_killed_writers_are_removed(tmp_path: Path) -> None:
    (tmp_path / ".deployment.json.abc123.tmp").write_bytes(b"torn")
    (tmp_path / ".ledger.json.tmp").write_bytes(b"torn")  # the fixed name older agents used
    (tmp_path / "deployment.json").write_bytes(b"{}")
    assert remove_stale_temps(tmp_path) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["deployment.json"]


def test_a_sweep_beside_a_writer_of_this_process_never_takes_its_temp_file(tmp_path: Path) -> None:
    """The agent sweeps its state directory after each job while its dispatch thread may be saving the job queue:
    the sweep took that write's temp file and the save failed with ENOENT ('cannot save the job queue')."""
    failures: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            for n in range(300):
                atomic_write_json(tmp_path / "jobs.json", {"n": n, "pad": "x" * 4096})
        except BaseException as exc:
            failures.append(exc)
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    while not done.is_set():
        remove_stale_temps(tmp_path)
    writer.join()
    assert failures == [] and read_json(tmp_path / "jobs.json") == {"n": 299, "pad": "x" * 4096}
    assert [p.name for p in tmp_path.iterdir()] == ["jobs.json"]
