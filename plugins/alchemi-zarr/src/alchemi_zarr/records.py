"""Systems on their way between a ``Batch`` and a store: host copies, local atom indices.

A write copies the selected systems to host memory (:func:`snapshot`) and turns them into
:class:`HostRecords`: numpy rows per field, index fields shifted so each system's atom indices
start at 0. Reading goes the other way (:func:`to_tensor`, :func:`to_batch_indices`).

Example:
    >>> from alchemi_core.testing import make_batch
    >>> records = HostRecords.from_snapshot(snapshot(make_batch([3, 2], edges=True), copy=False))
    >>> records.num_systems, records.fields["neighbor_list"].tolist()
    (2, [[0, 1], [1, 2], [2, 0], [0, 1], [1, 0]])
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping
from typing import TypeVar

import attrs
import numpy as np
import torch

from alchemi_core.data import Batch
from alchemi_core.data.fields import INDEX_FIELDS, Level
from alchemi_core.data.staging import StagingSlot
from alchemi_core.dynamics.capture import gpu_index
from alchemi_core.errors import InvalidDataError
from alchemi_zarr.layout import FieldSpec
from alchemi_zarr.tuning import ZarrTuning

T = TypeVar("T")


@attrs.define
class Snapshot:
    """Host tensors of some systems; on a GPU the copy may still be in flight until
    :meth:`wait` (a CUDA event recorded after the copies)."""

    tensors: dict[str, torch.Tensor]
    levels: dict[str, Level]
    num_atoms: np.ndarray
    num_edges: np.ndarray
    system_ids: torch.Tensor | None
    event: torch.cuda.Event | None = None
    #: Gives the staging buffers back (see :meth:`release`).
    on_release: Callable[[], None] | None = None
    #: The staging slot holding the host tensors, if any.
    slot: StagingSlot | None = None

    def id_list(self) -> list[int]:
        """The ``system_id`` of the snapshot's systems (empty when it has none), for messages."""
        self.wait()
        return [] if self.system_ids is None else self.system_ids.reshape(-1).tolist()

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()
            self.event = None

    def release(self) -> None:
        """Give the staging buffers back (a no-op without staging, and after the first call)."""
        done, self.on_release = self.on_release, None
        if done is not None:
            self.wait()
            # The ids stay known for messages about this snapshot; the buffers go back.
            self.system_ids = None if self.system_ids is None else self.system_ids.clone()
            self.tensors = {}
            self.slot = None
            done()


def snapshot(batch: Batch, copy: bool, slot: StagingSlot | None = None, release: Callable[[], None] | None = None,
             tuning: ZarrTuning | None = None) -> Snapshot:
    """Copy every field of ``batch`` to host memory.

    With a staging ``slot`` the copies go into its reused buffers, and ``release`` (called by
    :meth:`Snapshot.release`) gives it back; without one, GPU fields go to new pinned tensors and
    CPU fields are cloned when ``copy`` is True (the caller may go on changing the batch). GPU
    copies never block the host (:meth:`Snapshot.wait` waits); with ``copy`` and
    ``tuning.copy_stream`` (default: the batch device's) they run on a side stream.
    """
    tensors: dict[str, torch.Tensor] = {}
    on_gpu = batch.device.type == "cuda"
    sources = {name: getattr(batch, name).detach() for name in batch.keys()}
    side = None
    if on_gpu and copy and (tuning or ZarrTuning.for_device(batch.device)).copy_stream:
        side = _side_stream(gpu_index(batch.device))
    if side is not None:
        sources = {name: t.clone() for name, t in sources.items()}  # the steps may now go on
        side.wait_stream(torch.cuda.current_stream(batch.device))
        for t in sources.values():
            t.record_stream(side)  # the allocator keeps them until the side stream's copies end
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        event = _copy_to_host(sources, tensors, on_gpu, copy, slot)
    return Snapshot(
        tensors=tensors,
        levels=batch.levels,
        num_atoms=batch.num_nodes_per_system.copy(),
        num_edges=batch.num_edges_per_system.copy(),
        system_ids=tensors.get("system_id"),
        event=event,
        on_release=release,
        slot=slot,
    )


