"""Where a pipeline rank's systems are outside its active batch: frames and overflow sinks.

A :class:`RankLink` holds a rank's send and receive frames (allocated once, shaped from a schema
the sender sends before the first frame and again when fields appear), the receive it has
posted, and in ``fully_async`` the sends still in flight. :class:`Overflow` holds what the rank
received while its active batch was full. ``PipelineRank`` (``alchemi_core.dynamics.pipeline_rank``)
holds one of each and follows the protocol.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.comm.base import CommBackend, PeerError, Work
from alchemi_core.comm.frame import FLAG_ERROR, FLAG_SCHEMA, HEADER_FIXED, Frame, decode_schema, encode_schema
from alchemi_core.dynamics.base import BufferConfig
from alchemi_core.dynamics.engine import Engine
from alchemi_core.dynamics.fused import FusedStage
from alchemi_core.dynamics.sinks import HostMemory
from alchemi_core.errors import CapacityError, ConfigurationError, PipelineError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from alchemi_core.data import Batch
    from alchemi_core.dynamics.sinks import DataSink

#: Sent instead of a schema length when the sender failed before its first frame.
SCHEMA_FAILED = -1
#: Longest wait for the downstream rank to take a failure notice, in seconds.
NOTICE_TIMEOUT_S = 10.0


def stage_comm_mode(stage: Any) -> str:
    """A stage's ``comm_mode`` (a fused stage's is its first sub-stage's)."""
    if isinstance(stage, FusedStage):
        return stage.stages[0].comm_mode
    return stage.comm_mode


def stage_buffer_config(stage: Any) -> BufferConfig | None:
    """A stage's ``BufferConfig`` (a fused stage's sub-stages must agree)."""
    if isinstance(stage, FusedStage):
        cfgs = {s.buffer_config for s in stage.stages if s.buffer_config is not None}
        if len(cfgs) > 1:
            raise ConfigurationError("the sub-stages of a FusedStage in a pipeline give different BufferConfigs")
        return next(iter(cfgs), None)
    return stage.buffer_config


def engine_for(stage: Any, last: bool) -> Engine:
    """An engine for ``stage`` on a pipeline rank: systems graduate on budget or convergence;
    only the last rank writes graduates to the stage's sinks (the others pass them on)."""
    if isinstance(stage, FusedStage):
        subs, entry, exit_, hooks = stage.sub_stages, stage.entry_status, stage.exit_status, stage.hooks
    else:
        subs, entry, exit_, hooks = [(0, stage)], 0, 1, []
    engine = Engine(
        subs, entry_status=entry, exit_status=exit_, sinks=stage.sinks if last else (), sampler=stage.sampler,
        refill_frequency=stage.refill_frequency, graduate_on_budget=True, owner=stage, hooks=hooks,
    )
    engine.state.graduate_to_sinks = last
    return engine


