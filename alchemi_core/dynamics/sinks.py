"""Data sinks: where graduated systems and snapshots go.

``DataSink`` is the interface every sink implements (``GPUBuffer`` from ``alchemi-warp``,
``ZarrData`` from ``alchemi-zarr``, :class:`HostMemory` here). A write is all or nothing: when the
selected systems would exceed the capacity, ``write`` raises ``RuntimeError`` and stores nothing.

Example:
    >>> import torch
    >>> from alchemi_core.data import AtomicData, Batch
    >>> from alchemi_core.dynamics import HostMemory
    >>> batch = Batch.from_data_list([AtomicData(atomic_numbers=[1], positions=[[0.0, 0, 0]])] * 3)
    >>> sink = HostMemory(capacity=10)
    >>> sink.write(batch, mask=torch.tensor([True, False, True]))
    >>> len(sink), sink.read().num_graphs
    (2, 2)
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from alchemi_core.data import Batch
from alchemi_core.errors import CapacityError, InvalidDataError
from alchemi_core.validation import whole_number


class DataSink(ABC):
    """Storage for batches of systems, with a fixed capacity in systems."""

    @abstractmethod
    def write(self, batch: Batch, mask: torch.Tensor | None = None) -> None:
        """Store the systems of ``batch`` where ``mask`` is True (all when None).

        Raises:
            RuntimeError: The selected systems would exceed the capacity (nothing is written).
            ValueError: The mask's length differs from ``batch.num_graphs``.
        """

    @abstractmethod
    def read(self) -> Batch:
        """Everything stored, as one batch.

        Raises:
            RuntimeError: The sink is empty.
        """

    @abstractmethod
    def zero(self) -> None:
        """Forget the contents (a sink that pre-allocates keeps its memory)."""

    def drain(self) -> Batch:
        """``read()`` then ``zero()``."""
        out = self.read()
        self.zero()
        return out

    def is_full(self) -> bool:
        return len(self) >= self.capacity

    @abstractmethod
    def __len__(self) -> int:
        """Number of systems stored."""

    @property
    @abstractmethod
    def capacity(self) -> int:
        """Most systems the sink can hold."""

    @property
    def free(self) -> int:
        """Systems that still fit."""
        return max(0, self.capacity - len(self))


def contents_state(sink: DataSink) -> dict:
    """A sink's contents for a checkpoint (plain tensors on the CPU): the ``state_dict`` of a
    sink whose contents vanish with the process (host or device memory)."""
    from alchemi_core.dynamics.checkpoint import batch_state

    return {"count": len(sink), "batch": batch_state(sink.read()) if len(sink) else None}


def restore_contents(sink: DataSink, state: dict, device: str | torch.device = "cpu") -> None:
    """Replace ``sink``'s contents with those :func:`contents_state` saved, on ``device``."""
    from alchemi_core.dynamics.checkpoint import batch_from_state

    sink.zero()
    if state.get("batch") is not None:
        sink.write(batch_from_state(state["batch"], device))


def selected_count(batch: Batch, mask: torch.Tensor | None, who: str) -> tuple[int, torch.Tensor | None]:
    """Validate a write mask and count the selected systems (one read-back)."""
    if mask is None:
        return batch.num_graphs, None
    if not isinstance(mask, torch.Tensor):
        mask = torch.as_tensor(mask)
    if mask.dtype != torch.bool or mask.dim() != 1 or mask.numel() != batch.num_graphs:
        raise InvalidDataError(
            f"{who}.write: mask must be a bool tensor of shape [{batch.num_graphs}] "
            f"(one entry per system), got {mask.dtype} {list(mask.shape)}"
        )
    return int(mask.sum()), mask


def capacity_error(who: str, wanted: int, held: int, capacity: int) -> CapacityError:
    return CapacityError(
        f"{who} cannot take {wanted} more systems: it holds {held} of {capacity}. Nothing was "
        "written; give it a larger capacity, drain it, or add another sink after it"
    )


class HostMemory(DataSink):
    """Systems kept in host (CPU) memory.

    Args:
        capacity: Most systems it holds (None: unlimited).
    """

    def __init__(self, capacity: int | None = 1000) -> None:
        if capacity is not None:
            capacity = whole_number("HostMemory capacity", capacity, minimum=0, none_means="no limit")
        self._capacity = capacity
        self._chunks: list[Batch] = []
        self._count = 0

    @property
    def capacity(self) -> int:
        return self._capacity if self._capacity is not None else 2**62

    def __len__(self) -> int:
        return self._count

    def write(self, batch: Batch, mask: torch.Tensor | None = None) -> None:
        n, m = selected_count(batch, mask, "HostMemory")
        if self._count + n > self.capacity:
            raise capacity_error("HostMemory", n, self._count, self.capacity)
        if n == 0:
            return
        chunk = batch.index_select(m if m is not None else slice(None)).to("cpu")
        self._chunks.append(chunk)
        self._count += n

    def read(self) -> Batch:
        if not self._chunks:
            raise CapacityError("HostMemory is empty: nothing to read")
        if len(self._chunks) > 1:
            merged = self._chunks[0].clone()
            for c in self._chunks[1:]:
                merged.append(c)
            self._chunks = [merged.trim()]
        return self._chunks[0].clone()

    def zero(self) -> None:
        self._chunks = []
        self._count = 0

    def state_dict(self) -> dict:
        """The contents, for checkpoints."""
        return contents_state(self)

    def load_state_dict(self, state: dict) -> None:
        """Replace the contents with those :meth:`state_dict` saved."""
        restore_contents(self, state)

    def __repr__(self) -> str:
        return f"HostMemory({self._count}/{self._capacity})"
