"""``PipelineRank``: one rank of a ``DistributedPipeline`` and the protocol it follows.

A rank owns the three buffer layers of the seed: the *active batch* its stage integrates, the
*transfer frames* to its neighbours (``send_buffer`` / ``recv_buffer``, a
:class:`~alchemi_core.dynamics.pipeline_link.RankLink`) and the *overflow sinks* that stage
received systems while the active batch is full. Each iteration follows four phases:

1. ``_prestep_sync_buffers``: post the receive of this iteration's frame (``sync``: and wait).
2. ``_complete_pending_recv``: wait for the frame, pull staged systems back from the overflow
   sinks, then admit the arrivals; what does not fit goes to the overflow sinks.
3. ``step``: integrate until the next convergence/budget check (systems only graduate there).
4. ``_poststep_sync_buffers``: move graduated systems into the send frame, as many as fit (the
   rest wait, frozen: back-pressure), and send it, even when empty, so the next rank's receive
   always completes. The last rank writes graduated systems to its stage's sinks instead.

The comm modes differ only in where they wait, so results do not depend on them. A rank has
finished when its upstream said so (the *done* flag of its last frame), its sampler is drained
and nothing is left in its active batch or overflow sinks. See ``docs/pipelines.md``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.comm.base import CommBackend, PeerError
from alchemi_core.comm.frame import FLAG_DONE
from alchemi_core.dynamics.pipeline_link import Overflow, RankLink, engine_for, stage_buffer_config, stage_comm_mode
from alchemi_core.dynamics.pipeline_salvage import IdLedger, RankLostError, salvage
from alchemi_core.dynamics.weak import alive, ref_to
from alchemi_core.errors import PipelineError

if TYPE_CHECKING:
    from alchemi_core.data import Batch


class PipelineRank:
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
        self.buffer_config = cfg = stage_buffer_config(stage)
        #: The send frames' capacities (None: the active batch's).
        self._capacity = None if cfg is None else (cfg.num_systems, cfg.num_nodes, cfg.num_edges)
        self.link = RankLink(backend, self.device, self.comm_mode, queue_depth)
        self.engine = engine_for(stage, self.last)
        self.overflow = Overflow([] if self.last else stage.sinks, self.rank)
        #: Iterations whose arrivals waited for a later check.
        self.deferred = 0
        self._incoming_flags = 0
        self._drained = False
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
        return self.link.send_frame.batch if self.link.send_frame is not None else None

    @property
    def recv_buffer(self) -> Batch | None:
        """The batch view of the receive frame."""
        return self.link.recv_frame.batch if self.link.recv_frame is not None else None

    @property
    def entered(self) -> int:
        """Systems that came into this rank: initial batch, sampler refills and receipts."""
        return self.engine.state.loaded_count + self.received

    # ------------------------------------------------------------------ setup
    def setup(self, batch: Batch | None) -> None:
        """Prepare the active batch and agree on frame layouts with the neighbours: the first rank
        prepares ``batch`` (or its sampler's first batch; with neither it warns and passes nothing
        on), every other rank an empty batch of the fields of the upstream's schema; each non-last
        rank then sends its own schema downstream."""
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
            frame, active = self.link.open_recv()
            if frame.names:
                engine.prepare_empty(frame.batch, num_systems=active[0], num_nodes=active[1], num_edges=active[2])
        if not self.last:
            self.link.send_schema(engine.state.batch, self._capacity)
        engine.start_hooks()

    # ------------------------------------------------------------------ the four phases
    def _prestep_sync_buffers(self) -> None:
        """Post this iteration's receive (``fully_async``: unless an earlier one is still pending)."""
        if self.upstream_done or self.link.recv_frame is None:
            return
        self.link.post_recv()
        if self.comm_mode == "sync":
            self._incoming_flags = self.link.wait_recv()
        else:
            # The frame is in flight: stage overflow systems back in meanwhile.
            self._drain_sinks_to_batch()
            self._drained = True

    def _complete_pending_recv(self) -> None:
        """Finish the receive, drain overflow sinks back, then admit the new arrivals.

        ``fully_async``: when the frame has not come yet and this rank has systems to integrate,
        it does not wait: the receive stays posted, and the arrivals are admitted at a later
        check step, this rank's own, once they are there."""
        pending = self.link.pending_recv
        if pending is not None:
            batch = self.engine.state.batch
            busy = batch is not None and batch.num_graphs > 0
            if self.comm_mode == "fully_async" and busy and not pending.done():
                self.deferred += 1
                if not self._drained:
                    self._drain_sinks_to_batch()
                self._drained = False
                return
            self._incoming_flags = self.link.wait_recv()
        if not self._drained:
            self._drain_sinks_to_batch()
        self._drained = False
        flags, self._incoming_flags = self._incoming_flags, 0
        frame = self.link.recv_frame
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
        frame = self.link.send_frame
        assert frame is not None
        if batch is not None and batch.num_graphs and not set(batch.keys()) <= set(frame.names):
            self.link.renew_schema(batch, self._capacity)  # this iteration's message; graduates go in the next one
            return
        if batch is not None and batch.num_graphs:
            if converged_indices is None:
                mask = engine.state.graduated_mask()
            else:
                mask = torch.zeros(batch.num_graphs, dtype=torch.bool)
                mask[torch.as_tensor(converged_indices, dtype=torch.long).cpu()] = True
            self._batch_to_buffer(mask)
        else:
            frame.clear()
        finished = self.finished()
        self.link.send(FLAG_DONE if finished else 0)
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
        return all(len(s) == 0 for s in self.overflow.all())

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
        self.link.finish_send()
        self.engine.end_hooks()
        if self.finished() and self.entered != self.left:
            raise PipelineError(
                f"rank {self.rank} took in {self.entered} systems but passed on {self.left}: a system was lost"
            )

    def fail(self, exc: BaseException) -> None:
        """Report ``exc`` to the other ranks (through the backend, where the first record wins,
        and an error frame downstream unless that link broke), drop pending transfers and abort
        the backend, which is unusable afterwards. Never raises."""
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
                self.link.notify_downstream()
            except Exception:  # the link may be gone too; peers then see it close
                pass
        self.link.drop()
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
        frame = self.link.send_frame
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
            raise self.link.too_large(batch, int(sel[0]))
        self.sent_ids.record(frame.batch.system_id, sent)
        self.held_back += len(sel) - sent
        moved = np.zeros(batch.num_graphs, dtype=bool)
        moved[sel[:sent]] = True
        batch.defrag(torch.from_numpy(moved))
        self.engine.masks.update(batch)
        self.left += sent
        return sent

    def _overflow_to_sinks(self, batch: Batch, mask: torch.Tensor | None = None) -> None:
        """Stage systems in the overflow sinks, first sink with room first (:meth:`Overflow.stage`)."""
        self.staged += self.overflow.stage(batch, mask)

    def _drain_sinks_to_batch(self) -> None:
        """Pull staged systems back into the active batch while there is room (:meth:`Overflow.drain_into`)."""
        self.overflow.drain_into(self.engine)

    def __repr__(self) -> str:
        return (
            f"PipelineRank(rank={self.rank}/{self.world_size}, mode={self.comm_mode!r}, "
            f"entered={self.entered}, left={self.left}, iterations={self.iterations})"
        )


__all__ = ["PipelineRank", "engine_for", "stage_buffer_config", "stage_comm_mode"]
