"""The communication-backend interface ``DistributedPipeline`` uses between ranks.

A backend moves pre-allocated ``Batch`` buffers point to point. A transfer is a fixed-size
header (``int64``: counts, flags and per-system sizes) followed by every field's whole buffer,
so a receive can be posted before the sender knows what it will send, and an empty transfer
costs the same as a full one: the receiver never waits on a message that does not come. Before
the first transfer, the sender tells the receiver the buffer's schema (field names, dtypes,
shapes, capacities) as JSON bytes: data, never code.

Example (two threads in one process)::

    from alchemi_core.comm.inprocess import InProcessBackend
    group = InProcessBackend.group(world_size=2)   # one backend per rank
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
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


class Work(ABC):
    """A pending transfer."""

    @abstractmethod
    def wait(self) -> None:
        """Block until the transfer completed (raises PipelineError on failure or timeout)."""


class DoneWork(Work):
    """A transfer that already completed."""

    def wait(self) -> None:
        return None


class CommBackend(ABC):
    """Point-to-point transport of batch buffers between ranks, plus a flag reduction."""

    name = "base"

    @property
    @abstractmethod
    def rank(self) -> int: ...

    @property
    @abstractmethod
    def world_size(self) -> int: ...

    @property
    def device(self) -> torch.device:
        """The device tensors must be on for this backend."""
        return torch.device("cpu")

    def init(self) -> None:
        """Join the group (idempotent)."""

    def shutdown(self) -> None:
        """Leave the group."""

    @abstractmethod
    def isend_tensor(self, tensor: torch.Tensor, dst: int) -> Work:
        """Start sending a contiguous tensor to ``dst``."""

    @abstractmethod
    def irecv_tensor(self, tensor: torch.Tensor, src: int) -> Work:
        """Start receiving into a contiguous tensor from ``src``."""

    @abstractmethod
    def all_reduce_max(self, value: int) -> int:
        """The largest ``value`` over all ranks (blocks until every rank calls it)."""

    def all_reduce_sum(self, value: int) -> int:
        """The sum of ``value`` over all ranks (default: built from gathering maxima)."""
        raise NotImplementedError

    @abstractmethod
    def barrier(self) -> None:
        """Wait for every rank."""


# ---------------------------------------------------------------------- schema and framing
def schema_of(batch: Batch) -> dict[str, Any]:
    """The JSON-able description a receiver needs to allocate a matching buffer."""
    return {
        "capacity": [batch.system_capacity, batch.node_capacity, batch.edge_capacity],
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


def empty_from_schema(schema: dict[str, Any], device: torch.device) -> Batch:
    """A zeroed buffer matching ``schema`` (no code is run from the schema)."""
    out = Batch(device=device)
    cap = [int(c) for c in schema["capacity"]]
    caps = {Level.SYSTEM: cap[0], Level.NODE: cap[1], Level.EDGE: cap[2]}
    for f in schema["fields"]:
        dtype = getattr(torch, str(f["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise PipelineError(f"received a schema with unknown dtype {f['dtype']!r}")
        level = Level(f["level"])
        out._store[str(f["name"])] = torch.zeros((caps[level], *[int(s) for s in f["shape"]]), dtype=dtype, device=device)
        out._level[str(f["name"])] = level
    out.__dict__["_cap"] = cap
    out.__dict__["_ncount"] = np.zeros(cap[0], dtype=np.int64)
    out.__dict__["_ecount"] = np.zeros(cap[0], dtype=np.int64)
    out._touch()
    return out


def encode_schema(schema: dict[str, Any]) -> torch.Tensor:
    raw = json.dumps(schema, sort_keys=True).encode()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def decode_schema(raw: torch.Tensor) -> dict[str, Any]:
    return json.loads(bytes(raw.cpu().numpy().tobytes()).decode())


def header_size(batch: Batch) -> int:
    return HEADER_FIXED + 2 * batch.system_capacity


def write_header(batch: Batch, header: torch.Tensor, flags: int) -> None:
    """Fill ``header`` (host int64) with the buffer's counts and ``flags``."""
    n = batch.num_graphs
    h = header.numpy()
    h[:] = 0
    h[0], h[1], h[2], h[3] = n, batch.num_nodes, batch.num_edges, flags
    cap = batch.system_capacity
    h[HEADER_FIXED : HEADER_FIXED + n] = batch.num_nodes_per_system
    h[HEADER_FIXED + cap : HEADER_FIXED + cap + n] = batch.num_edges_per_system


def apply_header(batch: Batch, header: torch.Tensor) -> int:
    """Set the buffer's counts from a received header; returns the flags."""
    h = header.cpu().numpy()
    n, flags = int(h[0]), int(h[3])
    cap = batch.system_capacity
    if n > cap:
        raise PipelineError(f"received {n} systems for a buffer of {cap}: the ranks' BufferConfigs differ")
    ncount = np.zeros(cap, dtype=np.int64)
    ecount = np.zeros(cap, dtype=np.int64)
    ncount[:n] = h[HEADER_FIXED : HEADER_FIXED + n]
    ecount[:n] = h[HEADER_FIXED + cap : HEADER_FIXED + cap + n]
    batch._set_counts(n, ncount, ecount, exact=False)
    return flags
