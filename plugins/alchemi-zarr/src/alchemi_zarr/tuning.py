"""The Zarr sink's measured per-device choices, as one frozen value (:class:`ZarrTuning`).

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
        copy_stream: A GPU snapshot for a background writer copies to the host on a stream of its
            own, after copying the fields on the device on the current stream (microseconds), so
            the steps queued after it wait only for those copies, not for PCIe. On an H100
            (``python -m tools.snapshot_overlap``, 320 MB): the next kernel done 0.39 ms after the
            snapshot began against 5.97 ms without. Only GPUs have it (a CPU's copy is the
            snapshot itself).
    """

    copy_stream: bool

    @classmethod
    def for_device(cls, device: str | torch.device) -> ZarrTuning:
        """The measured choices for ``device`` (``"cuda"``, ``"cpu"``, a ``torch.device``)."""
        return cls(copy_stream=CoreTuning.device_type(device) == "cuda")
