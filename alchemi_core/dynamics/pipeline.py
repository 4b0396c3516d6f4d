"""``DistributedPipeline``: stages on separate ranks, structures flowing from one to the next.

Each rank runs one stage (a ``BaseDynamics`` or a ``FusedStage``); a system that graduates
from rank *r* (it converged or used its ``n_steps``) is sent to rank *r + 1*; the first rank
refills from its sampler and the last writes to its sinks. Every iteration, every rank follows
the seed's four phases:

1. ``_prestep_sync_buffers``: wait for the previous send (``fully_async``), post the receive.
2. ``_complete_pending_recv``: wait for it, put what arrived into the active batch (what does
   not fit goes to the overflow sinks), and drain overflow sinks back while there is room.
3. ``step``: integrate the active systems.
4. ``_poststep_sync_buffers``: move graduated systems into the send buffer, as many as fit
   (back-pressure: the rest stay, frozen, until there is room) and send it, even when empty,
   so the next rank's receive always completes.

A rank is finished when its upstream has said so, its sampler is drained and nothing is left in
its active batch or overflow; its last message carries a *done* flag, so termination needs no
extra round trip. Under ``torchrun`` each process runs its own rank over ``comm:nccl`` (GPUs)
or ``comm:gloo`` (CPUs) from ``alchemi-nccl``; without it, ``run()`` runs every rank as a thread
of this process (the in-process backend), which suits one machine and tests.

If a rank raises, the others stop with a ``PipelineError``: at once in-process; over
torch.distributed as soon as the failed process's connections close, and at the latest after
``timeout_s`` seconds.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> model = DemoModelWrapper()
    >>> pipeline = DemoDynamics(model=model, n_steps=100, dt=1.0) | DemoDynamics(model=model, n_steps=500, dt=0.5)
    >>> sorted(pipeline.stages)
    [0, 1]
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.comm.base import (
    FLAG_DONE,
    CommBackend,
    DoneWork,
    Work,
    apply_header,
    decode_schema,
    empty_from_schema,
    encode_schema,
    header_size,
    schema_of,
    write_header,
)
from alchemi_core.data import Batch
from alchemi_core.dynamics.base import BufferConfig
from alchemi_core.errors import ConfigurationError, PipelineError

if TYPE_CHECKING:
    from alchemi_core.dynamics.engine import Engine
    from alchemi_core.dynamics.sinks import DataSink

_SCHEMA_LEN_SLOTS = 1


def _engine_for(stage: Any, last: bool) -> Engine:
    """An engine that graduates on budget; only the last rank writes graduates to its sinks."""
    from alchemi_core.dynamics.engine import Engine
    from alchemi_core.dynamics.fused import FusedStage

    if isinstance(stage, FusedStage):
        subs, entry, exit_, sinks, sampler, refill = (
            stage.sub_stages, stage.entry_status, stage.exit_status, stage.sinks, stage.sampler,
            stage.refill_frequency,
        )
        hooks = stage.hooks
    else:
        subs, entry, exit_, sinks, sampler, refill = [(0, stage)], 0, 1, stage.sinks, stage.sampler, stage.refill_frequency
        hooks = []
    engine = Engine(
        subs, entry_status=entry, exit_status=exit_, sinks=sinks if last else (), sampler=sampler,
        refill_frequency=refill, graduate_on_budget=True, owner=stage, hooks=hooks,
    )
    engine.graduate_to_sinks = last
    return engine


class PipelineRank:
    """The per-rank state and protocol of a pipeline (what the seed calls the communication
    mixin): active batch, send/receive buffers, overflow sinks."""

    def __init__(self, stage: Any, backend: CommBackend, world_size: int, synchronized: bool, device: torch.device) -> None:
        self.stage = stage
        self.backend = backend
        self.rank = backend.rank
        self.world_size = world_size
        self.first = self.rank == 0
        self.last = self.rank == world_size - 1
        self.synchronized = synchronized
        self.device = device
        self.comm_mode = _comm_mode(stage)
        self.buffer_config: BufferConfig | None = _buffer_config(stage)
        self.engine = _engine_for(stage, self.last)
        self.overflow: list[DataSink] = [] if self.last else list(_stage_sinks(stage))
        self._own_overflow: DataSink | None = None
        self.send_buffer: Batch | None = None
        self.recv_buffer: Batch | None = None
        self._send_header: torch.Tensor | None = None
        self._recv_header: torch.Tensor | None = None
        self._pending_recv: list[Work] = []
        self._pending_send: list[Work] = []
        self.upstream_done = self.first
        self.sent_done = False
        self.received = 0
        self.left = 0
        self.iterations = 0
        stage._pipeline_rank = self

    # ------------------------------------------------------------------ setup
    @property
    def entered(self) -> int:
        """Systems that came into this rank: initial batch, sampler refills and receipts."""
        return self.engine.loaded_count + self.received

    @property
    def active_batch(self) -> Batch | None:
        return self.engine.batch

    def setup(self, batch: Batch | None) -> None:
        """Prepare the active batch and agree on buffer schemas with the neighbours."""
        engine = self.engine
        if self.first:
            if batch is not None or engine.sampler is not None:
                engine.prepare(batch)
        else:
            schema = self._recv_schema()
            self.recv_buffer = empty_from_schema(schema["buffer"], self.device)
            self._recv_header = torch.zeros(header_size(self.recv_buffer), dtype=torch.long, device=self.backend.device)
            if schema["buffer"]["fields"]:
                cap = schema["active"]
                template = empty_from_schema(schema["buffer"], self.device)
                engine.prepare_empty(template, num_systems=cap[0], num_nodes=cap[1], num_edges=cap[2])
        if not self.last:
            self._send_schema()
        engine.start_hooks()

    def _buffer_capacity(self) -> tuple[int, int, int]:
        b = self.engine.batch
        cfg = self.buffer_config
        if cfg is not None:
            return cfg.num_systems, cfg.num_nodes, cfg.num_edges
        return b.system_capacity, b.node_capacity, b.edge_capacity

    def _send_schema(self) -> None:
        b = self.engine.batch
        if b is None:
            buffer = {"capacity": [0, 0, 0], "fields": []}
            active = [0, 0, 0]
        else:
            ns, nn, ne = self._buffer_capacity()
            self.send_buffer = Batch.empty(num_systems=ns, num_nodes=nn, num_edges=ne, template=b)
            buffer = schema_of(self.send_buffer)
            active = [b.system_capacity, b.node_capacity, b.edge_capacity]
            self._send_header = torch.zeros(header_size(self.send_buffer), dtype=torch.long, device=self.backend.device)
        raw = encode_schema({"buffer": buffer, "active": active})
        length = torch.tensor([raw.numel()], dtype=torch.long, device=self.backend.device)
        self.backend.isend_tensor(length, self.rank + 1).wait()
        self.backend.isend_tensor(raw.to(self.backend.device), self.rank + 1).wait()

    def _recv_schema(self) -> dict[str, Any]:
        length = torch.zeros(_SCHEMA_LEN_SLOTS, dtype=torch.long, device=self.backend.device)
        self.backend.irecv_tensor(length, self.rank - 1).wait()
        raw = torch.zeros(int(length[0]), dtype=torch.uint8, device=self.backend.device)
        self.backend.irecv_tensor(raw, self.rank - 1).wait()
        return decode_schema(raw)

    # ------------------------------------------------------------------ the four phases
    def _prestep_sync_buffers(self) -> None:
        """Drain the previous send (fully_async) and post this iteration's receive."""
        for w in self._pending_send:
            w.wait()
        self._pending_send = []
        if self.upstream_done or self.recv_buffer is None:
            return
        self.recv_buffer.zero()
        works = [self.backend.irecv_tensor(self._recv_header, self.rank - 1)]
        for name in sorted(self.recv_buffer.keys()):
            works.append(self.backend.irecv_tensor(self.recv_buffer.storage(name), self.rank - 1))
        self._pending_recv = works
        if self.comm_mode == "sync":
            self._wait_recv()

    def _wait_recv(self) -> None:
        for w in self._pending_recv:
            w.wait()
        self._pending_recv = []
        assert self.recv_buffer is not None and self._recv_header is not None
        flags = apply_header(self.recv_buffer, self._recv_header)
        self._incoming_flags = flags

    def _complete_pending_recv(self) -> None:
        """Finish the receive, route arrivals into the active batch, drain overflow back."""
        if self._pending_recv:
            self._wait_recv()
        elif not hasattr(self, "_incoming_flags"):
            self._incoming_flags = 0
        if self.recv_buffer is not None and self.recv_buffer.num_graphs:
            self.received += self.recv_buffer.num_graphs
            self._recv_to_batch(self.recv_buffer)
            self.recv_buffer.zero()
        if getattr(self, "_incoming_flags", 0) & FLAG_DONE:
            self.upstream_done = True
        self._incoming_flags = 0
        self._drain_sinks_to_batch()

    def step(self) -> None:
        engine = self.engine
        if engine.batch is not None and engine.batch.num_graphs:
            engine.step()
        elif engine.batch is not None and engine.sampler is not None and not engine.sampler.exhausted:
            engine.refill()

    def _poststep_sync_buffers(self, converged_indices: torch.Tensor | None = None) -> None:
        """Send graduated systems downstream (or, on the last rank, write them to the sinks)."""
        engine = self.engine
        batch = engine.batch
        if self.last:
            if batch is not None and batch.num_graphs:
                grad = np.nonzero(engine.graduated_mask().cpu().numpy())[0]
                if len(grad):
                    engine.write_to_sinks(grad)
                    engine.after_removal()
            self.left = engine.written_count
            return
        if self.sent_done:
            return
        if self.send_buffer is not None and batch is not None:
            mask = engine.graduated_mask() if converged_indices is None else _mask_from(converged_indices, batch)
            self._batch_to_buffer(mask)
        finished = self.finished()
        self._send(FLAG_DONE if finished else 0)
        if finished:
            self.sent_done = True

    # ------------------------------------------------------------------ routing
    def _recv_to_batch(self, incoming: Batch) -> None:
        """Route received systems through the receive buffer into the active batch."""
        self._buffer_to_batch(incoming)

    def _buffer_to_batch(self, incoming: Batch) -> None:
        """Add systems to the active batch; those that do not fit go to the overflow sinks."""
        copied = self.engine.admit(incoming, partial=True)
        if copied < incoming.num_graphs:
            rest = ~incoming._copied_mask
            self._overflow_to_sinks(incoming, rest)

    def _batch_to_buffer(self, mask: torch.Tensor) -> int:
        """Copy graduated systems into the send buffer (as many as fit) and remove them."""
        assert self.send_buffer is not None
        batch = self.engine.batch
        self.send_buffer.zero()
        if batch.num_graphs == 0:
            return 0
        sent = self.send_buffer.put(batch, mask)
        if sent:
            batch.defrag()
            self.engine.after_removal()
            self.left += sent
        return sent

    def _overflow_sinks(self) -> list[DataSink]:
        if self.overflow:
            return self.overflow
        if self._own_overflow is None:
            from alchemi_core.dynamics.sinks import HostMemory

            self._own_overflow = HostMemory(capacity=None)
        return [self._own_overflow]

    def _overflow_to_sinks(self, batch: Batch, mask: torch.Tensor | None = None) -> None:
        """Stage systems in the first overflow sink with room, in priority order."""
        rows = np.arange(batch.num_graphs) if mask is None else np.nonzero(mask.cpu().numpy())[0]
        for sink in self._overflow_sinks():
            if not len(rows):
                return
            take, rows = rows[: sink.free], rows[sink.free :]
            if len(take):
                m = torch.zeros(batch.num_graphs, dtype=torch.bool)
                m[take] = True
                sink.write(batch, m.to(batch.device))
        if len(rows):
            from alchemi_core.errors import CapacityError

            raise CapacityError(f"rank {self.rank}: overflow sinks are full; {len(rows)} systems have nowhere to go")

    def _drain_sinks_to_batch(self) -> None:
        """Pull staged systems back into the active batch while there is room."""
        batch = self.engine.batch
        if batch is None:
            return
        for sink in self._overflow_sinks():
            if len(sink) == 0 or batch.num_graphs >= batch.system_capacity:
                continue
            staged = sink.drain().to(batch.device)
            copied = self.engine.admit(staged, partial=True)
            if copied < staged.num_graphs:
                sink.write(staged, ~staged._copied_mask)

    def _send(self, flags: int) -> None:
        buf = self.send_buffer
        works: list[Work] = []
        if buf is None:
            # Nothing was ever set up to send: a bare header with the flags.
            header = torch.zeros(HEADER_EMPTY, dtype=torch.long, device=self.backend.device)
            header[3] = flags
            works.append(self.backend.isend_tensor(header, self.rank + 1))
        else:
            assert self._send_header is not None
            host = torch.zeros(self._send_header.shape, dtype=torch.long)
            write_header(buf, host, flags)
            self._send_header.copy_(host)
            works.append(self.backend.isend_tensor(self._send_header, self.rank + 1))
            for name in sorted(buf.keys()):
                works.append(self.backend.isend_tensor(buf.storage(name), self.rank + 1))
        if self.comm_mode == "fully_async":
            self._pending_send = works
        else:
            for w in works:
                w.wait()

    # ------------------------------------------------------------------ termination
    def finished(self) -> bool:
        engine = self.engine
        if not self.upstream_done:
            return False
        if engine.sampler is not None and not engine.sampler.exhausted:
            return False
        if engine.batch is not None and engine.batch.num_graphs:
            return False
        return all(len(s) == 0 for s in self._overflow_sinks())

    def iterate(self) -> None:
        """One pipeline iteration: the four phases."""
        self._prestep_sync_buffers()
        self._complete_pending_recv()
        self.step()
        self._poststep_sync_buffers()
        self.iterations += 1

    def run(self) -> Batch | None:
        """Iterate until this rank is finished (its own process or thread)."""
        try:
            while True:
                done = self.finished() and (self.last or self.sent_done)
                if self.synchronized:
                    if self.backend.all_reduce_max(0 if done else 1) == 0:
                        break
                    if done:
                        continue
                elif done:
                    break
                self.iterate()
        finally:
            self.close()
        return self.result()

    def close(self) -> None:
        """Finish pending sends, run the hooks' end, and check that nothing was lost.

        Raises:
            PipelineError: This rank took in more systems than it passed on.
        """
        for w in self._pending_send:
            w.wait()
        self._pending_send = []
        self.engine.end_hooks()
        if self.entered != self.left and self.finished():
            raise PipelineError(
                f"rank {self.rank} took in {self.entered} systems but passed on {self.left}: a system was lost"
            )

    def result(self) -> Batch | None:
        """On the last rank without sinks, every finished system; else None."""
        engine = self.engine
        if not self.last or engine.sinks:
            return None
        held = engine.host_results
        return held.drain() if held is not None and len(held) else None


