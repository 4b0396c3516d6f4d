"""Transfer frames: a batch buffer whose header and fields share one byte arena.

A pipeline link moves one :class:`Frame` per iteration, allocated once from a *schema* (field
names, dtypes, trailing shapes, levels, capacities) the sender sends as JSON bytes first. Every
field is a view into one ``uint8`` arena after an ``int64`` header (counts, flags, per-system
sizes), so a transfer is one message of a fixed size, every dtype travels as raw bytes, and a
receive can be posted before the sender knows what it sends. Fields that appear later are sent
as an empty frame flagged ``FLAG_SCHEMA`` followed by a new schema.

Example:
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_core.comm.frame import Frame
    >>> batch = make_batch([3, 2], extras=True)
    >>> frame = Frame.like(batch, num_systems=4, num_nodes=10, num_edges=0)
    >>> frame.batch.put(batch)
    2
    >>> frame.stamp(flags=0)
    >>> copy = Frame(frame.schema, device="cpu")
    >>> _ = copy.arena.copy_(frame.arena)  # what a transport does: the bytes, nothing else
    >>> copy.read(), copy.batch.num_nodes_list, copy.batch.frozen.dtype
    (0, [3, 2], torch.bool)
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from alchemi_core.data import Batch
from alchemi_core.data.fields import Level
from alchemi_core.errors import PipelineError

#: Header slots before the per-system counts.
HEADER_FIXED = 4  # num_systems, num_nodes, num_edges, flags
FLAG_DONE = 1  # the sender has finished: nothing more will come on this link
FLAG_ERROR = 2  # the sender failed; the receiver must stop with an error
FLAG_SCHEMA = 4  # a new schema follows this (empty) frame: fields appeared at the sender
#: Byte alignment of each field in the arena (enough for any dtype and for coalesced access).
ALIGN = 64

_CAPS = {Level.SYSTEM: 0, Level.NODE: 1, Level.EDGE: 2}


def schema_of(batch: Batch, capacity: tuple[int, int, int]) -> dict[str, Any]:
    """The JSON-able description of a frame holding ``batch``'s fields at ``capacity``.

    Args:
        batch: Gives the field names, dtypes, trailing shapes and levels (not the values).
        capacity: ``(systems, atoms, edges)`` the frame holds at most.
    """
    return {
        "capacity": [int(c) for c in capacity],
        "fields": [
            {
                "name": k,
                "dtype": str(batch.storage(k).dtype).replace("torch.", ""),
                "shape": list(batch.storage(k).shape[1:]),
                "level": batch.level_of(k).value,
            }
            for k in sorted(batch.keys())
        ],
    }


def encode_schema(schema: dict[str, Any]) -> torch.Tensor:
    """JSON bytes of ``schema`` as a ``uint8`` tensor (what goes on the wire)."""
    raw = json.dumps(schema, sort_keys=True).encode()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def decode_schema(raw: torch.Tensor) -> dict[str, Any]:
    """The schema from its JSON bytes (parsed as data; nothing is executed)."""
    try:
        out = json.loads(bytes(raw.cpu().numpy().tobytes()).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PipelineError(f"received a malformed buffer schema ({exc}); are both ranks running the same alchemi?") from None
    if not isinstance(out, dict):
        raise PipelineError("received a malformed buffer schema (not a JSON object)")
    return out


def _dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise PipelineError(f"received a schema with unknown dtype {name!r}")
    return dtype


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Frame:
    """A fixed-size transfer buffer: ``batch`` (fields as views) over one byte ``arena``.

    Args:
        schema: From :func:`schema_of` (or received from the sender).
        device: Where the arena lives (the transport's device).

    Attributes:
        arena: The ``uint8`` tensor a transport sends or receives whole.
        batch: A ``Batch`` with capacity whose fields are views into ``arena``.
        names: The fields carried, in arena order.
    """

    def __init__(self, schema: dict[str, Any], device: torch.device | str) -> None:
        self.schema = schema
        self.device = torch.device(device)
        cap = [int(c) for c in schema["capacity"]]
        if len(cap) != 3 or min(cap) < 0:
            raise PipelineError(f"received a schema with capacity {schema['capacity']!r}")
        self.capacity = tuple(cap)
        self.header_len = HEADER_FIXED + 2 * cap[0]
        offset = _aligned(self.header_len * 8)
        layout: list[tuple[str, torch.dtype, tuple[int, ...], Level, int, int]] = []
        for f in schema["fields"]:
            dtype = _dtype(f["dtype"])
            level = Level(f["level"])
            shape = (cap[_CAPS[level]], *[int(s) for s in f["shape"]])
            nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
            layout.append((str(f["name"]), dtype, shape, level, offset, nbytes))
            offset = _aligned(offset + nbytes)
        self.arena = torch.zeros(offset, dtype=torch.uint8, device=self.device)
        self.header = self.arena[: self.header_len * 8].view(torch.int64)
        self._views = {
            name: self.arena[off : off + nbytes].view(dtype).view(shape)
            for name, dtype, shape, _, off, nbytes in layout
        }
        self._levels = {name: level for name, _, _, level, _, _ in layout}
        self.names = tuple(self._views)
        # Host copy of the header: pinned on GPUs so reading it is one small copy.
        pin = self.device.type == "cuda"
        self._host_header = torch.zeros(self.header_len, dtype=torch.int64, pin_memory=pin)
        self.batch = Batch(device=self.device)
        d = self.batch.__dict__
        d["_cap"] = list(cap)
        d["_ncount"] = np.zeros(cap[0], dtype=np.int64)
        d["_ecount"] = np.zeros(cap[0], dtype=np.int64)
        self.rebind()

    @classmethod
    def like(cls, batch: Batch, num_systems: int, num_nodes: int, num_edges: int, device: Any = None) -> Frame:
        """A frame for ``batch``'s fields holding at most the given systems, atoms and edges."""
        schema = schema_of(batch, (num_systems, num_nodes, num_edges))
        return cls(schema, device if device is not None else batch.device)

    @property
    def nbytes(self) -> int:
        """Bytes one transfer moves."""
        return self.arena.numel()

    def rebind(self) -> None:
        """Point the batch's fields back at the arena.

        Code that receives a frame's batch may replace a field (``Batch.set_field`` stores a new
        tensor when a buffer is exactly full); the next receive must land in the arena again.
        """
        store, levels = self.batch._store, self.batch._level
        for name, view in self._views.items():
            store[name] = view
            levels[name] = self._levels[name]
        self.batch.__dict__["_views"] = {}

    def check_fields(self) -> None:
        """Raise when the batch holds a field the frame does not carry (it would be lost).

        Raises:
            PipelineError: Naming the fields; they appeared after the pipeline started.
        """
        extra = sorted(set(self.batch._store) - set(self.names))
        if extra:
            raise PipelineError(
                f"fields {extra} appeared in the active batch after the pipeline started, so the "
                "next rank would never receive them; create them before the run (e.g. in the "
                "integrator's setup() or in the input structures)"
            )

    def clear(self, zero: bool = True) -> None:
        """Empty the frame; the memory is kept.

        Args:
            zero: Also zero the arena (one pass), so no stale bytes of earlier transfers remain.
        """
        if zero:
            self.arena.zero_()
        self.batch._ncount[:] = 0
        self.batch._ecount[:] = 0
        self.batch.__dict__["_n"] = [0, 0, 0]
        self.batch.__dict__["_pending_defrag"] = None
        self.batch._touch()

    def stamp(self, flags: int) -> None:
        """Write the batch's counts and ``flags`` into the arena's header."""
        b = self.batch
        n = b.num_graphs
        h = self._host_header.numpy()
        h[:] = 0
        h[0], h[1], h[2], h[3] = n, b.num_nodes, b.num_edges, flags
        cap = self.capacity[0]
        h[HEADER_FIXED : HEADER_FIXED + n] = b.num_nodes_per_system
        h[HEADER_FIXED + cap : HEADER_FIXED + cap + n] = b.num_edges_per_system
        # A blocking copy: the host header is rewritten next iteration.
        self.header.copy_(self._host_header)

    def read(self) -> int:
        """Set the batch's counts from a received header; returns the flags.

        Raises:
            PipelineError: The header is inconsistent with the frame (the ranks disagree about
                the buffers, or the message was not a frame).
        """
        self._host_header.copy_(self.header)
        h = self._host_header.numpy()
        n, nodes, edges, flags = (int(x) for x in h[:HEADER_FIXED])
        cap = self.capacity
        nc = h[HEADER_FIXED : HEADER_FIXED + cap[0]]
        ec = h[HEADER_FIXED + cap[0] : HEADER_FIXED + 2 * cap[0]]
        if not (0 <= n <= cap[0] and 0 <= nodes <= cap[1] and 0 <= edges <= cap[2]) or (
            (nc < 0).any() or (ec < 0).any() or int(nc[:n].sum()) != nodes or int(ec[:n].sum()) != edges
        ):
            raise PipelineError(
                f"received a frame header ({n} systems, {nodes} atoms, {edges} edges) that does not "
                f"fit a buffer of {list(cap)}: the ranks' buffers differ"
            )
        self.rebind()
        self.batch._set_counts(n, nc, ec, exact=False)
        return flags

    def __repr__(self) -> str:
        return f"Frame(capacity={self.capacity}, fields={len(self.names)}, bytes={self.nbytes}, device={self.device})"


__all__ = [
    "FLAG_DONE",
    "FLAG_ERROR",
    "FLAG_SCHEMA",
    "HEADER_FIXED",
    "Frame",
    "decode_schema",
    "encode_schema",
    "schema_of",
]
