"""``DistributedPipeline``: stages on separate ranks, structures flowing from one to the next.

Each rank runs one stage (a ``BaseDynamics`` or a ``FusedStage``); a system that graduates from
rank *r* moves to rank *r + 1*; the first rank refills from its sampler and the last writes to
its sinks. The per-rank protocol lives in ``alchemi_core.dynamics.pipeline_rank``. Under
``torchrun`` each process runs its own rank over ``comm:nccl`` (GPUs) or ``comm:gloo`` (CPUs);
otherwise ``run()`` runs every rank in this process, one iteration of each in turn. See
``docs/pipelines.md``.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_core.testing import make_batch
    >>> model = DemoModelWrapper()
    >>> pipeline = DemoDynamics(model=model, n_steps=10, dt=1.0) | DemoDynamics(model=model, n_steps=5, dt=0.5)
    >>> sorted(pipeline.stages)
    [0, 1]
    >>> out = pipeline.run(make_batch([3, 2, 4]))  # in-process: every rank in this thread
    >>> sorted(out.system_id.tolist())
    [0, 1, 2]
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from alchemi_core.comm.base import CommBackend
from alchemi_core.data import Batch
from alchemi_core.dynamics import composition
from alchemi_core.dynamics.base import BaseDynamics
from alchemi_core.dynamics.fused import FusedStage
from alchemi_core.dynamics.pipeline_rank import PipelineRank, stage_buffer_config
from alchemi_core.dynamics.quarantine import warn_quarantined
from alchemi_core.errors import ConfigurationError, PipelineError


class DistributedPipeline:
    """Stages on ranks (see the module docstring).

    Args:
        stages: ``{rank: stage}`` with ranks 0..N-1; each stage object appears once.
        synchronized: Add an all-reduce per iteration so every rank stops together (debugging).
        backend: A ``CommBackend`` for this process (used as given; the caller owns it), or a
            ``"comm:<name>"`` to build and own; default ``comm:nccl`` when CUDA is available and
            ``comm:gloo`` otherwise, under torchrun; in-process without it.
        timeout_s: Longest wait for a peer (one iteration of the slowest neighbour, first-step
            compilation included) before stopping with an error.
        device: Where each rank's batch lives; default the backend's device for NCCL, else this
            process's GPU (``LOCAL_RANK``) when there is one, else the CPU. In-process: the
            batch's device.
        queue_depth: In ``fully_async``, how many sends a rank may have in flight, i.e. how many
            exchanges it may run ahead of its downstream neighbour (one frame each).
    """

    def __init__(
        self,
        stages: dict[int, Any],
        synchronized: bool = False,
        backend: CommBackend | str | None = None,
        timeout_s: float = 120.0,
        device: torch.device | str | None = None,
        queue_depth: int = 4,
    ) -> None:
        if not stages:
            raise ConfigurationError("DistributedPipeline needs at least one stage")
        ranks = sorted(int(r) for r in stages)
        if ranks != list(range(len(ranks))):
            raise ConfigurationError(f"pipeline ranks must be 0..{len(ranks) - 1}, got {ranks}")
        for r, s in stages.items():
            if not isinstance(s, (BaseDynamics, FusedStage)):
                raise ConfigurationError(f"stage of rank {r} is a {type(s).__name__}, not a dynamics stage")
        if float(timeout_s) <= 0:
            raise ConfigurationError(f"timeout_s must be positive, got {timeout_s}")
        self.stages: dict[int, Any] = {int(r): s for r, s in stages.items()}
        self.synchronized = bool(synchronized)
        self.backend_spec = backend
        self.timeout_s = float(timeout_s)
        self.device = torch.device(device) if device is not None else None
        if int(queue_depth) < 1:
            raise ConfigurationError(f"queue_depth must be >= 1, got {queue_depth}")
        self.queue_depth = int(queue_depth)
        self._backend: CommBackend | None = None
        self._owns_backend = False

    @classmethod
    def chain(cls, stages: Sequence[Any]) -> DistributedPipeline:
        """Stages on ranks 0, 1, ... in order."""
        return cls({i: s for i, s in enumerate(stages)})

    def ordered_stages(self) -> list[Any]:
        return [self.stages[r] for r in sorted(self.stages)]

    def __or__(self, other: Any) -> DistributedPipeline:
        others = other.ordered_stages() if isinstance(other, DistributedPipeline) else [other]
        return DistributedPipeline(
            {i: s for i, s in enumerate([*self.ordered_stages(), *others])},
            synchronized=self.synchronized, backend=self.backend_spec, timeout_s=self.timeout_s, device=self.device,
            queue_depth=self.queue_depth,
        )

    @property
    def world_size(self) -> int:
        return len(self.stages)

    def setup(self) -> None:
        """Check the pipeline can run: adjacent BufferConfigs are identical, only the first stage
        has a sampler, and no stage object is used twice.

        Raises:
            ConfigurationError: Naming the ranks that disagree.
        """
        ordered = self.ordered_stages()
        for r in range(len(ordered) - 1):
            a, b = stage_buffer_config(ordered[r]), stage_buffer_config(ordered[r + 1])
            if a is not None and b is not None and a != b:
                raise ConfigurationError(
                    f"ranks {r} and {r + 1} have different BufferConfigs ({a} vs {b}); adjacent "
                    "stages must use identical values"
                )
        for r, s in enumerate(ordered[1:], start=1):
            if getattr(s, "sampler", None) is not None:
                raise ConfigurationError(f"only the first stage may have a sampler; rank {r} has one")
        seen: dict[int, int] = {}
        for r, s in enumerate(ordered):
            subs = s.stages if hasattr(s, "sub_stages") else [s]
            for obj in [s, *subs]:
                if id(obj) in seen and seen[id(obj)] != r:
                    raise ConfigurationError(
                        f"ranks {seen[id(obj)]} and {r} share the stage object {obj!r}; give each rank "
                        "its own stage (they may share a model)"
                    )
                seen[id(obj)] = r

    # ------------------------------------------------------------------ process group
    @staticmethod
    def launched() -> bool:
        """True under torchrun (or any launcher setting RANK and WORLD_SIZE)."""
        return "RANK" in os.environ and "WORLD_SIZE" in os.environ

    def _make_backend(self) -> tuple[CommBackend, bool]:
        spec = self.backend_spec
        if isinstance(spec, CommBackend):
            return spec, False
        from alchemi_core import registry

        if spec is None:
            spec = "comm:nccl" if torch.cuda.is_available() else "comm:gloo"
        backend = registry.build(spec, timeout_s=self.timeout_s)
        backend.init()
        return backend, True

    def __enter__(self) -> DistributedPipeline:
        """Check the stages and, when launched (or given a backend), join the process group."""
        self.setup()
        if self._backend is None and (self.launched() or isinstance(self.backend_spec, CommBackend)):
            backend, owned = self._make_backend()
            self._backend, self._owns_backend = backend, owned
            launched = backend.world_size
            if launched != self.world_size:
                self.__exit__(None, None, None)
                raise ConfigurationError(
                    f"the pipeline has {self.world_size} stages but {launched} ranks were launched; "
                    f"start {self.world_size} processes in all (torchrun --nproc-per-node={self.world_size} "
                    "on one node)"
                )
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Leave the process group this pipeline joined (abort it after a failure)."""
        backend, owned = self._backend, self._owns_backend
        self._backend, self._owns_backend = None, False
        if backend is not None and owned:
            if exc_type is None:
                backend.shutdown()
            else:
                backend.abort()

    # ------------------------------------------------------------------ running
    def run(self, batch: Batch | None = None) -> Batch | None:
        """Run every rank until all systems have passed through the last stage.

        Args:
            batch: Initial systems for the first stage (besides, or instead of, its sampler);
                ignored on other ranks.

        Returns:
            On the last rank, the finished systems when its stage has no sinks (else None);
            None on other ranks. In-process, the last rank's result.

        Raises:
            PipelineError: A rank failed (in-process: wrapping its error); under torchrun the
                failing rank raises its own error and the others a ``PeerError``.
        """
        self.setup()
        if self._backend is None and (self.launched() or isinstance(self.backend_spec, CommBackend)):
            with self:
                return self.run(batch)
        if self._backend is not None:
            return self._run_rank(self._backend, batch)
        return self._run_in_process(batch)

    def _rank_device(self, backend: CommBackend) -> torch.device:
        if self.device is not None:
            return self.device
        if backend.device.type == "cuda":
            return backend.device
        if torch.cuda.is_available():
            local = int(os.environ.get("LOCAL_RANK", "0"))
            if local < torch.cuda.device_count():
                return torch.device("cuda", local)
        return torch.device("cpu")

    def _run_rank(self, backend: CommBackend, batch: Batch | None) -> Batch | None:
        from alchemi_core.registry import manager

        stage = self.stages[backend.rank]
        device = self._rank_device(backend)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        pm = manager()
        rank = PipelineRank(stage, backend, self.world_size, self.synchronized, device, self.queue_depth)
        try:
            try:
                rank.setup(batch if backend.rank == 0 else None)
            except BaseException as exc:
                rank.fail(exc)
                if rank.lost_error is not None:
                    raise rank.lost_error from exc
                raise
            pm.lifecycle("alchemi_run_start", run=stage)
            result = rank.run()
            warn_quarantined(rank.engine.quarantine_records(), stacklevel=3)  # this rank's, once
        except BaseException as exc:
            pm.lifecycle("alchemi_run_error", run=stage, error=exc)
            raise
        pm.lifecycle("alchemi_run_end", run=stage, result=result)
        return result

    def in_process_ranks(self, batch: Batch | None = None) -> list[PipelineRank]:
        """Every rank of the pipeline in this process, set up and ready to iterate.

        For stepping through the protocol by hand (tests, debugging); ``run()`` uses it. Iterate
        the ranks in rank order, one phase sequence each per round, until every rank
        ``ready_to_stop()``; then ``close()`` each. Keep the pipeline (or its stages) while you
        do: a rank holds its stage weakly, and one whose stage was freed says so.
        """
        from alchemi_core.comm.inprocess import InProcessBackend

        self.setup()
        group = InProcessBackend.group(self.world_size, timeout_s=0.0)
        device = self.device or (batch.device if batch is not None else torch.device("cpu"))
        ranks: list[PipelineRank] = []
        for b in group:
            rank = PipelineRank(self.stages[b.rank], b, self.world_size, self.synchronized, device, self.queue_depth)
            rank.setup(batch if b.rank == 0 else None)
            ranks.append(rank)
        return ranks

    def _run_in_process(self, batch: Batch | None) -> Batch | None:
        """Every rank in this thread, one iteration of each per round, in rank order: no receive
        waits, shared models and hooks see no races, and runs are reproducible."""
        current = 0
        ranks: list[PipelineRank] = []
        try:
            ranks = self.in_process_ranks(batch)
            done = [False] * self.world_size
            while not all(done):
                for rank in ranks:
                    current = rank.rank
                    if done[current]:
                        continue
                    if rank.ready_to_stop():
                        done[current] = True
                        continue
                    rank.iterate()
            for rank in ranks:
                current = rank.rank
                rank.close()
            # One warning for the whole pipeline (this frame, run, the caller).
            warn_quarantined([q for rank in ranks for q in rank.engine.quarantine_records()], stacklevel=3)
        except PipelineError:
            raise
        except Exception as exc:
            if current < len(ranks):
                ranks[current].fail(exc)
            raise PipelineError(f"pipeline rank {current} failed: {type(exc).__name__}: {exc}") from exc
        return ranks[-1].result()

    def __repr__(self) -> str:
        inner = ", ".join(f"{r}: {s!r}" for r, s in sorted(self.stages.items()))
        return f"DistributedPipeline({{{inner}}}, synchronized={self.synchronized})"


def chain(left: Any, right: Any) -> Any:
    """``left | right``: a pipeline with ``left`` on rank 0 and ``right`` (or the ranks of a
    pipeline ``right``) after it; ``NotImplemented`` when a single stage meets a non-stage."""
    if isinstance(right, DistributedPipeline):
        return DistributedPipeline.chain([left, *right.ordered_stages()])
    if isinstance(left, BaseDynamics) and not isinstance(right, BaseDynamics):
        return NotImplemented
    return DistributedPipeline.chain([left, right])


composition.register("|", chain)

__all__ = ["DistributedPipeline", "PipelineRank"]