def _copy_to_host(sources: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], on_gpu: bool, copy: bool,
                  slot: StagingSlot | None) -> torch.cuda.Event | None:
    """Fill ``tensors`` with host copies of ``sources``; the event recorded after them (None on a CPU)."""
    if slot is not None:
        slot.reserve(sum(t.numel() * t.element_size() for t in sources.values()), pinned=on_gpu)
    for name, t in sources.items():
        if slot is not None:
            host = slot.buffer(name, t)
            host.copy_(t, non_blocking=on_gpu)
        elif on_gpu:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
        else:
            host = t.clone() if copy else t
        tensors[name] = host
    if not on_gpu:
        return None
    event = torch.cuda.Event()
    event.record()
    return event


@functools.cache
def _side_stream(index: int) -> torch.cuda.Stream:
    """The stream GPU ``index``'s snapshots copy to the host on (one per GPU, made once)."""
    return torch.cuda.Stream(torch.device("cuda", index))


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host tensor as the numpy array zarr stores (bfloat16 as its uint16 bits)."""
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.uint16).numpy()
    return t.contiguous().numpy()


def to_tensor(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A stored numpy array as a tensor of ``dtype`` (bfloat16 viewed back from its bits)."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(a)).view(torch.bfloat16)
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if t.dtype == dtype else t.to(dtype)


def local_offsets(num_atoms: np.ndarray, num_edges: np.ndarray) -> np.ndarray:
    """Per edge, the first atom row of its system within the concatenation (``[E, 1]``)."""
    starts = np.concatenate(([0], np.cumsum(num_atoms)[:-1])).astype(np.int64)
    return np.repeat(starts, num_edges)[:, None]


def to_batch_indices(local: np.ndarray, num_atoms: np.ndarray, num_edges: np.ndarray) -> np.ndarray:
    """Stored (per-system) atom indices as indices into the concatenated atoms of a batch."""
    return local + local_offsets(num_atoms, num_edges) if len(local) else local


@attrs.frozen
class HostRecords:
    """Systems ready to be stored: numpy rows per field, atom indices local to each system."""

    fields: dict[str, np.ndarray]
    specs: dict[str, FieldSpec]
    num_atoms: np.ndarray
    num_edges: np.ndarray

    @property
    def num_systems(self) -> int:
        return len(self.num_atoms)

    @classmethod
    def from_snapshot(cls, snap: Snapshot, units: Mapping[str, str] | None = None) -> HostRecords:
        """Records of a (finished) snapshot; ``units`` name the units of custom fields.

        Raises:
            InvalidDataError: The snapshot holds one ``system_id`` twice.
        """
        snap.wait()
        if snap.system_ids is not None:
            ids = snap.system_ids.reshape(-1)
            if len(ids) > 1 and len(torch.unique(ids)) != len(ids):
                values, counts = torch.unique(ids, return_counts=True)
                raise InvalidDataError(
                    f"the systems written hold system_id {values[counts > 1][:10].tolist()} more than once; nothing "
                    "was written. Give each system of a batch its own system_id"
                )
        units = units or {}
        fields: dict[str, np.ndarray] = {}
        specs: dict[str, FieldSpec] = {}
        for name, t in snap.tensors.items():
            specs[name] = FieldSpec.of(name, snap.levels[name], t, units.get(name))
            a = to_numpy(t)
            if name in INDEX_FIELDS:
                a = a - local_offsets(snap.num_atoms, snap.num_edges) if len(a) else a
            fields[name] = a
        return cls(fields, specs, snap.num_atoms, snap.num_edges)

    @classmethod
    def concat(cls, parts: list[HostRecords]) -> HostRecords:
        """One set of records from several with the same fields (indices are local: no shifts)."""
        if len(parts) == 1:
            return parts[0]
        fields = {name: np.concatenate([p.fields[name] for p in parts]) for name in parts[0].fields}
        return cls(
            fields,
            parts[0].specs,
            np.concatenate([p.num_atoms for p in parts]),
            np.concatenate([p.num_edges for p in parts]),
        )


def same_field_runs(items: list[tuple[HostRecords, T]]) -> list[list[tuple[HostRecords, T]]]:
    """Consecutive ``(records, payload)`` pairs with identical fields, grouped: each group can be
    committed as one append (``HostRecords.concat``), in the order given."""
    runs: list[list[tuple[HostRecords, T]]] = []
    for item in items:
        if runs and runs[-1][0][0].specs == item[0].specs:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs
