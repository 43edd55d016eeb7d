"""`edgectl build` under a memory limit of the machine's own says which limit a model ran into.

Under a hard address-space limit below 8 GiB (``ulimit -v``) every model, good ones included, failed
with "the model failed on its golden inputs" (the child could not raise its limit to --memory-mb);
a model the kernel's OOM killer ends inside a memory cgroup said the same.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from edgectl.examples import tiny_classifier
from tests.agent.test_memory_cgroup import _own_v1_memory_cgroup
from tests.fleet import EdgectlHome
from tests.packages.hostile import huge_allocation_model

GiB = 2**30


def _build(home: EdgectlHome, model: Path, out: Path, preexec: Callable[[], object],
           *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgectl.cli.main", "build", str(model), "--name", "m", "--version", "1",
                           "-o", str(out), *extra], env=home.env(), text=True, capture_output=True, timeout=180,
                          preexec_fn=preexec, cwd=home.path)


def _hard_address_space(limit: int) -> Callable[[], None]:
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_a_good_model_builds_under_a_hard_limit_below_the_default(tmp_path: Path, offline_home: EdgectlHome) -> None:
    out = tmp_path / "m.edgepkg"
    result = _build(offline_home, tiny_classifier(tmp_path / "m.onnx"), out, _hard_address_space(6 * GiB))
    assert result.returncode == 0, result.stderr
    assert out.exists()


def test_a_model_past_a_hard_limit_names_that_limit(tmp_path: Path, offline_home: EdgectlHome) -> None:
    out = tmp_path / "h.edgepkg"
    result = _build(offline_home, huge_allocation_model(tmp_path / "h.onnx", gib=8), out, _hard_address_space(4 * GiB))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 5 and len(lines) == 1, result.stderr
    assert "the 4096 MiB memory limit (this process's hard address-space limit, ulimit -v, is below --memory-mb 8192)" \
        in lines[0], lines
    assert "golden inputs" not in lines[0] and not out.exists()


def test_a_model_the_oom_killer_ends_in_a_memory_cgroup_says_so(tmp_path: Path, offline_home: EdgectlHome) -> None:
    parent = _own_v1_memory_cgroup()
    if parent is None:
        pytest.skip("no writable cgroup v1 memory hierarchy here (needs root and /sys/fs/cgroup/memory)")
    group = parent / f"edgectl-build-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(GiB))
        procs = group / "cgroup.procs"
        # 3 GiB of real floats, under --memory-mb 8192 but past the cgroup's 1 GiB: the kernel kills the child.
        result = _build(offline_home, huge_allocation_model(tmp_path / "h.onnx", gib=3), tmp_path / "h.edgepkg",
                        lambda: procs.write_text(str(os.getpid())))
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 5 and len(lines) == 1, result.stderr
        assert "killed (SIGKILL)" in lines[0] and "out-of-memory killer" in lines[0] and "allows 1024 MiB" in lines[0], lines
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                subprocess.run(["sleep", "0.1"], check=False)
