"""The Zarr sink's per-device choices, as one frozen value (:class:`ZarrTuning`).

:class:`~alchemi_zarr.sink.ZarrData` takes an optional ``tuning=``; without one each write uses
:meth:`ZarrTuning.for_device` of the batch's device. Every choice stores the same values.

Example:
    >>> import attrs
    >>> from alchemi_zarr.tuning import ZarrTuning
    >>> ZarrTuning.for_device("cuda").copy_stream
    True
    >>> attrs.evolve(ZarrTuning.for_device("cuda"), copy_stream=False).copy_stream
    False
"""

from __future__ import annotations

import attrs
import torch

from alchemi_core.tuning import CoreTuning


@attrs.frozen
class ZarrTuning:
    """How a Zarr sink copies a batch off one kind of device.

    Attributes:
        copy_stream: A GPU snapshot for a background writer is copied on the device on the
            current stream, then to the host on a stream of its own, so the steps queued after it
            wait for the device copies only, not for PCIe (``python -m tools.snapshot_overlap``
            compares both). CPUs have no such choice.
    """

    copy_stream: bool

    @classmethod
    def for_device(cls, device: str | torch.device) -> ZarrTuning:
        """The choices for ``device`` (``"cuda"``, ``"cpu"``, a ``torch.device``)."""
        return cls(copy_stream=CoreTuning.device_type(device) == "cuda")