class RankLink:
    """The frames and transfers of pipeline rank ``rank`` (see the module docstring).

    Args:
        backend: Transport to the neighbouring ranks.
        device: Where the frames live.
        comm_mode: ``"sync"``, ``"async_recv"`` or ``"fully_async"``.
        queue_depth: ``fully_async``: sends in flight before the rank waits for the oldest.
    """

    def __init__(self, backend: CommBackend, device: torch.device, comm_mode: str, queue_depth: int) -> None:
        self.backend, self.rank, self.device = backend, backend.rank, device
        self.comm_mode, self.queue_depth = comm_mode, max(1, int(queue_depth))
        self.send_frame: Frame | None = None
        self.recv_frame: Frame | None = None
        self.pending_recv: Work | None = None
        self.in_flight: deque[tuple[Work, Frame]] = deque()  # fully_async: sends not waited yet
        self.spare_frames: list[Frame] = []
        self.schema_sent = False
        #: Most sends in flight at once.
        self.max_in_flight = 0
        #: Schemas sent or received after setup, because fields appeared mid-run.
        self.schema_renewals = 0

    # ------------------------------------------------------------------ schemas
    def send_schema(self, batch: Batch | None, capacity: tuple[int, int, int] | None) -> None:
        """Shape the send frame like ``batch`` (``capacity``: the BufferConfig's, else the
        batch's) and send its schema downstream."""
        # Frames in flight keep the old layout: let them go, and shape every frame anew.
        self.finish_send()
        self.spare_frames = []
        if batch is None:  # nothing will ever come: a header-only frame
            schema: dict[str, Any] = {"capacity": [0, 0, 0], "fields": []}
            self.send_frame = Frame(schema, self.device)
            active = [0, 0, 0]
        else:
            active = [batch.system_capacity, batch.node_capacity, batch.edge_capacity]
            systems, nodes, edges = capacity or active
            self.send_frame = Frame.like(batch, systems, nodes, edges, device=self.device)
        raw = encode_schema({"buffer": self.send_frame.schema, "active": active})
        dev = self.backend.device
        length = torch.tensor([raw.numel()], dtype=torch.long, device=dev)
        self.backend.isend_tensor(length, self.rank + 1).wait()
        self.backend.isend_tensor(raw.to(dev), self.rank + 1).wait()
        self.schema_sent = True

    def recv_schema(self) -> dict[str, Any]:
        """The upstream rank's schema (``buffer``: its send frame's, ``active``: its batch's capacities)."""
        dev = self.backend.device
        length = torch.zeros(1, dtype=torch.long, device=dev)
        self.backend.irecv_tensor(length, self.rank - 1).wait()
        n = int(length[0])
        if n == SCHEMA_FAILED:
            raise PeerError(self.upstream_failure("before the pipeline started"), self.rank - 1)
        if n <= 0:
            raise PipelineError(f"received a buffer schema of {n} bytes from rank {self.rank - 1}")
        raw = torch.zeros(n, dtype=torch.uint8, device=dev)
        self.backend.irecv_tensor(raw, self.rank - 1).wait()
        schema = decode_schema(raw)
        if "buffer" not in schema or "active" not in schema:
            raise PipelineError("received a buffer schema without 'buffer' and 'active'")
        return schema

    def open_recv(self) -> tuple[Frame, list[int]]:
        """Receive the upstream's schema: the receive frame shaped by it, and the capacities
        (systems, atoms, edges) the active batch needs."""
        schema = self.recv_schema()
        frame = self.recv_frame = Frame(schema["buffer"], self.device)
        return frame, [max(a, b) for a, b in zip(schema["active"], frame.capacity, strict=True)]

    def renew_schema(self, batch: Batch, capacity: tuple[int, int, int] | None) -> None:
        """Fields appeared in the active batch after the schema went out (a hook, a model's
        stress): send an empty frame flagged ``FLAG_SCHEMA`` as this iteration's message, then a
        schema with them, so they travel on instead of being lost. One message per iteration
        still holds, so ``synchronized`` runs cannot deadlock."""
        assert self.send_frame is not None
        self.send_frame.clear()
        self.send_frame.stamp(FLAG_SCHEMA)
        self.backend.isend_tensor(self.send_frame.arena, self.rank + 1).wait()
        self.send_schema(batch, capacity)
        self.schema_renewals += 1

    # ------------------------------------------------------------------ receiving
    def post_recv(self) -> None:
        """Post the receive of the next frame (unless one is pending)."""
        if self.pending_recv is None:
            assert self.recv_frame is not None
            self.recv_frame.rebind()
            self.pending_recv = self.backend.irecv_tensor(self.recv_frame.arena, self.rank - 1)

    def wait_recv(self) -> int:
        """Wait for the posted receive; its frame's flags (a schema renewal is taken in here).

        Raises:
            PeerError: The upstream rank sent an error frame.
        """
        work, self.pending_recv = self.pending_recv, None
        assert work is not None and self.recv_frame is not None
        work.wait()
        flags = self.recv_frame.read()
        if flags & FLAG_ERROR:
            raise PeerError(self.upstream_failure("and stopped"), self.rank - 1)
        if flags & FLAG_SCHEMA:  # the upstream's fields changed: its next frames are shaped anew
            self.recv_frame = Frame(self.recv_schema()["buffer"], self.device)
            self.schema_renewals += 1
        return flags

    def upstream_failure(self, when: str) -> str:
        told = self.backend.peer_failure()
        return f"rank {self.rank - 1} reported a failure {when}" + (f": {told}" if told else "; see its log")

    # ------------------------------------------------------------------ sending
    def send(self, flags: int) -> None:
        """Send the send frame. ``fully_async`` does not wait: the frame joins the queue of
        sends in flight and the next one is filled in a frame of its own, so the rank runs up
        to ``queue_depth`` exchanges ahead of its downstream neighbour before it waits for the
        oldest send."""
        frame = self.send_frame
        assert frame is not None
        frame.stamp(flags)
        work = self.backend.isend_tensor(frame.arena, self.rank + 1)
        if self.comm_mode != "fully_async":
            work.wait()
            return
        self.in_flight.append((work, frame))
        self.max_in_flight = max(self.max_in_flight, len(self.in_flight))
        while len(self.in_flight) >= self.queue_depth:
            oldest, reusable = self.in_flight.popleft()
            oldest.wait()
            self.spare_frames.append(reusable)
        # At most queue_depth + 1 frames are ever made, each once.
        self.send_frame = self.spare_frames.pop() if self.spare_frames else Frame(frame.schema, self.device)

    def finish_send(self) -> None:
        """Wait for every send in flight (their frames become free again)."""
        while self.in_flight:
            work, frame = self.in_flight.popleft()
            work.wait()
            self.spare_frames.append(frame)

    def too_large(self, batch: Batch, row: int) -> CapacityError:
        """The error for system ``row`` of ``batch``, which does not fit even an empty send frame."""
        sid = int(batch.system_id[row]) if "system_id" in batch else row
        cap = self.send_frame.capacity if self.send_frame is not None else (0, 0, 0)
        return CapacityError(
            f"rank {self.rank}: system {sid} ({int(batch.num_nodes_per_system[row])} atoms, "
            f"{int(batch.num_edges_per_system[row])} edges) does not fit the send buffer (systems, "
            f"atoms, edges = {tuple(cap)}); raise BufferConfig(num_nodes=..., num_edges=...) on "
            f"ranks {self.rank} and {self.rank + 1}"
        )

    def notify_downstream(self) -> None:
        """Send an error frame (before the first schema: a failed schema length) downstream."""
        dst, dev = self.rank + 1, self.backend.device
        if not self.schema_sent or self.send_frame is None:
            notice = torch.full((1,), SCHEMA_FAILED, dtype=torch.long, device=dev)
        else:
            notice = torch.zeros_like(self.send_frame.arena)
            notice[: 8 * HEADER_FIXED].view(torch.int64)[3] = FLAG_ERROR
        self.backend.isend_tensor(notice, dst).wait(timeout_s=NOTICE_TIMEOUT_S)

    def drop(self) -> None:
        """Forget pending transfers (after a failure)."""
        self.in_flight.clear()
        self.pending_recv = None


