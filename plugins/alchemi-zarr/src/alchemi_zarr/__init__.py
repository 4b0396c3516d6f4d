"""alchemi-zarr: trajectory and dataset storage in Zarr v3 on any fsspec URL, with nothing lost.

- :class:`ZarrData`: a ``DataSink`` (``sink:zarr``, ``alchemi_core.dynamics.ZarrData``), with an
  asynchronous mode that writes from a child process (or a thread, for in-memory stores).
- :class:`AtomicDataZarrWriter` / :class:`AtomicDataZarrReader`: datasets of structures
  (``alchemi_core.data.datapipes``), random access and cheap size metadata for
  ``SizeAwareSampler``.
- :func:`export_extxyz`: any store to extended XYZ through ASE.
- :class:`ShardedZarrStore` / :class:`ShardedZarrReader`: one results store with a part per
  writing rank (data-parallel runs), read as one set; :func:`open_reader` opens either kind.

The store layout is documented in ``docs/storage.md`` and defined in :mod:`alchemi_zarr.layout`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.lazy import lazy_exports

__version__ = "0.1.0"

if TYPE_CHECKING:
    from alchemi_zarr.export import export_extxyz
    from alchemi_zarr.pending import BackgroundWriteError
    from alchemi_zarr.reader import AtomicDataZarrReader
    from alchemi_zarr.sharded import ShardedZarrReader, open_reader
    from alchemi_zarr.sharded_store import ShardedZarrStore
    from alchemi_zarr.sink import ZarrData
    from alchemi_zarr.writer import AtomicDataZarrWriter

_WHERE = {
    "ZarrData": "alchemi_zarr.sink",
    "AtomicDataZarrReader": "alchemi_zarr.reader",
    "AtomicDataZarrWriter": "alchemi_zarr.writer",
    "BackgroundWriteError": "alchemi_zarr.pending",
    "export_extxyz": "alchemi_zarr.export",
    "ShardedZarrReader": "alchemi_zarr.sharded",
    "ShardedZarrStore": "alchemi_zarr.sharded_store",
    "open_reader": "alchemi_zarr.sharded",
}
__all__ = sorted(_WHERE)
__getattr__ = lazy_exports(__name__, _WHERE)
