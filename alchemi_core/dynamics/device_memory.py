"""How much memory a run may plan its batches for, on the device it runs on, and how many atoms
a batch of it holds (:class:`MemoryPlan`).

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

import attrs
import torch

from alchemi_core.errors import ConfigurationError

#: Rough device bytes per atom of a running simulation whose models declare none (positions,
#: velocities, integrator state, a neighbour list), and of the atoms outside the chunk a chunked
#: model evaluates at once.
BYTES_PER_ATOM_ESTIMATE = 8192
#: ``max_atoms`` planned on a CPU, at most (unless a structure is larger): batches beyond it
#: gain little there and make the first results wait.
CPU_DEFAULT_MAX_ATOMS = 100_000
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


@attrs.frozen
class MemoryPlan:
    """A device's free memory against what a batch's atoms need.

    Attributes:
        device: The device.
        available: Its free bytes (RAM within a cgroup limit on a CPU) when measured.
        total: Its bytes in all.
        fraction: The share of ``available`` a batch may use.
        bytes_per_atom: What the models need per atom they evaluate at once.
        chunk_atoms: The atoms a chunked model evaluates at once (None: the whole batch).
        needed_by: Who needs it, for messages (``"model '7net-0'"``).
    """

    device: torch.device
    available: int
    total: int
    fraction: float
    bytes_per_atom: float = BYTES_PER_ATOM_ESTIMATE
    chunk_atoms: int | None = None
    needed_by: str = "a simulation"

    @classmethod
    def of(cls, device: torch.device | str, fraction: float, bytes_per_atom: float = BYTES_PER_ATOM_ESTIMATE,
           chunk_atoms: int | None = None, needed_by: str = "a simulation") -> MemoryPlan:
        """The plan with ``device``'s memory measured now."""
        available, total = available_memory(device)
        return cls(torch.device(device), available, total, float(fraction), float(bytes_per_atom),
                   chunk_atoms, needed_by)

    def fitting_atoms(self) -> int:
        """The most atoms of a batch that fit: ``fraction * available / bytes_per_atom``; with
        chunks, one chunk at ``bytes_per_atom`` and the rest of the batch at the plain
        ``BYTES_PER_ATOM_ESTIMATE``.

        Raises:
            ConfigurationError: A chunk of ``chunk_atoms`` atoms alone does not fit (the message
                gives the chunk_atoms that does).

        Example:
            >>> MemoryPlan(torch.device("cpu"), 10 * 10**9, 16 * 10**9, 0.8, 7.2e6).fitting_atoms()
            1111
        """
        budget = self.available * self.fraction
        chunk = self.chunk_atoms
        if chunk is None:
            return int(budget // self.bytes_per_atom)
        per_atom = self.bytes_per_atom + BYTES_PER_ATOM_ESTIMATE
        if chunk * per_atom > budget:
            raise ConfigurationError(
                f"chunk_atoms={chunk}: a chunk of {chunk} atoms does not fit the memory of {self}; "
                f"set the model's chunk_atoms to {max(1, int(budget // per_atom))} or less"
            )
        # One chunk's activations at a time; the rest of the batch holds its plain state.
        return int((budget - chunk * self.bytes_per_atom) // BYTES_PER_ATOM_ESTIMATE)

    def max_atoms(self, largest_structure: int) -> int:
        """``max_atoms`` planned from this memory: :meth:`fitting_atoms`, on a CPU at most
        ``CPU_DEFAULT_MAX_ATOMS`` (or ``largest_structure``, if larger); at least 1."""
        fit = self.fitting_atoms()
        if self.device.type == "cpu":
            fit = min(fit, max(CPU_DEFAULT_MAX_ATOMS, largest_structure))
        return max(1, fit)

    def check_max_atoms(self, max_atoms: int, largest_batch: int) -> None:
        """Refuse a ``max_atoms`` whose largest batch (``largest_batch`` atoms) does not fit.

        Raises:
            ConfigurationError: Names ``max_atoms`` and the value that fits.
        """
        fit = self.fitting_atoms()
        if largest_batch > fit:
            raise ConfigurationError(
                f"max_atoms={max_atoms}: a batch of {largest_batch} atoms does not fit the memory of {self}; "
                f"set max_atoms ([sampler] max_atoms in a workflow file) to {max(1, fit)} or less, or leave it "
                "unset to plan it from memory"
            )

    def __str__(self) -> str:
        return (
            f"{self.device} ({format_bytes(self.available)} of {format_bytes(self.total)} free, "
            f"{self.fraction:g} of it planned for; {self.needed_by} needs about "
            f"{format_bytes(self.bytes_per_atom)} per atom)"
        )


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
