"""``GPUBuffer`` (``sink:gpu-buffer``): a fixed-size, device-resident store of systems.

The first ``write`` allocates one ``Batch`` for ``capacity`` systems of at most ``max_atoms`` atoms
and ``max_edges`` edges, with that batch's fields; later writes copy rows in with ``Batch.put``
and allocate nothing, and ``zero`` keeps the memory (and the addresses a CUDA graph or matched
``isend``/``irecv`` need). A write is all or nothing.

Example:
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_warp.gpu_buffer import GPUBuffer
    >>> batch = make_batch([3, 5])
    >>> buffer = GPUBuffer(capacity=100, max_atoms=50, max_edges=200, device="cpu")
    >>> buffer.write(batch)
    >>> len(buffer)
    2
    >>> buffer.read().num_nodes
    8
"""

from __future__ import annotations

import numpy as np
import torch

from alchemi_core.data import Batch
from alchemi_core.data.buffer_ops import BufferOps
from alchemi_core.dynamics.sinks import DataSink, capacity_error, contents_state, restore_contents
from alchemi_core.errors import CapacityError, ConfigurationError, InvalidDataError


class GPUBuffer(DataSink):
    """GPU-resident buffer for batched atomic data (the seed's ``GPUBuffer``).

    Args:
        capacity: Most systems (graphs) stored.
        max_atoms: Most atoms in one system; the buffer holds ``capacity * max_atoms`` atoms.
        max_edges: Most edges in one system; the buffer holds ``capacity * max_edges`` edges.
        device: Where the data lives (``"cuda"``, ``"cuda:1"``; ``"cpu"`` works too).
        ops: The row copies of writes and ``zero`` (default: core's choice for the device).

    Raises:
        ConfigurationError: A negative size, or a CUDA device on a machine without CUDA.
    """

    def __init__(self, capacity: int, max_atoms: int, max_edges: int, device: torch.device | str = "cuda",
                 ops: BufferOps | None = None) -> None:
        for name, value in (("capacity", capacity), ("max_atoms", max_atoms), ("max_edges", max_edges)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ConfigurationError(f"GPUBuffer {name} must be a non-negative int, got {value!r}")
        device = torch.device(device)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ConfigurationError(
                    f"GPUBuffer was asked for device {str(device)!r} but torch sees no CUDA device; "
                    'pass device="cpu" on machines without a GPU'
                )
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
        self._capacity = int(capacity)
        self._max_atoms = int(max_atoms)
        self._max_edges = int(max_edges)
        self._device = device
        self._ops = ops
        self._storage: Batch | None = None
        #: Bool ``[B]`` on the last written batch's device: the systems the last write copied.
        self._copied_mask: torch.Tensor | None = None
        #: Bool ``[capacity]`` on the buffer's device: the slots the last write filled.
        self._dest_mask: torch.Tensor | None = None

    # ------------------------------------------------------------------ sizes
    @property
    def capacity(self) -> int:
        """Maximum number of systems the buffer stores."""
        return self._capacity

    @property
    def max_atoms(self) -> int:
        """Most atoms one stored system may have."""
        return self._max_atoms

    @property
    def max_edges(self) -> int:
        """Most edges one stored system may have."""
        return self._max_edges

    @property
    def device(self) -> torch.device:
        """The device the stored tensors live on."""
        return self._device

    @property
    def storage(self) -> Batch | None:
        """The pre-allocated batch (capacity rows included); None before the first write."""
        return self._storage

    def __len__(self) -> int:
        return 0 if self._storage is None else self._storage.num_graphs

    # ------------------------------------------------------------------ writing
    def write(self, batch: Batch, mask: torch.Tensor | None = None) -> None:
        """Copy the systems of ``batch`` where ``mask`` is True (all when None) into the buffer;
        sets ``_copied_mask`` (systems copied) and ``_dest_mask`` (slots filled).

        Raises:
            RuntimeError: The selected systems would exceed the capacity, or one of them has more
                atoms or edges than ``max_atoms``/``max_edges``; nothing is written.
            ValueError: ``mask`` is not a bool tensor of length ``batch.num_graphs``, or the
                batch's fields differ from those the buffer was allocated with.
        """
        host_mask = self._host_mask(batch, mask)
        selected = np.arange(batch.num_graphs) if host_mask is None else np.nonzero(host_mask.numpy())[0]
        self._check_fits(batch, selected)
        storage = self._allocate_like(batch)
        if len(selected):
            source, source_mask = batch, host_mask
            if batch.device != self._device:
                # Move only the selected systems, not the whole batch.
                source, source_mask = batch.index_select(selected).to(self._device), None
            copied = storage.put(source, source_mask, self._ops)
            if copied != len(selected):  # pragma: no cover - _check_fits guarantees room
                raise CapacityError(f"GPUBuffer copied {copied} of {len(selected)} systems; this is a bug")
            self._dest_mask = storage._dest_mask
        else:
            self._dest_mask = torch.zeros(self._capacity, dtype=torch.bool, device=self._device)
        copied_mask = torch.ones(batch.num_graphs, dtype=torch.bool) if host_mask is None else host_mask
        self._copied_mask = copied_mask.to(batch.device)

    def _host_mask(self, batch: Batch, mask: torch.Tensor | None) -> torch.Tensor | None:
        """The mask on the host (the one read-back of a write), validated."""
        if mask is None:
            return None
        m = mask if isinstance(mask, torch.Tensor) else torch.as_tensor(mask)
        if m.dtype != torch.bool or m.dim() != 1 or m.numel() != batch.num_graphs:
            raise InvalidDataError(
                f"GPUBuffer.write: mask must be a bool tensor of shape [{batch.num_graphs}] (one entry "
                f"per system of the batch), got {m.dtype} {list(m.shape)}"
            )
        return m.detach().cpu()

    def _check_fits(self, batch: Batch, selected: np.ndarray) -> None:
        """Raise, before anything is touched, when the selected systems cannot all be stored."""
        held = len(self)
        if held + len(selected) > self._capacity:
            raise capacity_error("GPUBuffer", len(selected), held, self._capacity)
        for what, counts, limit in (
            ("atoms", batch.num_nodes_per_system, self._max_atoms),
            ("edges", batch.num_edges_per_system, self._max_edges),
        ):
            sizes = counts[selected]
            too_big = np.nonzero(sizes > limit)[0]
            if len(too_big):
                first = int(selected[too_big[0]])
                raise CapacityError(
                    f"GPUBuffer: system {first} of the batch has {int(counts[first])} {what}, more "
                    f"than max_{what}={limit} ({len(too_big)} selected system(s) too large). Nothing "
                    f"was written; build the buffer with a larger max_{what}"
                )

    def _allocate_like(self, batch: Batch) -> Batch:
        """The storage batch: allocated from ``batch`` on the first write, checked afterwards."""
        if self._storage is None:
            self._storage = Batch.empty(
                num_systems=self._capacity,
                num_nodes=self._capacity * self._max_atoms,
                num_edges=self._capacity * self._max_edges,
                template=batch,
                device=self._device,
            )
            return self._storage
        storage = self._storage
        mine = {k: _field_layout(storage, k) for k in storage.keys()}
        theirs = {k: _field_layout(batch, k) for k in batch.keys()}
        if mine != theirs:
            diff = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
            detail = "; ".join(f"{k}: buffer {mine.get(k, 'absent')}, batch {theirs.get(k, 'absent')}" for k in diff)
            raise InvalidDataError(
                f"GPUBuffer.write: the batch's fields differ from those the buffer was allocated with "
                f"on its first write ({detail}). Nothing was written; write batches with the same "
                "fields, or use a new GPUBuffer"
            )
        return storage

    # ------------------------------------------------------------------ reading
    def read(self) -> Batch:
        """The stored systems as one batch without padding (a copy; the buffer is unchanged).

        Raises:
            RuntimeError: The buffer is empty.
        """
        if len(self) == 0:
            raise CapacityError("GPUBuffer is empty: nothing to read; write() systems first")
        assert self._storage is not None
        return self._storage.index_select(slice(None))

    def zero(self) -> None:
        """Empty the buffer and zero its tensors, keeping their memory, shapes and addresses."""
        if self._storage is not None:
            self._storage.zero(self._ops)
        self._copied_mask = None
        self._dest_mask = None

    def state_dict(self) -> dict:
        """The contents, for checkpoints (plain tensors on the CPU)."""
        return contents_state(self)

    def load_state_dict(self, state: dict) -> None:
        """Replace the contents with those :meth:`state_dict` saved, on the buffer's device."""
        restore_contents(self, state, self._device)

    def __repr__(self) -> str:
        return (
            f"GPUBuffer({len(self)}/{self._capacity} systems, max_atoms={self._max_atoms}, "
            f"max_edges={self._max_edges}, device={self._device})"
        )


def _field_layout(batch: Batch, name: str) -> tuple[str, str, tuple[int, ...]]:
    """What must match between a buffer's field and an incoming one: level, dtype, row shape."""
    t = batch.storage(name)
    return (batch.level_of(name).value, str(t.dtype).removeprefix("torch."), tuple(t.shape[1:]))
