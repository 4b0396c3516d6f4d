"""``BaseDynamics``: the integrator base class, and ``BufferConfig`` for pipeline buffers.

An integrator subclasses :class:`BaseDynamics` and implements ``pre_update`` (before the model
forward: e.g. half-kick and drift) and ``post_update`` (after it: e.g. the second half-kick),
plus ``setup``/``init_state`` when it keeps per-system state. Inside those methods,
``self.context`` (a :class:`~alchemi_core.dynamics.context.StepContext`) says which systems
(``system_mask``, ``[B]`` bool or None for all) and atoms (``node_weight``, ``[V, 1]`` 1.0/0.0 or
None) this stage integrates, and gives ``inv_mass`` and ``weighted_inv_mass`` per atom and the
step index; ``self.dt`` is the time step in fs. A value derived from the masks is registered with
``self.context.derived(name, build)``: the engine keeps it right for the masks, so a captured step
outlives checks that move systems. Keep persistent state in system- or atom-level batch fields so
it travels with each system through sinks and ranks.

Running a stage goes through ``runner``, ``+`` and ``|`` through ``composition``, ``with stage:``
and ``compile()`` through ``streams``, and the pipeline communication methods to the stage's
rank (``pipeline_stage``).

Example:
    >>> import torch
    >>> from alchemi_core.dynamics import BaseDynamics
    >>> class Euler(BaseDynamics):
    ...     def pre_update(self, batch):
    ...         w = self.context.node_weight
    ...         step = self.dt * batch.velocities
    ...         batch.positions.add_(step if w is None else step * w)
    ...     def post_update(self, batch):
    ...         batch.velocities.addcmul_(batch.forces, self.context.weighted_inv_mass, value=self.dt)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from alchemi_core.dynamics import composition, runner, streams
from alchemi_core.dynamics.context import StepContext
from alchemi_core.dynamics.convergence import ConvergenceHook
from alchemi_core.dynamics.hook import check_hook
from alchemi_core.dynamics.pipeline_stage import OfRank, rank_of
from alchemi_core.dynamics.quarantine import DEFAULT_MAX_EXTENT, Quarantined
from alchemi_core.errors import AlchemiError, ConfigurationError
from alchemi_core.tuning import CoreTuning, check_tuning
from alchemi_core.validation import finite_number, whole_number

if TYPE_CHECKING:
    from alchemi_core.data import Batch
    from alchemi_core.dynamics.engine import Engine
    from alchemi_core.dynamics.fused import FusedStage
    from alchemi_core.dynamics.pipeline import DistributedPipeline
    from alchemi_core.dynamics.pipeline_rank import PipelineRank
    from alchemi_core.dynamics.sampler import SizeAwareSampler
    from alchemi_core.dynamics.sinks import DataSink
    from alchemi_core.dynamics.state import SubStage

COMM_MODES = ("sync", "async_recv", "fully_async")


@attrs.frozen
class BufferConfig:
    """Capacities of a pipeline stage's pre-allocated send and receive buffers.

    Adjacent stages of a ``DistributedPipeline`` must use identical values.

    Attributes:
        num_systems: Most systems per transfer.
        num_nodes: Most atoms per transfer, over all systems.
        num_edges: Most edges per transfer, over all systems.
    """

    num_systems: int = attrs.field(validator=attrs.validators.ge(1))
    num_nodes: int = attrs.field(validator=attrs.validators.ge(1))
    num_edges: int = attrs.field(default=0, validator=attrs.validators.ge(0))


class BaseDynamics:
    """A dynamics stage: an integrator, a model, hooks, and where systems come from and go.

    Args:
        model: Callable returning ``energy`` ``[B, 1]`` and ``forces`` ``[V, 3]`` for a batch.
        n_steps: Steps of a plain ``run()``; inside a fused stage or pipeline, each system's step
            budget in this stage (it moves on when it converges or has used them).
        dt: Time step in fs.
        hooks: Per-step hooks (see ``alchemi_core.dynamics.Hook``).
        convergence_hook: Moves converged systems on (see ``ConvergenceHook``).
        sampler: Feeds the run from a dataset; graduated systems' slots are refilled.
        refill_frequency: Steps between graduation/refill checks.
        sinks: Where graduated systems go, first sink with room first.
        comm_mode: ``"sync"``, ``"async_recv"`` or ``"fully_async"`` (pipelines only).
        buffer_config: Send/receive buffer capacities (pipelines only).
        name: A label for logs (default: the class name).
        strict: Raise when a structure goes bad (non-finite values, atoms flying apart) instead of
            quarantining it (see ``alchemi_core.dynamics.quarantine``).
        max_extent: Largest bounding-box side (Å) of a structure before its atoms count as flown apart.
        tuning: The engine's per-device choices for this stage's runs (default:
            ``CoreTuning.for_device`` of the batch's device; see ``alchemi_core.tuning``).

    Raises:
        ConfigurationError: A value that cannot work (negative steps, unknown comm mode, ...).
    """

    #: Whether the integrator needs the model's stress every step (NPT-style integrators).
    needs_stress: bool = False
    #: Whether the integrator changes cells (NPT, cell filters): held atoms and components then
    #: follow the cell's deformation (``alchemi_core.dynamics.constraints``).
    moves_cell: bool = False
    #: Whether a system entering this stage needs forces before its first step (the engine
    #: evaluates the model for newcomers); a stage that moves nothing (``Static``) says False.
    forces_on_entry: bool = True
    #: The system field holding this stage's ``fmax`` where that is not the largest atomic force
    #: (a cell filter's, which counts the cell's forces too); logs read it. None: the atoms' forces.
    fmax_field: str | None = None
    #: Whether runs capture the step as a CUDA graph (:meth:`compile`).
    compile_step: bool = False
    _stream: Any = None  # the stream of ``with stage:``
    _pipeline_rank: PipelineRank | None = None  # set by the pipeline rank running the stage

    def __init__(
        self,
        model: Any,
        n_steps: int = 1000,
        dt: float | torch.Tensor = 1.0,
        hooks: Sequence[Any] | None = None,
        convergence_hook: ConvergenceHook | None = None,
        sampler: SizeAwareSampler | None = None,
        refill_frequency: int = 1,
        sinks: Sequence[DataSink] | None = None,
        comm_mode: str = "async_recv",
        buffer_config: BufferConfig | None = None,
        name: str | None = None,
        strict: bool = False,
        max_extent: float = DEFAULT_MAX_EXTENT,
        tuning: CoreTuning | None = None,
    ) -> None:
        if model is None or not callable(model):
            raise ConfigurationError(f"{type(self).__name__} needs a callable model, got {model!r}")
        n_steps = whole_number(f"{type(self).__name__} n_steps", n_steps, minimum=0)
        if comm_mode not in COMM_MODES:
            raise ConfigurationError(f"comm_mode must be one of {COMM_MODES}, got {comm_mode!r}")
        refill_frequency = whole_number(f"{type(self).__name__} refill_frequency", refill_frequency, minimum=1)
        if buffer_config is not None and not isinstance(buffer_config, BufferConfig):
            raise ConfigurationError("buffer_config must be a BufferConfig")
        hooks = list(hooks or [])
        for h in list(hooks):
            if isinstance(h, ConvergenceHook):
                if convergence_hook is not None:
                    raise ConfigurationError(
                        "a ConvergenceHook is in hooks and another is given as convergence_hook; pass one"
                    )
                convergence_hook = h
                hooks.remove(h)
            else:
                check_hook(h)
        if convergence_hook is not None and not isinstance(convergence_hook, ConvergenceHook):
            raise ConfigurationError("convergence_hook must be a ConvergenceHook")
        self.model = model
        self.n_steps = int(n_steps)
        self.dt = self._check_dt(dt)
        self.hooks: list[Any] = hooks
        self.convergence_hook = convergence_hook
        self.sampler = sampler
        self.refill_frequency = int(refill_frequency)
        self.sinks: list[DataSink] = list(sinks or [])
        self.comm_mode = comm_mode
        self.buffer_config = buffer_config
        self.name = name or type(self).__name__
        self.strict = bool(strict)
        self.max_extent = finite_number("max_extent", max_extent, above=0.0, unit=" Å")
        check_tuning(type(self).__name__, tuning, CoreTuning)
        self.tuning = tuning
        #: What this stage owns in the current run (the engine replaces it at each run's start).
        self.context = StepContext()
        #: ``[B]`` bool after each convergence check: the systems that just converged.
        self.converged_mask: torch.Tensor | None = None
        self.status_code = 0
        self._engine: Engine | None = None
        self.compile_kwargs: dict[str, Any] = {}

    @staticmethod
    def _check_dt(dt: Any) -> Any:
        if isinstance(dt, torch.Tensor):
            if not bool((dt > 0).all()):
                raise ConfigurationError("dt must be positive")
            return dt
        return finite_number("dt", dt, above=0.0, unit=" fs")

    # ------------------------------------------------------------------ integrator API
    def setup(self, batch: Batch) -> None:
        """Called once per run, before the first step: create persistent state fields."""

    def init_state(self, batch: Batch, entering: torch.Tensor) -> None:
        """Reset per-system state for systems that just entered this stage (``[B]`` bool);
        must not read back from the device."""

    def pre_update(self, batch: Batch) -> None:
        """The part of the step before the model forward."""
        raise NotImplementedError(f"{type(self).__name__} must implement pre_update(batch)")

    def post_update(self, batch: Batch) -> None:
        """The part of the step after the model forward (forces are fresh)."""
        raise NotImplementedError(f"{type(self).__name__} must implement post_update(batch)")

    #: Whether every value this stage derives from its masks (``context.derived``) is built on
    #: the device alone (no read-back, no Python branch on a mask's contents): the engine may then
    #: rewrite the masks and rebuild those values inside a captured step (``CoreTuning.masks_in_step``).
    mask_values_in_step = False

    @property
    def inv_mass(self) -> torch.Tensor:
        """``[V, 1]`` acceleration per unit force, Å/fs² per eV/Å (cached per composition)."""
        batch = self._engine.state.batch if self._engine is not None else None
        if self._engine is None or batch is None:
            raise AlchemiError(f"{self.name}.inv_mass is only available during a run")
        return self._engine.masks.inv_mass(batch)

    @property
    def step_count(self) -> int:
        """Steps the run has completed: during a step, that step's index; after ``run(n)``, ``n``
        (as in nvalchemi)."""
        return int(self._engine.state.step_count) if self._engine is not None else 0

    @property
    def active_batch(self) -> Batch | None:
        """The batch of the current (or last) run."""
        return self._engine.state.batch if self._engine is not None else None

    @property
    def quarantined(self) -> list[Quarantined]:
        """Structures the current (or last) run took out because they went bad, with reasons."""
        return self._engine.quarantine_records() if self._engine is not None else []

    def _attach(self, engine: Engine, sub: SubStage) -> None:
        self._engine = engine
        self.context = sub.context
        self.status_code = sub.code

    # ------------------------------------------------------------------ running
    def _make_engine(self) -> Engine:
        return runner.single_engine(self)

    def run(
        self,
        batch: Batch | None = None,
        n_steps: int | None = None,
        *,
        checkpoint: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 0,
        resume_from: str | os.PathLike[str] | dict[str, Any] | None = None,
    ) -> Batch | None:
        """Integrate ``batch`` in place (or stream from the sampler) and return it.

        Without a sampler, runs ``n_steps`` steps (or until every system converged). With one,
        runs until the dataset is drained: each system gets ``n_steps`` steps or converges, then
        goes to the sinks. Returns the batch; with a sampler and no sinks, a batch of every
        finished system; with a sampler and sinks, None (the results are in the sinks).

        Args:
            checkpoint: Write a checkpoint here every ``checkpoint_every`` steps and at the end
                (see ``alchemi_core.dynamics.checkpoint``).
            resume_from: Continue the run saved in this checkpoint (same stages, same sampler), a
                path or the state ``alchemi_core.dynamics.checkpoint.load`` returned;
                the result is the one the uninterrupted run would give.
        """
        steps = self.n_steps if n_steps is None else int(n_steps)
        return runner.execute(
            self, self._make_engine(), batch, None if self.sampler is not None else steps,
            checkpoint=checkpoint, checkpoint_every=checkpoint_every, resume_from=resume_from,
        )

    def step(self, batch: Batch) -> Batch:
        """One step of this stage on ``batch`` (prepares it on first use)."""
        return runner.step(self, batch, self._make_engine)

    def compile(self, **kwargs: Any) -> BaseDynamics:
        """Capture the step as a CUDA graph when running on a GPU (see ``streams``)."""
        return streams.compile_stage(self, kwargs)

    def __enter__(self) -> BaseDynamics:
        return streams.enter(self)

    def __exit__(self, *exc: Any) -> None:
        streams.leave(self)

    def __add__(self, other: Any) -> FusedStage:
        return composition.build("+", self, other)

    def __or__(self, other: Any) -> DistributedPipeline:
        return composition.build("|", self, other)

    # The seed's pipeline communication methods: the stage's rank's (``pipeline_stage``).
    pipeline_rank = property(rank_of)
    send_buffer, recv_buffer = OfRank(outside=None), OfRank(outside=None)
    _prestep_sync_buffers, _complete_pending_recv, _poststep_sync_buffers = OfRank(), OfRank(), OfRank()
    _recv_to_batch, _buffer_to_batch, _batch_to_buffer = OfRank(), OfRank(), OfRank()
    _overflow_to_sinks, _drain_sinks_to_batch = OfRank(), OfRank()

    def __repr__(self) -> str:
        return f"{self.name}(n_steps={self.n_steps}, dt={self.dt}, hooks={len(self.hooks)})"

