"""How much memory a run may plan its batches for, on the device it runs on.

On a GPU that is its free memory (``torch.cuda.mem_get_info``). On a CPU it is the RAM the
kernel reports available (``MemAvailable`` in ``/proc/meminfo``; ``os.sysconf`` elsewhere),
and no more than a cgroup memory limit leaves (a container's or a job's limit: beyond it the
kernel's OOM killer ends the process without a message, so a plan must respect it).

Example:
    >>> from alchemi_core.dynamics.device_memory import available_memory
    >>> free, total = available_memory("cpu")
    >>> 0 < free <= total
    True
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

#: cgroup v1 reports "no limit" as a number near 2**63.
_NO_LIMIT = 1 << 60


def available_memory(device: torch.device | str) -> tuple[int, int]:
    """``(available, total)`` bytes of ``device``'s memory: free GPU memory, or on a CPU the
    available RAM capped by any cgroup memory limit of this process."""
    device = torch.device(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    available, total = _ram()
    for limit, used in _cgroup_limits():
        total = min(total, limit)
        available = min(available, max(0, limit - used))
    return available, total


def _ram() -> tuple[int, int]:
    """Available and total RAM in bytes."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        total = int(fields["MemTotal"].split()[0]) * 1024
        available = int(fields["MemAvailable"].split()[0]) * 1024
        return available, total
    except (OSError, KeyError, ValueError):  # not Linux, or an old kernel: the page counts
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def _cgroup_limits(self_cgroup: Path = Path("/proc/self/cgroup"),
                   root: Path = Path("/sys/fs/cgroup")) -> list[tuple[int, int]]:
    """``(limit, in use)`` bytes of every cgroup of this process, and its ancestors, that sets a
    memory limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``; ``root``: where the cgroup
    file systems are mounted). In use leaves out the page cache the kernel would reclaim
    first (inactive files), as ``MemAvailable`` does."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            base, names = root, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base, names = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                                    "total_inactive_file")
        else:
            continue
        here = Path(path.lstrip("/"))
        for folder in (base / p for p in (here, *here.parents)):
            limit = _read_int(folder / names[0])
            if limit is None or limit >= _NO_LIMIT:
                continue
            used = _read_int(folder / names[1]) or 0
            out.append((limit, max(0, used - _stat(folder, names[2]))))
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # v2 writes "max" for no limit


def _stat(folder: Path, key: str) -> int:
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def format_bytes(n: float) -> str:
    """``n`` bytes for a message: ``"7.2 MB"``, ``"16.0 GB"``.

    Example:
        >>> format_bytes(7.2e6), format_bytes(16e9), format_bytes(8192)
        ('7.2 MB', '16.0 GB', '8.2 kB')
    """
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
