"""alchemi-warp: ``GPUBuffer`` (``sink:gpu-buffer``) and Warp kernels behind ``Batch.put``,
``defrag`` and ``zero`` (``buffer:warp``). Importing the package imports no Warp."""

from __future__ import annotations

__version__ = "0.1.0"
