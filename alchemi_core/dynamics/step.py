"""One step of the engine, and its capture as a CUDA graph.

A step is: ``BEFORE_STEP`` hooks; per stage its integrator's ``pre_update``; the model forward
(one per distinct model); per stage ``post_update``; the stage-step counters; ``AFTER_STEP``
hooks; then the checks when one is due (``admission.Admission.check``). The part between the
outer hook points is a fixed sequence of device operations on fixed buffers: on a GPU with
``compile()`` it is captured once as a CUDA graph and replayed, captured again only when the set
of systems changes. Steps at which a hook inside the step fires run eagerly.

*Running ahead.* A check reads a few flags back, and until they arrive the host cannot act on
them; with checks every step (a relaxation) the GPU then idles while the host acts, and the host
while the GPU works. Where nothing the host does after a check can change what the next step
computes, the check queues the next step's device work before it waits for its flags
(:meth:`StepLoop._step_ahead`): the masks are rewritten from the statuses the check just set (by
the step itself where it rewrites them, ``CoreTuning.masks_in_step``), so systems that converged or
failed do not step, and the step is launched. That holds for a run (``run()``, no checkpoints) of
stages that systems only leave (no fused stage's next stage, no sampler, no sinks), with no
``ON_CONVERGE`` hook, no hook before or inside the next step, checks not scheduled by budgets and
no ``energy_change`` criterion (:meth:`StepLoop._may_run_ahead`). The result is the one the run
gives without running ahead, with two differences: the step after the last check is queued too
and does nothing to any system (every mask is False; its forces are evaluated again at the same
positions), and a run that raises at a check (a model's error) has taken the next step first.
``CoreTuning.run_ahead`` (``alchemi_core.tuning``) says where it is on, per device type: on a CPU the host does the device work itself
and nothing overlaps. W2 on an H100 host with slow Python, in one process, alternating: 28.6 ms
(median) with neither, 25.4 running ahead, 24.5 with the masks in the step as well
(docs/performance.md, twenty-eighth session).
"""

from __future__ import annotations

from typing import Any

import torch

from alchemi_core.dynamics.capture import (
    capture_graph,
    capture_stream,
    gpu_index,
    holds_much_memory,
    release_cached_memory,
)
from alchemi_core.dynamics.constraints import hold_forces
from alchemi_core.dynamics.hook import dispatch
from alchemi_core.dynamics.masks import Masks
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.errors import InvalidDataError
from alchemi_core.models.base import model_card

# The hook points as plain ints: indexing the per-point tuples with an exact int stays on
# CPython's fast path (an IntEnum member does not), and the step runs this many times a second.
BEFORE_STEP = int(DynamicsStage.BEFORE_STEP)
BEFORE_PRE_UPDATE = int(DynamicsStage.BEFORE_PRE_UPDATE)
AFTER_PRE_UPDATE = int(DynamicsStage.AFTER_PRE_UPDATE)
BEFORE_COMPUTE = int(DynamicsStage.BEFORE_COMPUTE)
AFTER_COMPUTE = int(DynamicsStage.AFTER_COMPUTE)
BEFORE_POST_UPDATE = int(DynamicsStage.BEFORE_POST_UPDATE)
AFTER_POST_UPDATE = int(DynamicsStage.AFTER_POST_UPDATE)
AFTER_STEP = int(DynamicsStage.AFTER_STEP)
ON_CONVERGE = int(DynamicsStage.ON_CONVERGE)

