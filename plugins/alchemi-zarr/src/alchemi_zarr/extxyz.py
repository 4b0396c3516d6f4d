"""Write an alchemi store to extended XYZ through ASE, in blocks, so a large store streams.

Each structure becomes one frame (``AtomicData.to_atoms()``): energy, forces and stress as
calculator results, other atom fields as per-atom arrays, other system fields in ``atoms.info``.
Extended XYZ keeps positions and forces to 8 decimals; the store itself keeps every bit.
``alchemi_zarr.export_extxyz`` opens a store by path or URL (sharded or not) and writes it.

Example:
    >>> import ase.io, tempfile, os
    >>> from alchemi_core.testing import random_structures
    >>> from alchemi_zarr import AtomicDataZarrReader, AtomicDataZarrWriter
    >>> AtomicDataZarrWriter("memory://extxyz-doc").write(random_structures([3, 2]))
    2
    >>> path = os.path.join(tempfile.mkdtemp(), "out.extxyz")
    >>> write_extxyz(AtomicDataZarrReader("memory://extxyz-doc"), path)
    2
    >>> [len(a) for a in ase.io.read(path, index=":")]
    [3, 2]
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from alchemi_core.data.ase_io import EDGE_FIELDS


def write_extxyz(
    reader: Any,
    path: str | Path,
    *,
    start: int = 0,
    stop: int | None = None,
    exclude: Iterable[str] = (),
    block_size: int = 1024,
) -> int:
    """Write structures ``start:stop`` of an open reader to the extended XYZ file ``path`` (replaced).

    Args:
        reader: An ``AtomicDataZarrReader`` or ``ShardedZarrReader`` (anything with ``len`` and
            indexing by position).
        path: The output file.
        exclude: Fields to leave out.
        block_size: Structures converted and written per block.

    Returns:
        The number of frames written.

    Raises:
        InvalidDataError: A field that extended XYZ cannot hold (and that is not excluded).
    """
    import ase.io

    stop = len(reader) if stop is None else min(int(stop), len(reader))
    exclude = (*EDGE_FIELDS, *exclude)
    Path(path).unlink(missing_ok=True)
    written = 0
    for lo in range(int(start), stop, block_size):
        frames = [reader[i].to_atoms(exclude=exclude) for i in range(lo, min(lo + block_size, stop))]
        ase.io.write(str(path), frames, format="extxyz", append=written > 0)
        written += len(frames)
    return written
