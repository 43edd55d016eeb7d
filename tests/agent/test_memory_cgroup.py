"""The agent's automatic memory cap honours a memory cgroup's limit (v1 and v2), not only the machine's RAM.

An inference that allocates 5 GiB in a 3 GiB cgroup used to get the agent OOM-killed: the cap was the
address space mapped at start plus the host's memory. The cgroup file system is a seam
(``cgroup_root``/``proc_root``): v1 and v2 hierarchies are presented from plain files, and where this
machine lets the tests create a real memory cgroup, a real server process runs in one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.serving.memory import usable_bytes
from edgecore.memory_limit import CgroupMemory, cgroup_memory
from tests.agent.test_serving_limits import call, fill_model, mapped_mib
from tests.checkout import checkout_env

GiB, MiB = 2**30, 2**20
ROOT = Path(__file__).resolve().parents[2]


def _proc(tmp: Path, cgroup_lines: str, mem_total: int = 16 * GiB) -> Path:
    proc = tmp / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup_lines)
    (proc / "meminfo").write_text(f"MemTotal:       {mem_total // 1024} kB\nMemFree:        1 kB\n")
    return proc


def _files(folder: Path, **files: str | int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (folder / name.replace("__", ".")).write_text(f"{value}\n")


def test_v2_limit_of_the_process_cgroup(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "0::/system.slice/edge-agent.service\n")
    root = tmp_path / "cgroup"
    _files(root / "system.slice" / "edge-agent.service", memory__max=3 * GiB, memory__current=500 * MiB,
           memory__stat=f"anon 1\ninactive_file {100 * MiB}\nactive_file 5\n")
    _files(root / "system.slice", memory__max="max", memory__current=GiB)
    found = cgroup_memory(root, proc)
    assert found == CgroupMemory(2, 3 * GiB, 400 * MiB, root / "system.slice" / "edge-agent.service")
    assert usable_bytes(root, proc) == 3 * GiB - 400 * MiB


def test_v2_a_tighter_parent_wins(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "0::/pod/app\n")
    root = tmp_path / "cgroup"
    _files(root / "pod" / "app", memory__max="max", memory__current=0)
    _files(root / "pod", memory__max=2 * GiB, memory__current=GiB)
    assert cgroup_memory(root, proc) == CgroupMemory(2, 2 * GiB, GiB, root / "pod")
    assert usable_bytes(root, proc) == GiB


def test_v1_memory_controller_line(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "9:name=systemd:/\n4:memory:/docker/abc\n3:cpuset:/\n0::/\n")
    root = tmp_path / "cgroup"
    _files(root / "memory" / "docker" / "abc", memory__limit_in_bytes=3 * GiB, memory__usage_in_bytes=700 * MiB,
           memory__stat=f"cache 1\ntotal_inactive_file {200 * MiB}\n")
    _files(root / "memory" / "docker", memory__limit_in_bytes=9223372036854771712, memory__usage_in_bytes=GiB)
    _files(root / "memory", memory__limit_in_bytes=9223372036854771712, memory__usage_in_bytes=GiB)
    (root / "unified").mkdir()  # a hybrid host: the v2 tree carries no memory controller
    assert cgroup_memory(root, proc) == CgroupMemory(1, 3 * GiB, 500 * MiB, root / "memory" / "docker" / "abc")
    assert usable_bytes(root, proc) == 3 * GiB - 500 * MiB


def test_v1_without_a_limit_leaves_the_machine_memory(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "4:memory:/user.slice\n", mem_total=16 * GiB)
    root = tmp_path / "cgroup"
    _files(root / "memory" / "user.slice", memory__limit_in_bytes=9223372036854771712, memory__usage_in_bytes=GiB)
    assert cgroup_memory(root, proc) is None
    assert usable_bytes(root, proc) == 16 * GiB


def test_in_a_cgroup_namespace_the_mount_is_the_process_cgroup(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "0::/\n")  # a container sees itself at the root of its own hierarchy
    root = tmp_path / "cgroup"
    _files(root, memory__max=GiB, memory__current=100 * MiB)
    assert cgroup_memory(root, proc) == CgroupMemory(2, GiB, 100 * MiB, root)


def test_a_limit_above_the_machine_memory_changes_nothing(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "0::/big\n", mem_total=4 * GiB)
    root = tmp_path / "cgroup"
    _files(root / "big", memory__max=64 * GiB, memory__current=0)
    assert usable_bytes(root, proc) == 4 * GiB


def test_no_cgroup_file_system_leaves_the_machine_memory(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "0::/somewhere\n", mem_total=2 * GiB)
    assert cgroup_memory(tmp_path / "absent", proc) is None
    assert usable_bytes(tmp_path / "absent", proc) == 2 * GiB


# -- a real memory cgroup ------------------------------------------------------------------------------

_AUTO_CAP_SERVER = """
import sys
from pathlib import Path
from agent.catalog import Candidate
from agent.serving import InferenceServer, ModelRegistry
registry = ModelRegistry()
registry.publish("fill", "1", Candidate("onnxruntime", "CPUExecutionProvider").open(Path(sys.argv[1])))
server = InferenceServer(registry, memory_limit_mb=None)  # None: the automatic cap, as agent.yaml's default
server.start()
print(server.port, flush=True)
sys.stdin.read()
"""


def _own_v1_memory_cgroup() -> Path | None:
    """This process's v1 memory cgroup directory, where a child cgroup may be made (as root)."""
    mount = Path("/sys/fs/cgroup/memory")
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            own = mount / path.lstrip("/")
            return own if os.access(own, os.W_OK) else None
    return None


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A fresh v1 memory cgroup limited to 3 GiB, removed after the test."""
    parent = _own_v1_memory_cgroup()
    if parent is None:
        pytest.skip("no writable cgroup v1 memory hierarchy here (needs root and /sys/fs/cgroup/memory); "
                    "the file-based tests above cover v1 and v2 parsing")
    group = parent / f"edgectl-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(3 * GiB))
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup under {parent}: {exc.strerror}")
    yield group
    for _ in range(50):
        try:
            group.rmdir()
            return
        except OSError:
            subprocess.run(["sleep", "0.1"], check=False)


def test_an_inference_allocating_5_gib_in_a_3_gib_cgroup_fails_and_the_server_lives(tmp_path: Path,
                                                                                    memory_cgroup: Path) -> None:
    procs = memory_cgroup / "cgroup.procs"

    def join_cgroup() -> None:  # in the child, before exec: the cap is computed inside the cgroup
        procs.write_text(str(os.getpid()))

    model = fill_model(tmp_path / "fill.onnx")
    proc = subprocess.Popen([sys.executable, "-c", _AUTO_CAP_SERVER, str(model)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, cwd=ROOT, text=True, env=checkout_env(), preexec_fn=join_cgroup)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())

        def ask(dims: list[int]) -> bytes:
            return json.dumps({"inputs": [{"name": "dims", "datatype": "INT64", "shape": [2], "data": dims}],
                               "parameters": {"binary_data_output": True}}).encode()

        status, body, _ = call(port, ask([40960, 32768]), path="/v2/models/fill/infer")  # 5 GiB of float32
        assert proc.poll() is None, f"the server died (exit {proc.returncode}): the OOM killer ended it"
        assert status == 500 and "ran out of memory" in body["error"]
        statuses = [call(port, ask([4, 4]), path="/v2/models/fill/infer")[0] for _ in range(3)]
        assert statuses == [200, 200, 200] and proc.poll() is None, statuses
        # A renewed session: the refused request's arena would reserve nearly all the address space left.
        cap_mib = int(Path(f"/proc/{proc.pid}/limits").read_text().split("Max address space")[1].split()[0]) // MiB
        assert mapped_mib(proc.pid) < cap_mib - 1024, (mapped_mib(proc.pid), cap_mib)
        assert int((memory_cgroup / "memory.failcnt").read_text()) == 0  # the cgroup never hit its limit
    finally:
        proc.kill()
        proc.wait(10)
