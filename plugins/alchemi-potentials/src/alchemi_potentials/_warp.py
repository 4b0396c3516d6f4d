"""alchemi-potentials' handle on the shared Warp runtime (``alchemi_core.warp_runtime``), naming
this package in the errors.
"""

from __future__ import annotations

from typing import Any

import torch

from alchemi_core import warp_runtime
from alchemi_core.warp_runtime import KernelLaunchError, stream_for, view, warp

__all__ = ["KernelLaunchError", "LaunchSequence", "require_device", "stream_for", "view", "warp"]

WHO = "alchemi-potentials"


def require_device(device: torch.device) -> None:
    """Raise a clear error where Warp cannot run kernels on ``device`` (see core's)."""
    warp_runtime.require_device(device, who=WHO)


class LaunchSequence(warp_runtime.LaunchSequence):
    """Core's ``LaunchSequence`` naming this package in its errors."""

    def __init__(self, device: Any) -> None:
        super().__init__(device, who=WHO)
