"""How much memory this process may really use: the cgroup's limit (v1 or v2), not only the machine's RAM.

A container, a systemd unit with ``MemoryMax=`` or a Kubernetes pod puts the process in a memory
cgroup; allocating past its limit wakes the kernel's OOM killer, which ends the process without an
exception to catch. Both sides read the limit here: the agent caps its address space below it
(``agent.serving.memory``), and ``edgectl build`` says that a model was killed for memory.

The cgroup file system is an explicit seam (``cgroup_root``, ``proc_root``), so tests present v1 and
v2 hierarchies from plain files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["CgroupMemory", "cgroup_memory", "is_out_of_memory", "physical_memory"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_ROOT = Path("/proc")
_UNLIMITED = 2**62  # v1 writes "no limit" as LONG_MAX rounded down to a page, v2 as "max"


@dataclass(frozen=True)
class CgroupMemory:
    """The tightest memory limit on the process's cgroup and its ancestors, and what the cgroup holds now."""

    version: int  # 1 or 2
    limit: int  # bytes
    working_set: int  # bytes in use now, reclaimable page cache (inactive files) left out
    path: Path  # the directory whose limit is the tightest

    @property
    def available(self) -> int:
        return max(0, self.limit - self.working_set)


def cgroup_memory(cgroup_root: Path = CGROUP_ROOT, proc_root: Path = PROC_ROOT) -> CgroupMemory | None:
    """The memory cgroup limit of this process, or None where there is none (or no cgroup file system)."""
    try:
        lines = (proc_root / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            found = _tightest(2, [cgroup_root, cgroup_root / "unified"], path)
        elif "memory" in controllers.split(","):
            found = _tightest(1, [cgroup_root / "memory"], path)
        else:
            continue
        if found is not None:
            return found
    return None


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether an exception from a runtime means an allocation failed."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return any(word in text for word in ("bad_alloc", "bad allocation", "failed to allocate", "out of memory", "cannot allocate"))


def physical_memory(proc_root: Path = PROC_ROOT) -> int | None:
    """MemTotal of /proc/meminfo in bytes (None where it cannot be read)."""
    try:
        for line in (proc_root / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


_FILES = {1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
          2: ("memory.max", "memory.current", "inactive_file")}


def _tightest(version: int, mounts: list[Path], path: str) -> CgroupMemory | None:
    limit_file, usage_file, inactive_key = _FILES[version]
    for mount in mounts:
        own = mount / path.lstrip("/")
        # In a cgroup namespace (a container) the mount is the process's own cgroup and the path says "/".
        start = own if (own / limit_file).exists() else mount if (mount / limit_file).exists() else None
        if start is None:
            continue
        best: tuple[int, Path] | None = None
        for folder in (start, *start.parents):
            if folder != mount and mount not in folder.parents:
                break
            limit = _number(folder / limit_file)
            if limit is not None and limit < _UNLIMITED and (best is None or limit < best[0]):
                best = (limit, folder)
        if best is None:
            return None
        usage = _number(best[1] / usage_file) or 0
        inactive = _stat(best[1] / "memory.stat", inactive_key)
        return CgroupMemory(version, best[0], max(0, usage - inactive), best[1])
    return None


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return 0
    return 0
