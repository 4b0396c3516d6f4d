"""alchemi-warp: ``GPUBuffer`` (``sink:gpu-buffer``) and Warp kernels behind ``Batch.put``,
``defrag`` and ``zero`` (``buffer:warp``).

Importing the package imports neither Warp nor the kernels; ``alchemi_warp.buffer_ops`` and
``alchemi_warp.kernels`` do, when first used.
"""

from __future__ import annotations

__version__ = "0.1.0"
