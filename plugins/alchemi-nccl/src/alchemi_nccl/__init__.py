"""alchemi-nccl: torch.distributed transports for alchemi pipelines: NCCL on GPUs, gloo on CPUs."""

from __future__ import annotations

__version__ = "0.1.0"
