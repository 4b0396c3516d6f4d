"""``export_extxyz``: any alchemi store (path, URL, zarr store or open reader) to extended XYZ.

Example:
    >>> import ase.io, tempfile, os
    >>> from alchemi_core.testing import random_structures
    >>> from alchemi_zarr import AtomicDataZarrWriter
    >>> AtomicDataZarrWriter("memory://export-doc").write(random_structures([3, 2]))
    2
    >>> path = os.path.join(tempfile.mkdtemp(), "out.extxyz")
    >>> export_extxyz("memory://export-doc", path)
    2
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from alchemi_zarr.extxyz import write_extxyz
from alchemi_zarr.reader import AtomicDataZarrReader
from alchemi_zarr.sharded import ShardedZarrReader, open_reader


def export_extxyz(
    source: Any,
    path: str | Path,
    *,
    start: int = 0,
    stop: int | None = None,
    exclude: Iterable[str] = (),
    block_size: int = 1024,
) -> int:
    """:func:`~alchemi_zarr.extxyz.write_extxyz` of ``source``: an ``AtomicDataZarrReader`` or
    ``ShardedZarrReader``, or anything one opens (path, URL, zarr store; the root of a sharded
    store reads as one set)."""
    reader = source if isinstance(source, AtomicDataZarrReader | ShardedZarrReader) else open_reader(source)
    return write_extxyz(reader, path, start=start, stop=stop, exclude=exclude, block_size=block_size)