class StepLoop(Masks):
    """The step layer of the engine (see the module docstring)."""

    #: Every distinct context of this run; each step writes its index into them.
    _contexts: tuple[Any, ...] = ()
    #: Whether this run's checks may run the next step ahead (:meth:`_may_run_ahead`), and the
    #: step count the run stops at (None: until done).
    _ahead_on = False
    _ahead_until: int | None = None
    #: The step whose device work a check queued already (-1: none).
    _ran_ahead = -1
    #: How many steps checks ran ahead this run.
    steps_run_ahead = 0

    def check(self, k: int) -> None:
        """The checks after step ``k`` (``admission.Admission`` implements them)."""
        raise NotImplementedError

    def health_check(self, k: int) -> None:
        """The quarantine part of a check, for runs without checks (``admission.Admission``)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the model
    def forward(self) -> None:
        """One model evaluation per distinct model; results written into the batch buffers.
        Atoms marked ``frozen`` and components ``frozen_axes`` holds feel no force (as under ASE's
        ``FixAtoms`` and ``FixCartesian``), so ``fmax`` counts only what moves; the step puts back
        whatever an update moved of them (``constraints``)."""
        batch = self.batch
        assert batch is not None
        if len(self.models) == 1:
            model = self.models[0]
            out = model(batch, compute_stress=self.needs_stress) if self.needs_stress else model(batch)
            self._store(batch, out, model)
            hold_forces(batch)
            return
        # Several models: each system takes the forces (and stress) of its own stage's model.
        kwargs = {"compute_stress": True} if self.needs_stress else {}
        base = self.models[0](batch, **kwargs)
        self._store(batch, base, self.models[0])
        for m in self.models[1:]:
            out = m(batch, **kwargs)
            _check_shapes(m, out, batch)
            for s in self.subs:
                if s.dynamics.model is m and s.sys_mask is not None:
                    nm = s.sys_mask.index_select(0, batch.batch_idx).unsqueeze(-1)
                    batch.forces.copy_(torch.where(nm, out["forces"], batch.forces))
                    batch.energy.copy_(torch.where(s.sys_mask.unsqueeze(-1), out["energy"], batch.energy))
                    if self.needs_stress and out.get("stress") is not None:
                        rows = s.sys_mask.view(-1, 1, 1)
                        batch.stress.copy_(torch.where(rows, out["stress"], batch.stress))
        hold_forces(batch)

    def verify_models(self) -> None:
        """Each model's ``verify``: errors it recorded on the device (reads back; check steps,
        and after the forward of a run's start or of a refill only)."""
        for m in self.models:
            verify = getattr(m, "verify", None)
            if verify is not None:
                verify(self.batch)

    def model_error_flags(self) -> torch.Tensor | None:
        """At a check: a 0-d device tensor, True when a model may have an error to raise.

        A model with ``error_flag(batch)`` (a 0-d device tensor, True when its ``verify`` may
        raise) is asked for it, so that its errors ride on the check's one read-back; a model
        without one, or whose ``error_flag`` returns None, is verified now (it reads back).
        None: no model gave a flag. When the flag is set, :meth:`verify_models` raises.
        """
        flag, unflagged = self._model_flags()
        for m in unflagged:
            m.verify(self.batch)
        return flag

    def _model_flags(self) -> tuple[torch.Tensor | None, list[Any]]:
        """The models' error flag (as :meth:`model_error_flags`, None: none gave one) and the
        models that gave none but have a ``verify``, without calling it."""
        flags, unflagged = [], []
        for m in self.models:
            flag_of = getattr(m, "error_flag", None)
            flag = flag_of(self.batch) if flag_of is not None else None
            if flag is not None:
                flags.append(flag.reshape(()))
            elif getattr(m, "verify", None) is not None:
                unflagged.append(m)
        if not flags:
            return None, unflagged
        return (flags[0] if len(flags) == 1 else torch.stack(flags).any()), unflagged

    @staticmethod
    def _store(batch: Any, out: Any, model: Any) -> None:
        """Copy ``model``'s results into the batch's fields (host-side shape comparisons only:
        a copy would broadcast a result of another shape silently, or fail in torch)."""
        try:
            energy, forces = out["energy"], out["forces"]
        except (KeyError, TypeError):
            raise InvalidDataError(
                f"model {model_card(model).name!r} must return a mapping with 'energy' [B, 1] and 'forces' [V, 3]"
            ) from None
        f = batch.forces
        if forces is not f:
            if forces.shape != f.shape:
                _check_shapes(model, out, batch)
            f.copy_(forces)
        e = batch.energy
        if energy is not e:
            if energy.numel() != e.numel():
                _check_shapes(model, out, batch)
            e.copy_(energy.reshape(e.shape))
        charges = out.get("charges") if hasattr(out, "get") else None
        if charges is not None and "charges" in batch:  # partial charges a model predicts
            batch.charges.copy_(charges.reshape(batch.charges.shape))
        stress = out.get("stress") if hasattr(out, "get") else None
        if stress is not None:
            if stress.shape != (batch.num_graphs, 3, 3):
                _check_shapes(model, out, batch)
            if "stress" in batch:
                batch.stress.copy_(stress)
            else:
                batch.set_field("stress", stress.detach().clone(), "system")

    # ------------------------------------------------------------------ the step
    def step(self) -> None:
        """One step of every sub-stage, then the checks that are due."""
        k = self.step_count
        table = self.table
        batch = self.batch
        assert batch is not None
        for ctx in self._contexts:
            ctx.step = k
        if self._ran_ahead == k:
            self._ran_ahead = -1  # queued by the last check, which found no hook due before it
        else:
            if table[BEFORE_STEP]:
                dispatch(table[BEFORE_STEP], batch, k)
            self._advance(k)
        if table[AFTER_STEP]:
            dispatch(table[AFTER_STEP], batch, k)
        self.step_count = k + 1
        if self.check_interval and (k % self.check_interval == 0 or k >= self._budget_check):
            self.check(k)
        elif self.health_every and self.step_count % self.health_every == 0:
            self.health_check(k)

    def _advance(self, k: int) -> None:
        """Step ``k``'s device work: the captured graph where it applies, else the eager step."""
        assert self.batch is not None
        if self.graph_requested and self.batch.device.type == "cuda" and not self._inner_hooks_fire(k):
            self._graph_step(k)
        else:
            self._body(k, self._inner_hooks)

    def _body(self, k: int, hooks: bool) -> None:
        """A step's device work, eager or captured: the masks rewritten where the run's steps do
        that (``CoreTuning.masks_in_step``), then the integrators and the model (:meth:`_core`)."""
        if self._masks_in_step:
            self._write_masks()
        self._core(k, hooks)

    # ------------------------------------------------------------------ running ahead
    def _may_run_ahead(self) -> bool:
        """Whether this run's checks may queue the next step before their read-back: nothing the
        host does after one changes what that step computes (the module docstring)."""
        batch = self.batch
        return (batch is not None and self.tuning().run_ahead and self.masked
                and not self._moves_enter_stages and self.sampler is None and not self.sinks
                and self.graduate_to_sinks and not self._schedule_budgets and not self.track_energy_change
                and not self.table[ON_CONVERGE])

    def _steps_ahead_at(self, k: int) -> bool:
        """Whether the check after step ``k`` queues step ``k + 1`` before its read-back."""
        nxt = k + 1
        return (self._ahead_on and (self._ahead_until is None or nxt < self._ahead_until)
                and not any(nxt % f == 0 for f, _, _ in self.table[BEFORE_STEP])
                and not self._inner_hooks_fire(nxt))

    def _step_ahead(self, k: int) -> None:
        """Queue step ``k``'s device work now (a check's, before it waits for its flags): masks
        rewritten from the statuses the check set, then the step; ``step(k)`` then only runs its
        ``AFTER_STEP`` hooks and checks."""
        if not self._masks_in_step:  # (else the step rewrites them at its start)
            self._update_masks()
        for ctx in self._contexts:
            ctx.step = k
        self._advance(k)
        self._ran_ahead = k
        self.steps_run_ahead += 1

    def _settle_ahead(self) -> None:
        """The run ended with a step queued ahead that no check asked for (it moved no system):
        wait for it, so the graphs it replays are not handed on while it runs."""
        if self._ran_ahead < 0:
            return
        self._ran_ahead = -1
        if self.batch is not None and self.batch.device.type == "cuda":
            torch.cuda.current_stream(self.batch.device).synchronize()

    def _core(self, k: int, hooks: bool) -> None:
        """Integrator halves around the model forward: the part a CUDA graph can hold.

        Inner hook points run here only when ``hooks`` is set; hooks of each sub-stage run next
        to that stage's update, a fused stage's own hooks once around all of them.
        """
        batch, subs, own = self.batch, self.subs, self.owner_hooks
        assert batch is not None
        # Held atoms and components (``constraints``): whatever the updates do to them is undone
        # here, for every integrator and backend alike.
        constraints = self.constraints if self.constraints.held is not None else None
        with torch.no_grad():
            if constraints is not None:
                constraints.keep(batch)
            if hooks and own[BEFORE_PRE_UPDATE]:
                dispatch(own[BEFORE_PRE_UPDATE], batch, k)
            for s in subs:
                if hooks and s.hooks[BEFORE_PRE_UPDATE]:
                    dispatch(s.hooks[BEFORE_PRE_UPDATE], batch, k)
                s.dynamics.pre_update(batch)
                if hooks and s.hooks[AFTER_PRE_UPDATE]:
                    dispatch(s.hooks[AFTER_PRE_UPDATE], batch, k)
            if constraints is not None:
                constraints.project(batch)
            if hooks and own[AFTER_PRE_UPDATE]:
                dispatch(own[AFTER_PRE_UPDATE], batch, k)
        if hooks and self.table[BEFORE_COMPUTE]:
            dispatch(self.table[BEFORE_COMPUTE], batch, k)
        self.forward()
        if self.track_energy_change:
            torch.sub(batch.energy.view(-1), batch.energy_prev.view(-1), out=batch.energy_change).abs_()
            batch.energy_prev.copy_(batch.energy)
        if hooks and self.table[AFTER_COMPUTE]:
            dispatch(self.table[AFTER_COMPUTE], batch, k)
        with torch.no_grad():
            if hooks and own[BEFORE_POST_UPDATE]:
                dispatch(own[BEFORE_POST_UPDATE], batch, k)
            for s in subs:
                if hooks and s.hooks[BEFORE_POST_UPDATE]:
                    dispatch(s.hooks[BEFORE_POST_UPDATE], batch, k)
                s.dynamics.post_update(batch)
                if hooks and s.hooks[AFTER_POST_UPDATE]:
                    dispatch(s.hooks[AFTER_POST_UPDATE], batch, k)
            if constraints is not None:
                constraints.settle(batch)
            if hooks and own[AFTER_POST_UPDATE]:
                dispatch(own[AFTER_POST_UPDATE], batch, k)
            steps = batch.stage_steps
            if self.masked:
                for s in subs:
                    steps.add_(s.sys_mask)
            else:
                steps.add_(1)

    def _inner_hooks_fire(self, k: int) -> bool:
        return any(k % f == 0 for f in self._inner_frequencies)

    def _graph_step(self, k: int) -> None:
        """Replay the captured step; capture it first when the set of systems changed.

        Capturing records without executing, so step ``k`` itself runs eagerly (on a side
        stream, which also warms up lazily initialised libraries) and the capture of the same
        sequence serves the following steps.
        """
        assert self.batch is not None
        key = self.batch.version
        if self._graph is not None and self._graph_key == key and self._graph_sees_current_masks():
            self._graph.replay()
            return
        old, self._graph = self._graph, None
        much = holds_much_memory(self.batch.device)
        if old is not None and much:
            # A large model's graph (a MACE step holds gigabytes): its memory goes back before the
            # eager step below needs its own, as one graph's pool cannot serve the other's.
            old = None
        side = capture_stream(gpu_index(self.batch.device))
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._body(k, False)
        torch.cuda.current_stream().wait_stream(side)
        release_cached_memory(self.batch.device)
        graph, _ = capture_graph(lambda: self._body(k, False), side, replaces=old, spare=not much)
        del old  # never replayed again: the new graph took over its memory pool
        self._graph, self._graph_key = graph, key
        self._graph_masks = self._mask_versions()
        self.graph_captures += 1

    def _mask_versions(self) -> tuple[int, ...]:
        return (*(s.context.version for s in self.subs), self.owner_context.version)

    def _graph_sees_current_masks(self) -> bool:
        """Whether the captured step is right for the masks as they are now.

        A check that moves systems between stages (or out of them) rewrites the masks in place and
        gives the contexts new versions, without changing the batch. The graph reads the mask
        buffers themselves, so it stays right if every stage brings what it derived from them up to
        date in place (``refresh_for_replay``); a stage that cannot has the step captured anew.
        On W2 (2,048 FIRE relaxations, checks every step) systems converge at about half the
        checks, and each capture costs a few eager steps' time.
        """
        versions = self._mask_versions()
        if versions == self._graph_masks:
            return True
        assert self.batch is not None
        if all(s.dynamics.refresh_for_replay(self.batch) for s in self.subs):
            self._graph_masks = versions
            return True
        return False


def _check_shapes(model: Any, out: Any, batch: Any) -> None:
    """Raise when ``model``'s energy, forces or stress has another shape than the batch needs.

    Raises:
        InvalidDataError: Names the model, the result, its shape and the shape expected.
    """
    n, v = batch.num_graphs, batch.num_nodes
    expected = {"energy": ((n, 1), (n,), "one per system"), "forces": ((v, 3), None, "x, y, z per atom"),
                "stress": ((n, 3, 3), None, "a 3 x 3 matrix per system")}
    for name, (shape, flat, what) in expected.items():
        value = out.get(name) if hasattr(out, "get") else None
        got = tuple(getattr(value, "shape", ()))
        if value is not None and got not in (shape, flat):
            raise InvalidDataError(
                f"model {model_card(model).name!r} returned {name} of shape {list(got)} for a batch of {n} "
                f"systems and {v} atoms; a model must return {name} of shape {list(shape)} ({what})"
            )
