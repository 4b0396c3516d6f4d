"""How a pipeline rank moves systems: frames and their schemas, the active batch, overflow sinks.

``PipelineRank`` (``alchemi_core.dynamics.pipeline_rank``) follows the four-phase protocol; the
methods it routes systems with live here, under the seed's names: arrivals into the active
batch (``_recv_to_batch``, ``_buffer_to_batch``), graduates into the send frame
(``_batch_to_buffer``), what does not fit into overflow sinks and back (``_overflow_to_sinks``,
``_drain_sinks_to_batch``), and the schema exchange that shapes the frames.
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
from alchemi_core.dynamics.pipeline_salvage import IdLedger
from alchemi_core.dynamics.sinks import HostMemory
from alchemi_core.errors import CapacityError, ConfigurationError, PipelineError

if TYPE_CHECKING:
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


class RankRouting:
    """The routing half of a pipeline rank (see the module docstring); ``PipelineRank`` sets the
    state declared here."""

    stage: Any
    backend: CommBackend
    rank: int
    last: bool
    device: torch.device
    comm_mode: str
    buffer_config: BufferConfig | None
    engine: Engine
    overflow: list[DataSink]
    _own_overflow: DataSink | None
    send_frame: Frame | None
    recv_frame: Frame | None
    _in_flight: deque[tuple[Work, Frame]]
    _spare_frames: list[Frame]
    queue_depth: int
    max_in_flight: int
    _schema_sent: bool
    left: int
    staged: int
    held_back: int
    schema_renewals: int
    sent_ids: IdLedger
    received_ids: IdLedger

    # ------------------------------------------------------------------ frames and schemas
    def _frame_capacity(self) -> tuple[int, int, int]:
        cfg = self.buffer_config
        if cfg is not None:
            return cfg.num_systems, cfg.num_nodes, cfg.num_edges
        b = self.engine.state.batch
        assert b is not None
        return b.system_capacity, b.node_capacity, b.edge_capacity

    def _send_schema(self) -> None:
        # Frames in flight keep the old layout: let them go, and shape every frame anew.
        self._finish_send()
        self._spare_frames = []
        b = self.engine.state.batch
        if b is None:  # nothing will ever come: a header-only frame
            schema: dict[str, Any] = {"capacity": [0, 0, 0], "fields": []}
            self.send_frame = Frame(schema, self.device)
            active = [0, 0, 0]
        else:
            self.send_frame = Frame.like(b, *self._frame_capacity(), device=self.device)
            active = [b.system_capacity, b.node_capacity, b.edge_capacity]
        raw = encode_schema({"buffer": self.send_frame.schema, "active": active})
        dev = self.backend.device
        length = torch.tensor([raw.numel()], dtype=torch.long, device=dev)
        self.backend.isend_tensor(length, self.rank + 1).wait()
        self.backend.isend_tensor(raw.to(dev), self.rank + 1).wait()
        self._schema_sent = True

    def _recv_schema(self) -> dict[str, Any]:
        dev = self.backend.device
        length = torch.zeros(1, dtype=torch.long, device=dev)
        self.backend.irecv_tensor(length, self.rank - 1).wait()
        n = int(length[0])
        if n == SCHEMA_FAILED:
            raise PeerError(self._upstream_failure("before the pipeline started"), self.rank - 1)
        if n <= 0:
            raise PipelineError(f"received a buffer schema of {n} bytes from rank {self.rank - 1}")
        raw = torch.zeros(n, dtype=torch.uint8, device=dev)
        self.backend.irecv_tensor(raw, self.rank - 1).wait()
        schema = decode_schema(raw)
        if "buffer" not in schema or "active" not in schema:
            raise PipelineError("received a buffer schema without 'buffer' and 'active'")
        return schema

    def _upstream_failure(self, when: str) -> str:
        told = self.backend.peer_failure()
        return f"rank {self.rank - 1} reported a failure {when}" + (f": {told}" if told else "; see its log")

    def _notify_downstream(self) -> None:
        dst, dev = self.rank + 1, self.backend.device
        if not self._schema_sent or self.send_frame is None:
            notice = torch.full((1,), SCHEMA_FAILED, dtype=torch.long, device=dev)
        else:
            notice = torch.zeros_like(self.send_frame.arena)
            notice[: 8 * HEADER_FIXED].view(torch.int64)[3] = FLAG_ERROR
        self.backend.isend_tensor(notice, dst).wait(timeout_s=NOTICE_TIMEOUT_S)

    # ------------------------------------------------------------------ routing (the seed's names)
    def _recv_to_batch(self, incoming: Batch) -> None:
        """Route received systems (the receive frame's batch) into the active batch."""
        self.received_ids.record(incoming.system_id, incoming.num_graphs)
        self._buffer_to_batch(incoming)

    def _buffer_to_batch(self, incoming: Batch) -> None:
        """Add systems to the active batch; those that do not fit go to the overflow sinks."""
        batch = self.engine.state.batch
        assert batch is not None
        copied = self.engine.admission.admit(batch, incoming, partial=True)
        if copied < incoming.num_graphs:
            self._overflow_to_sinks(incoming, ~incoming._copied_mask)

    def _batch_to_buffer(self, mask: torch.Tensor) -> int:
        """Copy the systems of the active batch selected by ``mask`` into the send frame, as many
        as fit in order, and remove them from the active batch.

        Returns:
            How many were moved; the others stay, frozen, for a later iteration.

        Raises:
            CapacityError: The first selected system does not fit even an empty frame.
        """
        frame = self.send_frame
        assert frame is not None
        frame.clear()
        batch = self.engine.state.batch
        if batch is None or not batch.num_graphs:
            return 0
        host = mask.detach().to("cpu")  # the one read-back of this phase
        sel = np.nonzero(host.numpy())[0]
        if not len(sel):
            return 0
        sent = frame.batch.put(batch, host)
        frame.check_fields()
        if sent == 0:
            raise self._too_large(batch, int(sel[0]))
        self.sent_ids.record(frame.batch.system_id, sent)
        self.held_back += len(sel) - sent
        moved = np.zeros(batch.num_graphs, dtype=bool)
        moved[sel[:sent]] = True
        batch.defrag(torch.from_numpy(moved))
        self.engine.masks.update(batch)
        self.left += sent
        return sent

    def _renew_schema(self) -> None:
        """Fields appeared in the active batch after the schema went out (a hook, a model's
        stress): send an empty frame flagged ``FLAG_SCHEMA`` as this iteration's message, then a
        schema with them, and shape the send frame anew, so they travel on instead of being
        lost. One message per iteration still holds, so ``synchronized`` runs cannot deadlock."""
        assert self.send_frame is not None
        self.send_frame.clear()
        self.send_frame.stamp(FLAG_SCHEMA)
        self.backend.isend_tensor(self.send_frame.arena, self.rank + 1).wait()
        self._send_schema()
        self.schema_renewals += 1

    def _too_large(self, batch: Batch, row: int) -> CapacityError:
        sid = int(batch.system_id[row]) if "system_id" in batch else row
        cap = self.send_frame.capacity if self.send_frame is not None else (0, 0, 0)
        return CapacityError(
            f"rank {self.rank}: system {sid} ({int(batch.num_nodes_per_system[row])} atoms, "
            f"{int(batch.num_edges_per_system[row])} edges) does not fit the send buffer (systems, "
            f"atoms, edges = {tuple(cap)}); raise BufferConfig(num_nodes=..., num_edges=...) on "
            f"ranks {self.rank} and {self.rank + 1}"
        )

    def _overflow_sinks(self) -> list[DataSink]:
        if self.overflow:
            return self.overflow
        if self._own_overflow is None:
            self._own_overflow = HostMemory(capacity=None)
        return [self._own_overflow]

    def _overflow_to_sinks(self, batch: Batch, mask: torch.Tensor | None = None) -> None:
        """Stage systems in the overflow sinks, first sink with room first.

        Raises:
            CapacityError: Every overflow sink is full (what did not fit is named).
        """
        rows = np.arange(batch.num_graphs) if mask is None else np.nonzero(mask.cpu().numpy())[0]
        for sink in self._overflow_sinks():
            if not len(rows):
                return
            take, rows = rows[: sink.free], rows[sink.free :]
            if len(take):
                m = torch.zeros(batch.num_graphs, dtype=torch.bool)
                m[take] = True
                sink.write(batch, m.to(batch.device))
                self.staged += len(take)
        if len(rows):
            ids = batch.system_id[torch.as_tensor(rows, device=batch.device)].tolist() if "system_id" in batch else rows.tolist()
            raise CapacityError(
                f"rank {self.rank}: the overflow sinks are full; systems {ids[:10]} have nowhere to "
                "go. Give the stage a larger sink (or none: a HostMemory without limit is used)"
            )

    def _drain_sinks_to_batch(self) -> None:
        """Pull staged systems back into the active batch while there is room.

        Raises:
            CapacityError: A staged system does not fit even an empty active batch.
        """
        batch = self.engine.state.batch
        if batch is None:
            return
        for sink in self._overflow_sinks():
            if len(sink) == 0 or batch.num_graphs >= batch.system_capacity:
                continue
            was_empty = batch.num_graphs == 0
            staged = sink.drain().to(batch.device)
            copied = self.engine.admission.admit(batch, staged, partial=True)
            if copied < staged.num_graphs:
                sink.write(staged, ~staged._copied_mask)
                if copied == 0 and was_empty:
                    sid = int(staged.system_id[0]) if "system_id" in staged else 0
                    raise CapacityError(
                        f"rank {self.rank}: system {sid} ({staged.num_nodes_list[0]} atoms) does not fit "
                        f"the empty active batch ({batch.system_capacity} systems, {batch.node_capacity} "
                        f"atoms, {batch.edge_capacity} edges); give rank {self.rank - 1} a larger batch"
                    )

    # ------------------------------------------------------------------ sending
    def _send(self, flags: int) -> None:
        """Send the send frame. ``fully_async`` does not wait: the frame joins the queue of
        sends in flight and the next one is filled in a frame of its own, so this rank runs up
        to ``queue_depth`` exchanges ahead of its downstream neighbour before it waits for the
        oldest send."""
        frame = self.send_frame
        assert frame is not None
        frame.stamp(flags)
        work = self.backend.isend_tensor(frame.arena, self.rank + 1)
        if self.comm_mode != "fully_async":
            work.wait()
            return
        self._in_flight.append((work, frame))
        self.max_in_flight = max(self.max_in_flight, len(self._in_flight))
        while len(self._in_flight) >= self.queue_depth:
            oldest, reusable = self._in_flight.popleft()
            oldest.wait()
            self._spare_frames.append(reusable)
        # At most queue_depth + 1 frames are ever made, each once.
        self.send_frame = self._spare_frames.pop() if self._spare_frames else Frame(frame.schema, self.device)

    def _finish_send(self) -> None:
        """Wait for every send in flight (their frames become free again)."""
        while self._in_flight:
            work, frame = self._in_flight.popleft()
            work.wait()
            self._spare_frames.append(frame)