class Overflow:
    """Where rank ``rank`` stages received systems while its active batch is full: its stage's
    sinks in priority order (a non-last stage's), else a ``HostMemory`` without limit of its own.
    """

    def __init__(self, sinks: Sequence[DataSink], rank: int) -> None:
        self.sinks, self.rank = list(sinks), rank
        self.own: HostMemory | None = None

    def all(self) -> list[DataSink]:
        """The overflow sinks, first with room first."""
        if self.sinks:
            return self.sinks
        if self.own is None:
            self.own = HostMemory(capacity=None)
        return [self.own]

    def stage(self, batch: Batch, mask: torch.Tensor | None = None) -> int:
        """Write the systems of ``batch`` where ``mask`` (all when None), first sink with room
        first; how many.

        Raises:
            CapacityError: Every overflow sink is full (what did not fit is named).
        """
        rows = np.arange(batch.num_graphs) if mask is None else np.nonzero(mask.cpu().numpy())[0]
        staged = 0
        for sink in self.all():
            if not len(rows):
                return staged
            take, rows = rows[: sink.free], rows[sink.free :]
            if len(take):
                m = torch.zeros(batch.num_graphs, dtype=torch.bool)
                m[take] = True
                sink.write(batch, m.to(batch.device))
                staged += len(take)
        if len(rows):
            ids = batch.system_id[torch.as_tensor(rows, device=batch.device)].tolist() if "system_id" in batch else rows.tolist()
            raise CapacityError(
                f"rank {self.rank}: the overflow sinks are full; systems {ids[:10]} have nowhere to "
                "go. Give the stage a larger sink (or none: a HostMemory without limit is used)"
            )
        return staged

    def drain_into(self, engine: Engine) -> None:
        """Pull staged systems back into ``engine``'s active batch while there is room.

        Raises:
            CapacityError: A staged system does not fit even an empty active batch.
        """
        batch = engine.state.batch
        if batch is None:
            return
        for sink in self.all():
            if len(sink) == 0 or batch.num_graphs >= batch.system_capacity:
                continue
            was_empty = batch.num_graphs == 0
            staged = sink.drain().to(batch.device)
            copied = engine.admission.admit(batch, staged, partial=True)
            if copied < staged.num_graphs:
                sink.write(staged, ~staged._copied_mask)
                if copied == 0 and was_empty:
                    sid = int(staged.system_id[0]) if "system_id" in staged else 0
                    raise CapacityError(
                        f"rank {self.rank}: system {sid} ({staged.num_nodes_list[0]} atoms) does not fit "
                        f"the empty active batch ({batch.system_capacity} systems, {batch.node_capacity} "
                        f"atoms, {batch.edge_capacity} edges); give rank {self.rank - 1} a larger batch"
                    )
