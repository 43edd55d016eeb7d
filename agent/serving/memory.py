"""Memory bounds for inference requests: a size forecast before running, and an address-space cap.

Two guards, because neither is enough alone:

- ``forecast_output_bytes`` binds the model's symbolic dimensions from the request's input shapes
  and sums the output sizes it can resolve; the server refuses a request whose outputs would
  exceed ``max_response_bytes`` before the model runs.
- ``limit_address_space`` sets the process's soft ``RLIMIT_AS``, so an allocation the forecast
  could not see (a data-dependent shape, a huge intermediate) fails inside the runtime, which
  raises, instead of the kernel's OOM killer ending the agent. The automatic cap is what the process
  maps now plus what it may still use: the machine's memory, or less where a memory cgroup (v1 or
  v2: a container, systemd's ``MemoryMax=``) allows less than that (``edgecore.memory_limit``). It is
  skipped where an NVIDIA driver is present: CUDA reserves far more address space than the device
  has memory.
"""

from __future__ import annotations

import logging
import math
import resource
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from edgecore.backends.base import TensorSpec
from edgecore.memory_limit import CGROUP_ROOT, PROC_ROOT, cgroup_memory, physical_memory

__all__ = ["forecast_output_bytes", "limit_address_space", "usable_bytes"]

log = logging.getLogger(__name__)

_NVIDIA_NODES = ("/dev/nvidiactl", "/dev/nvhost-ctrl", "/dev/nvmap")


def forecast_output_bytes(inputs: list[TensorSpec], outputs: list[TensorSpec], feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Bytes of each output whose shape the input shapes determine (BYTES outputs are skipped)."""
    bound: dict[str, int] = {}
    for spec in inputs:
        feed = feeds.get(spec.name)
        if feed is None:
            continue
        for want, got in zip(spec.shape, feed.shape, strict=False):
            if isinstance(want, str):
                bound.setdefault(want, int(got))
    sizes: dict[str, int] = {}
    for spec in outputs:
        if spec.dtype == "object":
            continue
        dims = [d if isinstance(d, int) and d >= 0 else bound.get(d) if isinstance(d, str) else None for d in spec.shape]
        if all(d is not None for d in dims):
            sizes[spec.name] = math.prod(int(d) for d in dims if d is not None) * np.dtype(spec.dtype).itemsize
    return sizes


def limit_address_space(limit_mb: int | None, dev_root: Path = Path("/dev"), cgroup_root: Path = CGROUP_ROOT,
                        proc_root: Path = PROC_ROOT) -> int | None:
    """Cap the soft RLIMIT_AS: ``None`` picks mapped-now + the memory still usable, 0 leaves it; the cap or None."""
    if limit_mb == 0:
        return None
    if limit_mb is None:
        if any((dev_root / Path(node).name).exists() for node in _NVIDIA_NODES):
            log.info("inference memory cap: not set (an NVIDIA driver is present; CUDA needs the address space)")
            return None
        limit = _mapped_bytes(proc_root) + usable_bytes(cgroup_root, proc_root)
    else:
        limit = limit_mb * 2**20
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    log.info("inference memory cap: address space limited to %d MiB", limit // 2**20)
    return limit


def usable_bytes(cgroup_root: Path = CGROUP_ROOT, proc_root: Path = PROC_ROOT) -> int:
    """Memory this process may still use: the machine's, or what its memory cgroup has left when that is less."""
    physical = physical_memory(proc_root) or 8 * 2**30
    cgroup = cgroup_memory(cgroup_root, proc_root)
    if cgroup is None or cgroup.available >= physical:
        return physical
    log.info("memory cgroup v%d %s: limit %d MiB, %d MiB in use", cgroup.version, cgroup.path,
             cgroup.limit // 2**20, cgroup.working_set // 2**20)
    return cgroup.available


def _mapped_bytes(proc_root: Path) -> int:
    for line in (proc_root / "self" / "status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0
