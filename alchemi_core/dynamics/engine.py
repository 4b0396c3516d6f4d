"""The loop behind ``BaseDynamics.run`` and ``FusedStage.run``: stages sharing one batch.

Each system carries a ``status``; a sub-stage integrates the systems whose status equals its
code. One model forward per step serves every sub-stage. At *check* steps (every
``check_interval`` steps) convergence criteria move systems on, systems that used their step
budget move on too, and graduated systems (``status >= exit_status``) go to the sinks while the
sampler refills their slots. Checks are the only places that read values back from the device;
the steps between them are a fixed sequence of device operations on fixed buffers.

The engine keeps on the batch the fields it needs: ``status``, ``system_id``, ``velocities``,
``forces``, ``energy``, ``atomic_masses``, ``stage_steps`` (steps used in the current stage), and
``fmax``/``energy_change``/``energy_prev`` when a criterion names them. They travel with each
system through sinks, refills and ranks.

:class:`Engine` is a :class:`~alchemi_core.dynamics.state.RunState` (``engine.state``) and the
collaborators that act on it (``masks``, ``step``, ``checks``, ``admission``; see
``alchemi_core.dynamics.state``); this module prepares a run, runs it and calls the once-per-run
hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.data import Batch
from alchemi_core.dynamics import checkpoint as ckpt
from alchemi_core.dynamics.admission import Admission
from alchemi_core.dynamics.checks import Checks
from alchemi_core.dynamics.forward import forward, verify_models
from alchemi_core.dynamics.hook import build_hook_table
from alchemi_core.dynamics.masks import Masks
from alchemi_core.dynamics.quarantine import Quarantined
from alchemi_core.dynamics.stage import INNER_POINTS
from alchemi_core.dynamics.state import RunState, SubStage
from alchemi_core.dynamics.step import StepLoop
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_core.models.base import check_input, model_card

if TYPE_CHECKING:
    from alchemi_core.dynamics.base import BaseDynamics

__all__ = ["Engine", "SubStage"]


class Engine:
    """Runs sub-stages on one batch (see the module docstring; the arguments are those of
    :meth:`RunState.of <alchemi_core.dynamics.state.RunState.of>`)."""

    def __init__(self, stages: Sequence[tuple[int, BaseDynamics]], **config: Any) -> None:
        self.state = state = RunState.of(stages, **config)
        self.masks = Masks(state)
        self.admission = Admission(state, self.masks)
        self.checks = Checks(state, self.masks, self.admission)
        self.loop = StepLoop(state, self.masks, self.checks)

    # ------------------------------------------------------------------ preparation
    def prepare(self, batch: Batch | None, resume: dict[str, Any] | None = None) -> Batch:
        """Make ``batch`` (or the sampler's first batch) ready: defaults, capacity, state, forces.

        Args:
            batch: The systems to run; None to build them from the sampler.
            resume: A checkpoint (``alchemi_core.dynamics.checkpoint.load``) to continue instead:
                its batch, counters, random states, sampler position and kept results.
        """
        st = self.state
        if resume is not None:
            device = batch.device if batch is not None else torch.device(resume["device"])
            if device.type == "cuda" and not torch.cuda.is_available():
                device = torch.device("cpu")
            batch = ckpt.batch_from_state(resume["batch"], device)
        if batch is None:
            if st.sampler is None:
                raise ConfigurationError(
                    "run() without a batch needs a sampler: pass sampler=SizeAwareSampler(...) to "
                    "the first stage, or call run(batch)"
                )
            # Models that know their memory per atom (machine-learned potentials need far more
            # than the sampler's generic guess) size the batches so that a run never runs out;
            # a batch that cannot fit is refused here, before it is built.
            declared = [m for m in st.models if callable(getattr(m, "bytes_per_atom", None))]
            if declared:
                chunk = getattr(declared[0], "chunk_atoms", None) if len(declared) == 1 else None
                names = " + ".join(f"model {model_card(m).name!r}" for m in declared)
                st.sampler.plan_memory(sum(m.bytes_per_atom() for m in declared), chunk_atoms=chunk,
                                       needed_by=names)
            else:
                st.sampler.plan_memory(st.sampler.bytes_per_atom)
            batch = st.sampler.build_initial_batch()
            st.sampled_count = batch.num_graphs
        if not isinstance(batch, Batch):
            raise InvalidDataError(f"run() takes a Batch, got {type(batch).__name__}")
        if batch.num_graphs == 0 and st.sampler is None:
            raise InvalidDataError("run() got an empty batch and has no sampler to fill it")
        self.admission.fill_defaults(batch, first=True)
        if st.sampler is not None:
            batch = self.admission.with_capacity(batch)
        self._start(batch)
        if resume is None:
            self.masks.pass_empty_stages(batch)
            # Systems that already took steps (a batch continuing an earlier run) keep their state.
            entering = batch.stage_steps == 0
            if bool(entering.any()):
                self.masks.init_entering(batch, entering)
        self.masks.update(batch)
        if st.forces_on_entry:  # (a run that moves nothing evaluates in its step, once)
            forward(st, batch)
            verify_models(st.models, batch)
        if st.track_energy_change:
            batch.energy_prev.copy_(batch.energy)
        self._build_tables()
        st.step_count = 0
        st.done = False
        st.loaded_count = batch.num_graphs
        if resume is None:
            st.ids.admit(batch.system_id.tolist(), "the first batch")
        else:
            st.ids.reset(batch.system_id.tolist())
            ckpt.restore(self, resume)
            self.masks.update(batch)  # budget checks are scheduled from the restored step count
        if resume is None and st.graduate_on_budget:
            self.admission.check_done(batch)  # every system may have passed through stages of n_steps=0
        return batch

    def prepare_empty(self, template: Batch, num_systems: int, num_nodes: int, num_edges: int) -> Batch:
        """Start with no systems (a downstream pipeline rank): buffers shaped like ``template``."""
        batch = Batch.empty(num_systems=num_systems, num_nodes=num_nodes, num_edges=num_edges, template=template)
        self.admission.fill_defaults(batch, first=True)
        self._start(batch)
        self.masks.update(batch)
        self._build_tables()
        self.state.step_count = 0
        self.state.done = False
        return batch

    def _start(self, batch: Batch) -> None:
        """Make ``batch`` the run's; give every stage (and the run's owner) its context."""
        st = self.state
        st.batch = batch
        st.health_pending = None  # a look at an earlier batch says nothing about this one
        for m in st.models:  # remembered, so the models' calls check only what enters after
            check_input(m, batch, stress=st.needs_stress)
        keeps = st.graph_requested or st.rewrites_masks_in_steps()
        for ctx in st.contexts:
            ctx.batch, ctx.keeps_builds = batch, keeps
        for s in st.subs:
            s.dynamics._attach(self, s)
        owner = st.owner
        attach_owner = getattr(owner, "_attach_owner", None)
        if attach_owner is not None and all(owner is not s.dynamics for s in st.subs):
            attach_owner(self, st.owner_context)
        for s in st.subs:
            s.dynamics.setup(batch)

    def _build_tables(self) -> None:
        """Per-point hook tuples, built once per run: the per-step path never asks pluggy."""
        st = self.state
        owners: list[tuple[Any, Sequence[Any]]] = [(s.dynamics, s.dynamics.hooks) for s in st.subs]
        if st.extra_hooks:
            owners.insert(0, (st.owner, st.extra_hooks))
        st.table = build_hook_table(owners)
        for s in st.subs:
            s.hooks = tuple(tuple(e for e in point if e[2]() is s.dynamics) for point in st.table)
        st.owner_hooks = tuple(
            tuple(e for e in point if st.extra_hooks and e[2]() is st.owner) for point in st.table
        )
        inner = [f for p in INNER_POINTS for f, _, _ in st.table[p]]
        st.inner_hooks = bool(inner)
        st.inner_frequencies = tuple(sorted(set(inner)))

    # ------------------------------------------------------------------ running
    def run(
        self, max_steps: int | None, checkpoint: Any = None, checkpoint_every: int = 0,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        """Step until done (every system graduated and the sampler empty) or ``max_steps``.

        With ``checkpoint`` (a path) and ``checkpoint_every``, a checkpoint is written after
        every ``checkpoint_every``-th step (its checks included) and when the run stops.
        ``stop`` (a host-side callable, asked between steps) ends the run early once it returns
        True: after the next step that made a check, so the graduates of that check reach the
        sinks; ``done`` then stays False.
        """
        st, batch = self.state, self.state.batch
        assert batch is not None
        every = int(checkpoint_every) if checkpoint is not None else 0
        self.admission.flush_graduates(batch)
        if every and st.step_count == 0:
            # Before anything reaches a sink: a run killed before its first periodic checkpoint
            # then resumes from here and cuts the sinks back, instead of starting over on top.
            ckpt.save(self, checkpoint)
        # A checkpoint holds the state after its step: no step may be queued ahead of it.
        # (Nor may one be queued ahead of a stop, which a checkpoint may follow.)
        st.ahead_on = not every and stop is None and self.loop.may_run_ahead(batch)
        st.ahead_until = max_steps
        in_step = st.masks_in_step = self.masks.may_write_in_step(batch)
        try:
            while not st.done:
                if max_steps is not None and st.step_count >= max_steps:
                    break
                if stop is not None and self._after_check() and stop():
                    break
                self.loop.step(batch)
                if every and st.step_count % every == 0:
                    ckpt.save(self, checkpoint)
        finally:
            st.ahead_on = st.masks_in_step = False
            self.loop.settle_ahead(batch)
        if in_step:
            self.masks.update(batch)  # the last check's moves, for whatever reads the masks next
        if st.health_every:
            if st.step_count % st.health_every != 0:
                self.checks.health_check(batch, st.step_count - 1)
            self.checks.settle_health(batch)
        if checkpoint is not None:
            ckpt.save(self, checkpoint)

    def step(self) -> None:
        """One step of every sub-stage, then the checks that are due."""
        assert self.state.batch is not None
        self.loop.step(self.state.batch)

    def check(self, k: int) -> None:
        """The checks after step ``k``."""
        assert self.state.batch is not None
        self.checks.check(self.state.batch, k)

    def _after_check(self) -> bool:
        """Whether the last step made a check (or none was made yet): a place to stop at."""
        st = self.state
        k = st.step_count - 1
        return k < 0 or not st.check_interval or k % st.check_interval == 0

    def release_run(self) -> None:
        """The run has ended: drop its step and check graphs (their memory pools serve the next
        captures on this GPU, ``capture.retire_graph``) and the contexts' derived values, whose
        builds may close over their stages. A later ``step()`` rebuilds them."""
        self.loop.retire_graph(self.state.batch)
        self.state.check_capture.release()
        for ctx in self.state.contexts:
            ctx.refresh_derived(systems_changed=True)

    def start_hooks(self) -> None:
        """Every hook's ``on_run_start``; masks are then refreshed, as a hook may have marked
        atoms (``frozen``) or changed fields the masks depend on."""
        st = self.state
        for s in st.subs:
            for h in s.dynamics.hooks:
                getattr(h, "on_run_start", _noop)(st.batch, s.dynamics)
        for h in st.extra_hooks:
            getattr(h, "on_run_start", _noop)(st.batch, st.owner)
        if st.batch is not None:
            self.masks.update(st.batch)

    def end_hooks(self) -> None:
        """Every hook's ``on_run_end``, even when one raises (files get closed); the first
        error is raised afterwards."""
        st = self.state
        calls = [(h, s.dynamics) for s in st.subs for h in s.dynamics.hooks]
        calls += [(h, st.owner) for h in st.extra_hooks]
        first: BaseException | None = None
        for hook, stage in calls:
            try:
                getattr(hook, "on_run_end", _noop)(st.batch, stage)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                first = first or exc
        if first is not None:
            raise first

    def stream_context(self, stream: Any) -> Any:
        if stream is not None and self.state.batch is not None and self.state.batch.device.type == "cuda":
            return torch.cuda.stream(stream)
        return nullcontext()

    def quarantine_records(self) -> list[Quarantined]:
        """Every structure quarantined so far, a health check still on its way included."""
        return self.checks.quarantine_records()


def _noop(*_: Any) -> None:
    return None
