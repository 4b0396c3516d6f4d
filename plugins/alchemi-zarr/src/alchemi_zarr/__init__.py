"""alchemi-zarr: zarr storage for alchemi: ZarrData sinks on any fsspec URL, readers, writers and datasets."""

from __future__ import annotations

__version__ = "0.1.0"