HEADER_EMPTY = 4 + 2 * 0


def _mask_from(indices: torch.Tensor, batch: Batch) -> torch.Tensor:
    mask = torch.zeros(batch.num_graphs, dtype=torch.bool, device=batch.device)
    mask[indices] = True
    return mask


def _comm_mode(stage: Any) -> str:
    from alchemi_core.dynamics.fused import FusedStage

    if isinstance(stage, FusedStage):
        return stage.stages[0].comm_mode
    return stage.comm_mode


def _buffer_config(stage: Any) -> BufferConfig | None:
    from alchemi_core.dynamics.fused import FusedStage

    if isinstance(stage, FusedStage):
        cfgs = {s.buffer_config for s in stage.stages if s.buffer_config is not None}
        if len(cfgs) > 1:
            raise ConfigurationError("the sub-stages of a FusedStage in a pipeline give different BufferConfigs")
        return next(iter(cfgs), None)
    return stage.buffer_config


def _stage_sinks(stage: Any) -> list[DataSink]:
    return list(stage.sinks)


class DistributedPipeline:
    """Stages on ranks (see the module docstring).

    Args:
        stages: ``{rank: stage}`` with ranks 0..N-1.
        synchronized: Add a collective per iteration (debugging; all ranks stop together).
        backend: A ``CommBackend`` for this process, or a ``"comm:<name>"`` to build; default
            ``comm:nccl`` on GPUs and ``comm:gloo`` on CPUs under torchrun, else in-process.
        timeout_s: Longest wait for a peer before giving up with an error.
    """

    def __init__(
        self,
        stages: dict[int, Any],
        synchronized: bool = False,
        backend: CommBackend | str | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        from alchemi_core.dynamics.base import BaseDynamics
        from alchemi_core.dynamics.fused import FusedStage

        if not stages:
            raise ConfigurationError("DistributedPipeline needs at least one stage")
        ranks = sorted(int(r) for r in stages)
        if ranks != list(range(len(ranks))):
            raise ConfigurationError(f"pipeline ranks must be 0..{len(ranks) - 1}, got {ranks}")
        for r, s in stages.items():
            if not isinstance(s, (BaseDynamics, FusedStage)):
                raise ConfigurationError(f"stage of rank {r} is a {type(s).__name__}, not a dynamics stage")
        self.stages: dict[int, Any] = {int(r): s for r, s in stages.items()}
        self.synchronized = bool(synchronized)
        self.backend_spec = backend
        self.timeout_s = float(timeout_s)
        self._backend: CommBackend | None = None
        self._owns_process_group = False
        self._entered = False

    @classmethod
    def chain(cls, stages: Sequence[Any]) -> DistributedPipeline:
        return cls({i: s for i, s in enumerate(stages)})

    def ordered_stages(self) -> list[Any]:
        return [self.stages[r] for r in sorted(self.stages)]

    def __or__(self, other: Any) -> DistributedPipeline:
        if isinstance(other, DistributedPipeline):
            return DistributedPipeline.chain([*self.ordered_stages(), *other.ordered_stages()])
        return DistributedPipeline.chain([*self.ordered_stages(), other])

    @property
    def world_size(self) -> int:
        return len(self.stages)

    def setup(self) -> None:
        """Check the pipeline can run: adjacent BufferConfigs match, the first stage alone has a
        sampler.

        Raises:
            ConfigurationError: Naming the ranks that disagree.
        """
        ordered = self.ordered_stages()
        for r in range(len(ordered) - 1):
            a, b = _buffer_config(ordered[r]), _buffer_config(ordered[r + 1])
            if a is not None and b is not None and a != b:
                raise ConfigurationError(
                    f"ranks {r} and {r + 1} have different BufferConfigs ({a} vs {b}); adjacent "
                    "stages must use identical values"
                )
        for r, s in enumerate(ordered[1:], start=1):
            if getattr(s, "sampler", None) is not None:
                raise ConfigurationError(f"only the first stage may have a sampler; rank {r} has one")

    # ------------------------------------------------------------------ process group
    @staticmethod
    def launched() -> bool:
        """True under torchrun (or any launcher setting RANK and WORLD_SIZE)."""
        return "RANK" in os.environ and "WORLD_SIZE" in os.environ

    def _make_backend(self) -> CommBackend:
        spec = self.backend_spec
        if isinstance(spec, CommBackend):
            return spec
        from alchemi_core import registry

        if spec is None:
            spec = "comm:nccl" if torch.cuda.is_available() else "comm:gloo"
        backend = registry.build(spec, timeout_s=self.timeout_s)
        backend.init()
        return backend

    def __enter__(self) -> DistributedPipeline:
        self.setup()
        self._entered = True
        if self.launched():
            self._backend = self._make_backend()
            if self._backend.world_size != self.world_size:
                raise ConfigurationError(
                    f"the pipeline has {self.world_size} stages but {self._backend.world_size} ranks "
                    f"were launched; run torchrun --nproc-per-node={self.world_size}"
                )
            self._owns_process_group = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._backend is not None and self._owns_process_group:
            self._backend.shutdown()
        self._backend = None
        self._entered = False

    # ------------------------------------------------------------------ running
    def run(self, batch: Batch | None = None) -> Batch | None:
        """Run every rank until all systems have passed through the last stage.

        Args:
            batch: Initial systems for the first stage (besides, or instead of, its sampler).

        Returns:
            On the last rank, the finished systems when its stage has no sinks (else None);
            None on other ranks. In-process, the last rank's result.
        """
        self.setup()
        if self._backend is None and self.launched():
            with self:
                return self.run(batch)
        if self._backend is not None:
            return self._run_rank(self._backend, batch)
        return self._run_in_process(batch)

    def _device(self) -> torch.device:
        if torch.cuda.is_available() and self.launched():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _run_rank(self, backend: CommBackend, batch: Batch | None) -> Batch | None:
        stage = self.stages[backend.rank]
        device = batch.device if batch is not None else self._device()
        rank = PipelineRank(stage, backend, self.world_size, self.synchronized, device)
        rank.setup(batch if backend.rank == 0 else None)
        return rank.run()

    def _run_in_process(self, batch: Batch | None) -> Batch | None:
        """Every rank in this thread, one iteration of each per round, in rank order.

        Within a round rank r - 1 has sent before rank r receives, so the in-process backend
        never waits; running the ranks in turn (not as threads) keeps shared models and hooks
        free of races and makes runs reproducible.
        """
        from alchemi_core.comm.inprocess import InProcessBackend

        group = InProcessBackend.group(self.world_size, timeout_s=0.0)
        device = batch.device if batch is not None else torch.device("cpu")
        ranks: list[PipelineRank] = []
        current = 0
        try:
            for b in group:
                current = b.rank
                rank = PipelineRank(self.stages[b.rank], b, self.world_size, self.synchronized, device)
                rank.setup(batch if b.rank == 0 else None)
                ranks.append(rank)
            done = [False] * self.world_size
            while not all(done):
                for rank in ranks:
                    current = rank.rank
                    if done[rank.rank]:
                        continue
                    if rank.finished() and (rank.last or rank.sent_done):
                        done[rank.rank] = True
                        continue
                    rank.iterate()
            for rank in ranks:
                current = rank.rank
                rank.close()
        except PipelineError:
            raise
        except Exception as exc:
            raise PipelineError(f"pipeline rank {current} failed: {type(exc).__name__}: {exc}") from exc
        return ranks[-1].result()

    def __repr__(self) -> str:
        inner = ", ".join(f"{r}: {s!r}" for r, s in sorted(self.stages.items()))
        return f"DistributedPipeline({{{inner}}}, synchronized={self.synchronized})"


__all__ = ["DistributedPipeline", "DoneWork", "PipelineRank"]
