"""alchemi-warp: warp GPU buffers for alchemi: GPUBuffer and Warp kernels behind Batch.put/defrag/zero."""

from __future__ import annotations

__version__ = "0.1.0"
