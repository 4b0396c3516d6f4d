"""Export an alchemi store to extended XYZ through ASE, in blocks, so a large store streams.

Each structure becomes one frame: numbers, positions, cell, pbc, masses and velocities, with
energy, forces and stress as calculator results (what ``ase.io.read`` gives back as
``atoms.get_potential_energy()`` and friends). Other atom fields become per-atom arrays and other
system fields ``atoms.info`` entries (``system_id``, ``status``, ...), under their own names
(ASE reads a per-atom ``charges`` column back as the calculator's charges). Extended XYZ keeps
positions and forces to 8 decimals; the store itself keeps every bit.

Example:
    >>> import ase.io, tempfile, os
    >>> from alchemi_core.testing import random_structures
    >>> from alchemi_zarr import AtomicDataZarrReader, AtomicDataZarrWriter
    >>> AtomicDataZarrWriter("memory://extxyz-doc").write(random_structures([3, 2]))
    2
    >>> path = os.path.join(tempfile.mkdtemp(), "out.extxyz")
    >>> export_extxyz(AtomicDataZarrReader("memory://extxyz-doc"), path)
    2
    >>> [len(a) for a in ase.io.read(path, index=":")]
    [3, 2]
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.data import AtomicData
from alchemi_core.data.fields import Level
from alchemi_core.errors import InvalidDataError

if TYPE_CHECKING:
    import ase

# Fields AtomicData.to_atoms already places (positions, masses, calculator results, ...).
_PLACED = frozenset({"atomic_numbers", "positions", "velocities", "atomic_masses", "forces", "cell", "pbc", "energy", "stress"})
_NOT_EXPORTED = frozenset({"neighbor_list", "shifts", "neighbor_list_shifts"})  # edges have no frame field


def _as_numpy(name: str, t: torch.Tensor) -> np.ndarray:
    if t.dtype.is_complex:
        raise InvalidDataError(
            f"field {name!r} is complex, which extended XYZ cannot hold; pass exclude=[{name!r}]"
        )
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    return t.detach().cpu().numpy()


def structure_to_atoms(data: AtomicData, exclude: Iterable[str] = ()) -> ase.Atoms:
    """One frame: ``AtomicData.to_atoms()`` plus the other atom and system fields.

    Raises:
        InvalidDataError: A field that extended XYZ cannot hold (and that is not excluded).
    """
    atoms = data.to_atoms()
    skip = _PLACED | _NOT_EXPORTED | set(exclude)
    for name, level in data.levels.items():
        if name in skip or level is Level.EDGE:
            continue
        value = _as_numpy(name, getattr(data, name))
        if level is Level.NODE:
            key = name if name not in atoms.arrays else f"alchemi_{name}"
            atoms.arrays[key] = value
        else:
            row = value[0]
            atoms.info[name] = row.item() if row.ndim == 0 or row.size == 1 else row.reshape(-1)
    return atoms


def export_extxyz(
    source: Any,
    path: str | Path,
    *,
    start: int = 0,
    stop: int | None = None,
    exclude: Iterable[str] = (),
    block_size: int = 1024,
) -> int:
    """Write structures ``start:stop`` of a store to the extended XYZ file ``path`` (replaced).

    Args:
        source: An ``AtomicDataZarrReader``, or anything one opens (path, URL, zarr store).
        path: The output file.
        exclude: Fields to leave out.
        block_size: Structures converted and written per block.

    Returns:
        The number of frames written.
    """
    import ase.io

    from alchemi_zarr.reader import AtomicDataZarrReader

    reader = source if isinstance(source, AtomicDataZarrReader) else AtomicDataZarrReader(source)
    stop = len(reader) if stop is None else min(int(stop), len(reader))
    exclude = tuple(exclude)
    Path(path).unlink(missing_ok=True)
    written = 0
    for lo in range(int(start), stop, block_size):
        frames = [structure_to_atoms(reader[i], exclude) for i in range(lo, min(lo + block_size, stop))]
        ase.io.write(str(path), frames, format="extxyz", append=written > 0)
        written += len(frames)
    return written
