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

:class:`Engine` is assembled from layers, one module each (``state`` → ``masks`` → ``step`` →
``admission`` → here; see ``alchemi_core.dynamics.state``); this module prepares a run, runs
it and calls the once-per-run hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch

from alchemi_core.data import Batch
from alchemi_core.dynamics import checkpoint as ckpt
from alchemi_core.dynamics.admission import Admission
from alchemi_core.dynamics.hook import build_hook_table
from alchemi_core.dynamics.stage import INNER_POINTS
from alchemi_core.dynamics.state import SubStage
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_core.models.base import check_input, model_card

__all__ = ["Engine", "SubStage"]


class Engine(Admission):
    """Runs sub-stages on one batch (see the module docstring and ``state.EngineState`` for the
    arguments)."""

    # ------------------------------------------------------------------ hooks
    def _build_tables(self) -> None:
        """Per-point hook tuples, built once per run: the per-step path never asks pluggy."""
        owners: list[tuple[Any, Sequence[Any]]] = [(s.dynamics, s.dynamics.hooks) for s in self.subs]
        if self.extra_hooks:
            owners.insert(0, (self.owner, self.extra_hooks))
        self.table = build_hook_table(owners)
        for s in self.subs:
            s.hooks = tuple(tuple(e for e in point if e[2]() is s.dynamics) for point in self.table)
        self.owner_hooks = tuple(
            tuple(e for e in point if self.extra_hooks and e[2]() is self.owner) for point in self.table
        )
        inner = [f for p in INNER_POINTS for f, _, _ in self.table[p]]
        self._inner_hooks = bool(inner)
        self._inner_frequencies = tuple(sorted(set(inner)))

    def _attach_all(self) -> None:
        """Give every stage (and the run's owner) its context for this run."""
        keeps = self.graph_requested or self._rewrites_masks_in_steps()
        for ctx in self._contexts:
            ctx.batch, ctx.keeps_builds = self.batch, keeps
        for s in self.subs:
            s.dynamics._attach(self, s)
        attach_owner = getattr(self.owner, "_attach_owner", None)
        if attach_owner is not None and all(self.owner is not s.dynamics for s in self.subs):
            attach_owner(self, self.owner_context)

    # ------------------------------------------------------------------ preparation
    def prepare(self, batch: Batch | None, resume: dict[str, Any] | None = None) -> Batch:
        """Make ``batch`` (or the sampler's first batch) ready: defaults, capacity, state, forces.

        Args:
            batch: The systems to run; None to build them from the sampler.
            resume: A checkpoint (``alchemi_core.dynamics.checkpoint.load``) to continue instead:
                its batch, counters, random states, sampler position and kept results.
        """
        if resume is not None:
            device = batch.device if batch is not None else torch.device(resume["device"])
            if device.type == "cuda" and not torch.cuda.is_available():
                device = torch.device("cpu")
            batch = ckpt.batch_from_state(resume["batch"], device)
        if batch is None:
            if self.sampler is None:
                raise ConfigurationError(
                    "run() without a batch needs a sampler: pass sampler=SizeAwareSampler(...) to "
                    "the first stage, or call run(batch)"
                )
            # Models that know their memory per atom (machine-learned potentials need far more
            # than the sampler's generic guess) size the batches so that a run never runs out;
            # a batch that cannot fit is refused here, before it is built.
            declared = [m for m in self.models if callable(getattr(m, "bytes_per_atom", None))]
            if declared:
                chunk = getattr(declared[0], "chunk_atoms", None) if len(declared) == 1 else None
                names = " + ".join(f"model {model_card(m).name!r}" for m in declared)
                self.sampler.plan_memory(sum(m.bytes_per_atom() for m in declared), chunk_atoms=chunk,
                                         needed_by=names)
            else:
                self.sampler.plan_memory(self.sampler.bytes_per_atom)
            batch = self.sampler.build_initial_batch()
            self.sampled_count = batch.num_graphs
        if not isinstance(batch, Batch):
            raise InvalidDataError(f"run() takes a Batch, got {type(batch).__name__}")
        if batch.num_graphs == 0 and self.sampler is None:
            raise InvalidDataError("run() got an empty batch and has no sampler to fill it")
        self._fill_defaults(batch, first=True)
        if self.sampler is not None:
            batch = self._with_capacity(batch)
        self.batch = batch
        self._health_pending = None  # a look at an earlier batch says nothing about this one
        for m in self.models:
            check_input(m, batch, stress=self.needs_stress)
        self._attach_all()
        for s in self.subs:
            s.dynamics.setup(batch)
        if resume is None:
            self._pass_empty_stages()
            # Systems that already took steps (a batch continuing an earlier run) keep their state.
            entering = batch.stage_steps == 0
            if bool(entering.any()):
                self._init_entering(entering)
        self._update_masks()
        self.forward()
        self.verify_models()
        if self.track_energy_change:
            batch.energy_prev.copy_(batch.energy)
        self._build_tables()
        self.step_count = 0
        self.done = False
        self.loaded_count = batch.num_graphs
        if resume is None:
            self.ids.admit(batch.system_id.tolist(), "the first batch")
        else:
            self.ids.reset(batch.system_id.tolist())
            ckpt.restore(self, resume)
            self._update_masks()  # budget checks are scheduled from the restored step count
        if resume is None and self.graduate_on_budget:
            self._check_done()  # every system may have passed through stages of n_steps=0
        return batch

    def prepare_empty(self, template: Batch, num_systems: int, num_nodes: int, num_edges: int) -> Batch:
        """Start with no systems (a downstream pipeline rank): buffers shaped like ``template``."""
        batch = Batch.empty(num_systems=num_systems, num_nodes=num_nodes, num_edges=num_edges, template=template)
        self._fill_defaults(batch, first=True)
        self.batch = batch
        for m in self.models:  # nothing to check yet; remembered, so the models' calls check only what enters
            check_input(m, batch, stress=self.needs_stress)
        self._health_pending = None
        self._attach_all()
        for s in self.subs:
            s.dynamics.setup(batch)
        self._update_masks()
        self._build_tables()
        self.step_count = 0
        self.done = False
        return batch

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
        every = int(checkpoint_every) if checkpoint is not None else 0
        self._flush_graduates()
        if every and self.step_count == 0:
            # Before anything reaches a sink: a run killed before its first periodic checkpoint
            # then resumes from here and cuts the sinks back, instead of starting over on top.
            ckpt.save(self, checkpoint)
        # A checkpoint holds the state after its step: no step may be queued ahead of it.
        # (Nor may one be queued ahead of a stop, which a checkpoint may follow.)
        self._ahead_on = not every and stop is None and self._may_run_ahead()
        self._ahead_until = max_steps
        in_step = self._masks_in_step = self._may_write_masks_in_step()
        try:
            while not self.done:
                if max_steps is not None and self.step_count >= max_steps:
                    break
                if stop is not None and self._after_check() and stop():
                    break
                self.step()
                if every and self.step_count % every == 0:
                    ckpt.save(self, checkpoint)
        finally:
            self._ahead_on = self._masks_in_step = False
            self._settle_ahead()
        if in_step:
            self._update_masks()  # the last check's moves, for whatever reads the masks next
        if self.health_every:
            if self.step_count % self.health_every != 0:
                self.health_check(self.step_count - 1)
            self.settle_health()
        if checkpoint is not None:
            ckpt.save(self, checkpoint)

    def _after_check(self) -> bool:
        """Whether the last step made a check (or none was made yet): a place to stop at."""
        k = self.step_count - 1
        return k < 0 or not self.check_interval or k % self.check_interval == 0

    def start_hooks(self) -> None:
        """Every hook's ``on_run_start``; masks are then refreshed, as a hook may have marked
        atoms (``frozen``) or changed fields the masks depend on."""
        for s in self.subs:
            for h in s.dynamics.hooks:
                getattr(h, "on_run_start", _noop)(self.batch, s.dynamics)
        for h in self.extra_hooks:
            getattr(h, "on_run_start", _noop)(self.batch, self.owner)
        if self.batch is not None:
            self._update_masks()

    def end_hooks(self) -> None:
        """Every hook's ``on_run_end``, even when one raises (files get closed); the first
        error is raised afterwards."""
        calls = [(h, s.dynamics) for s in self.subs for h in s.dynamics.hooks]
        calls += [(h, self.owner) for h in self.extra_hooks]
        first: BaseException | None = None
        for hook, stage in calls:
            try:
                getattr(hook, "on_run_end", _noop)(self.batch, stage)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                first = first or exc
        if first is not None:
            raise first

    def stream_context(self, stream: Any) -> Any:
        if stream is not None and self.batch is not None and self.batch.device.type == "cuda":
            return torch.cuda.stream(stream)
        return nullcontext()


def _noop(*_: Any) -> None:
    return None
