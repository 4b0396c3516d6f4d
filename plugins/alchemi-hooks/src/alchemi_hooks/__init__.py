"""alchemi-hooks: hooks for alchemi: force clamp, logging, snapshots, NaN detection, energy drift, frozen atoms, periodic wrapping, progress and timing."""

from __future__ import annotations

__version__ = "0.1.0"
