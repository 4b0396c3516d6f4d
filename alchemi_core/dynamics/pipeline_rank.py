"""``PipelineRank``: one rank of a ``DistributedPipeline`` and the protocol it follows.

A rank owns the three buffer layers of the seed: the *active batch* its stage integrates, the
*transfer frames* to its neighbours (``send_buffer`` / ``recv_buffer``, allocated once), and
*overflow sinks* that stage received systems while the active batch is full. Each iteration it
follows four phases:

1. ``_prestep_sync_buffers``: finish the previous send (``fully_async``), post the receive of
   this iteration's frame (``sync``: and wait for it).
2. ``_complete_pending_recv``: wait for the frame (``async_recv``, ``fully_async``), pull staged
   systems back from the overflow sinks (oldest first), then admit the new arrivals; what does not
   fit goes to the overflow sinks.
3. ``step``: integrate until the next convergence/budget check (systems only graduate there).
4. ``_poststep_sync_buffers``: move graduated systems into the send frame, as many as fit; the
   rest stay in the active batch, frozen, until there is room (back-pressure); send the frame,
   even when empty, so the next rank's receive always completes. The last rank writes graduated
   systems to its stage's sinks instead.

Blocking: ``sync`` waits for the receive in phase 1 and for the send in phase 4; ``async_recv``
posts the receive in phase 1 and waits in phase 2, staging overflow systems meanwhile;
``fully_async`` also defers the wait for the send to the next iteration's phase 1. Every mode
admits systems in the same order, so results do not depend on the mode.

Frames are shaped once, from a schema the sender sends before the first one; if fields appear
in the active batch later (a hook, a model's stress), the sender sends a frame flagged
``FLAG_SCHEMA`` and a new schema, so they travel on.

A rank has finished when its upstream said so (the *done* flag of its last frame), its sampler is
drained and nothing is left in its active batch or overflow sinks; its last frame carries the done
flag, so ending needs no extra message. A rank that fails reports it through the backend and sends
an *error* frame downstream; see ``docs/pipelines.md``.

The routing methods (frames and schemas, overflow sinks) are ``pipeline_routing.RankRouting``.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.comm.base import CommBackend, PeerError, Work
from alchemi_core.comm.frame import FLAG_DONE, FLAG_ERROR, FLAG_SCHEMA, Frame
from alchemi_core.dynamics.pipeline_routing import (
    RankRouting,
    engine_for,
    stage_buffer_config,
    stage_comm_mode,
)
from alchemi_core.dynamics.pipeline_salvage import IdLedger, RankLostError, salvage
from alchemi_core.dynamics.weak import alive, ref_to
from alchemi_core.errors import PipelineError

if TYPE_CHECKING:
    from alchemi_core.data import Batch
    from alchemi_core.dynamics.sinks import DataSink



class PipelineRank(RankRouting):
    """The state and protocol of one pipeline rank (what the seed calls the communication mixin).

    Args:
        stage: The ``BaseDynamics`` or ``FusedStage`` this rank runs.
        backend: Transport to the neighbouring ranks (its ``rank`` is this rank).
        world_size: Number of ranks in the pipeline.
        synchronized: Add an all-reduce per iteration so every rank stops together (debugging).
        device: Where this rank's batch lives.
        queue_depth: ``fully_async``: sends in flight before this rank waits for the oldest.
    """

    def __init__(
        self,
        stage: Any,
        backend: CommBackend,
        world_size: int,
        synchronized: bool = False,
        device: torch.device | str = "cpu",
        queue_depth: int = 4,
    ) -> None:
        # Weakly: the stage holds its rank (read after a run); see dynamics.weak.
        self._stage = ref_to(stage)
        self.backend = backend
        self.rank = backend.rank
        self.world_size = world_size
        self.first = self.rank == 0
        self.last = self.rank == world_size - 1
        self.synchronized = bool(synchronized)
        self.device = torch.device(device)
        self.comm_mode = stage_comm_mode(stage)
        self.buffer_config = stage_buffer_config(stage)
        self.engine = engine_for(stage, self.last)
        #: Overflow sinks in priority order: a non-last stage's own sinks, else a HostMemory.
        self.overflow: list[DataSink] = [] if self.last else list(stage.sinks)
        self._own_overflow: DataSink | None = None
        self.send_frame: Frame | None = None
        self.recv_frame: Frame | None = None
        self._pending_recv: Work | None = None
        self.queue_depth = max(1, int(queue_depth))
        self._in_flight: deque[tuple[Work, Frame]] = deque()  # fully_async: sends not waited yet
        self._spare_frames: list[Frame] = []
        #: Most sends in flight at once, and iterations whose arrivals waited for a later check.
        self.max_in_flight = self.deferred = 0
        self._incoming_flags = 0
        self._drained = False
        self._schema_sent = False
        self.upstream_done = self.first
        self.sent_done = False
        #: Systems received from the previous rank.
        self.received = 0
        #: Systems passed on (to the next rank or, on the last, to the sinks).
        self.left = 0
        #: Systems staged in the overflow sinks because the active batch was full.
        self.staged = 0
        #: Graduated systems that waited an iteration because the send frame was full.
        self.held_back = 0
        self.iterations = 0
        #: Passes of ``run``'s loop (with ``synchronized``, equal on every rank: one all-reduce each).
        self.rounds = 0
        #: Schemas sent or received after setup, because fields appeared mid-run.
        self.schema_renewals = 0
        #: Ids sent downstream and received from upstream; after a peer failure, what was saved and lost.
        self.sent_ids, self.received_ids = IdLedger(self.device), IdLedger(self.device)
        self.lost_error: RankLostError | None = None
        stage._engine = self.engine
        stage._pipeline_rank = self

    # ------------------------------------------------------------------ views
    @property
    def stage(self) -> Any:
        """The ``BaseDynamics`` or ``FusedStage`` this rank runs."""
        return alive(self._stage, "stage", holder="pipeline rank")

    @property
    def active_batch(self) -> Batch | None:
        """The systems this rank integrates."""
        return self.engine.state.batch

    @property
    def send_buffer(self) -> Batch | None:
        """The batch view of the send frame."""
        return self.send_frame.batch if self.send_frame is not None else None

    @property
    def recv_buffer(self) -> Batch | None:
        """The batch view of the receive frame."""
        return self.recv_frame.batch if self.recv_frame is not None else None

    @property
    def entered(self) -> int:
        """Systems that came into this rank: initial batch, sampler refills and receipts."""
        return self.engine.state.loaded_count + self.received

    # ------------------------------------------------------------------ setup
    def setup(self, batch: Batch | None) -> None:
        """Prepare the active batch and agree on frame layouts with the neighbours.

        The first rank prepares ``batch`` (or its sampler's first batch); every other rank
        receives the previous rank's frame schema and starts with an empty active batch of the
        same fields. Each non-last rank then sends its own schema downstream.

        A first rank with neither a batch nor a sampler warns and passes nothing on.
        """
        engine = self.engine
        if self.first:
            if batch is None and engine.state.sampler is None:
                # The seed's own example runs a pipeline this way; it does nothing, but says so.
                warnings.warn(
                    "the first pipeline stage got no batch and has no sampler, so the pipeline has "
                    "nothing to do: pass a batch to pipeline.run(batch) on rank 0 or give the first "
                    "stage a sampler",
                    stacklevel=2,
                )
            else:
                if batch is None:  # the sampler's first batch, on this rank's device like refills
                    assert engine.state.sampler is not None
                    batch = engine.state.sampler.build_initial_batch()
                engine.prepare(batch.to(self.device))
        else:
            schema = self._recv_schema()
            self.recv_frame = Frame(schema["buffer"], self.device)
            if self.recv_frame.names:
                active = [max(a, b) for a, b in zip(schema["active"], self.recv_frame.capacity)]
                engine.prepare_empty(self.recv_frame.batch, num_systems=active[0], num_nodes=active[1], num_edges=active[2])
        if not self.last:
            self._send_schema()
        engine.start_hooks()

    # ------------------------------------------------------------------ the four phases
    def _prestep_sync_buffers(self) -> None:
        """Post this iteration's receive (``fully_async``: unless an earlier one is still pending)."""
        if self.upstream_done or self.recv_frame is None:
            return
        if self._pending_recv is None:
            self.recv_frame.rebind()
            self._pending_recv = self.backend.irecv_tensor(self.recv_frame.arena, self.rank - 1)
        if self.comm_mode == "sync":
            self._wait_recv()
        else:
            # The frame is in flight: stage overflow systems back in meanwhile.
            self._drain_sinks_to_batch()
            self._drained = True

    def _wait_recv(self) -> None:
        work, self._pending_recv = self._pending_recv, None
        assert work is not None and self.recv_frame is not None
        work.wait()
        flags = self.recv_frame.read()
        if flags & FLAG_ERROR:
            raise PeerError(self._upstream_failure("and stopped"), self.rank - 1)
        if flags & FLAG_SCHEMA:  # the upstream's fields changed: its next frames are shaped anew
            self.recv_frame = Frame(self._recv_schema()["buffer"], self.device)
            self.schema_renewals += 1
        self._incoming_flags = flags

    def _complete_pending_recv(self) -> None:
        """Finish the receive, drain overflow sinks back, then admit the new arrivals.

        ``fully_async``: when the frame has not come yet and this rank has systems to integrate,
        it does not wait: the receive stays posted, and the arrivals are admitted at a later
        check step, this rank's own, once they are there."""
        if self._pending_recv is not None:
            batch = self.engine.state.batch
            busy = batch is not None and batch.num_graphs > 0
            if self.comm_mode == "fully_async" and busy and not self._pending_recv.done():
                self.deferred += 1
                if not self._drained:
                    self._drain_sinks_to_batch()
                self._drained = False
                return
            self._wait_recv()
        if not self._drained:
            self._drain_sinks_to_batch()
        self._drained = False
        flags, self._incoming_flags = self._incoming_flags, 0
        frame = self.recv_frame
        if frame is not None and frame.batch.num_graphs:
            self.received += frame.batch.num_graphs
            self._recv_to_batch(frame.batch)
            frame.clear(zero=False)
        if flags & FLAG_DONE:
            self.upstream_done = True

    def step(self) -> None:
        """Integrate the active batch up to and including the next check step (systems graduate
        only at checks, so nothing could be sent earlier); refill an empty first rank."""
        engine = self.engine
        batch = engine.state.batch
        if batch is None:
            return
        if not batch.num_graphs and engine.state.sampler is not None and not engine.state.sampler.exhausted:
            engine.admission.refill(batch)
        if not batch.num_graphs:
            return
        interval = max(1, engine.state.check_interval)
        while True:
            k = engine.state.step_count
            engine.step()
            if k % interval == 0:
                return

    def _poststep_sync_buffers(self, converged_indices: torch.Tensor | Sequence[int] | None = None) -> None:
        """Send graduated systems downstream (the last rank writes them to its sinks).

        Args:
            converged_indices: Rows of the active batch to send; default every graduated system.
        """
        engine = self.engine
        batch = engine.state.batch
        if self.last:
            if batch is not None and batch.num_graphs:
                if converged_indices is None:
                    rows = np.nonzero(engine.state.graduated_mask().cpu().numpy())[0]
                else:
                    rows = np.asarray(torch.as_tensor(converged_indices).cpu(), dtype=np.int64).reshape(-1)
                if len(rows):
                    engine.admission.write_to_sinks(batch, rows)
                    engine.masks.update(batch)
            self.left = engine.state.written_count
            return
        if self.sent_done:
            return
        assert self.send_frame is not None
        if batch is not None and batch.num_graphs and not set(batch.keys()) <= set(self.send_frame.names):
            self._renew_schema()  # this iteration's message; graduates go in the next one
            return
        if batch is not None and batch.num_graphs:
            if converged_indices is None:
                mask = engine.state.graduated_mask()
            else:
                mask = torch.zeros(batch.num_graphs, dtype=torch.bool)
                mask[torch.as_tensor(converged_indices, dtype=torch.long).cpu()] = True
            self._batch_to_buffer(mask)
        else:
            self.send_frame.clear()
        finished = self.finished()
        self._send(FLAG_DONE if finished else 0)
        self.sent_done = finished

    # ------------------------------------------------------------------ running
    def finished(self) -> bool:
        """Upstream is done, the sampler drained, the active batch and overflow sinks empty."""
        engine = self.engine
        if not self.upstream_done:
            return False
        if engine.state.sampler is not None and not engine.state.sampler.exhausted:
            return False
        if engine.state.batch is not None and engine.state.batch.num_graphs:
            return False
        return all(len(s) == 0 for s in self._overflow_sinks())

    def iterate(self) -> None:
        """One pipeline iteration: the four phases."""
        self._prestep_sync_buffers()
        self._complete_pending_recv()
        self.step()
        self._poststep_sync_buffers()
        self.iterations += 1

    def ready_to_stop(self) -> bool:
        """Finished, and (unless last) the done flag has gone downstream."""
        return self.finished() and (self.last or self.sent_done)

    def run(self) -> Batch | None:
        """Iterate until this rank is finished (its own process), then wait for the others.

        Raises:
            PeerError: Another rank failed or went away.
        """
        backend = self.backend
        try:
            while True:
                self.rounds += 1
                done = self.ready_to_stop()
                if self.synchronized:
                    if backend.all_reduce_max(0 if done else 1) == 0:
                        break
                    if done:
                        continue
                elif done:
                    break
                self.iterate()
                backend.heartbeat()
            self.close()
            backend.finish()
        except BaseException as exc:
            self.fail(exc)
            if self.lost_error is not None:
                raise self.lost_error from exc
            raise
        return self.result()

    def close(self) -> None:
        """Finish the pending send, run the hooks' end, and check that nothing was lost.

        Raises:
            PipelineError: This rank took in more systems than it passed on.
        """
        self._finish_send()
        self.engine.end_hooks()
        if self.finished() and self.entered != self.left:
            raise PipelineError(
                f"rank {self.rank} took in {self.entered} systems but passed on {self.left}: a system was lost"
            )

    def fail(self, exc: BaseException) -> None:
        """Report ``exc`` to the other ranks, drop pending transfers and abort the backend
        (never raises).

        The failure is recorded through the backend (the first record wins, so the origin's
        message stays); every failing rank sends an error frame downstream unless that link is
        the one that broke. The backend is
        unusable afterwards (its links hold unmatched messages); make a new one.
        """
        lost = exc.peer if isinstance(exc, PeerError) else None
        if isinstance(exc, PeerError):
            self.lost_error = self.lost_error or salvage(self, exc)
            # Recorded only if nobody did yet (a killed or hung peer reports nothing itself), so
            # ranks that no longer talk to the lost one learn of it too.
            self.backend.notify_failure(f"rank {self.rank} stopped: {exc}", lost)
        else:
            name = getattr(self.stage, "name", type(self.stage).__name__)
            self.backend.notify_failure(f"rank {self.rank} ({name}) failed: {type(exc).__name__}: {exc}")
        if not self.last and lost != self.rank + 1 and not self.sent_done:
            try:
                self._notify_downstream()
            except Exception:  # the link may be gone too; peers then see it close
                pass
        self._in_flight.clear()
        self._pending_recv = None
        try:
            self.engine.end_hooks()
        except Exception:
            pass
        # The links hold unmatched messages now: leave the group so peers see it close at once.
        try:
            self.backend.abort()
        except Exception:
            pass

    def result(self) -> Batch | None:
        """On the last rank without sinks, every finished system; else None."""
        engine = self.engine
        if not self.last or engine.state.sinks:
            return None
        held = engine.state.host_results
        return held.drain() if held is not None and len(held) else None

    def __repr__(self) -> str:
        return (
            f"PipelineRank(rank={self.rank}/{self.world_size}, mode={self.comm_mode!r}, "
            f"entered={self.entered}, left={self.left}, iterations={self.iterations})"
        )


__all__ = ["PipelineRank", "engine_for", "stage_buffer_config", "stage_comm_mode"]
