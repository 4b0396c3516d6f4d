"""One step of the engine, and its capture as a CUDA graph.

A step is: ``BEFORE_STEP`` hooks; per stage its integrator's ``pre_update``; the model forward
(one per distinct model); per stage ``post_update``; the stage-step counters; ``AFTER_STEP``
hooks; then the checks when one is due (``admission.Admission.check``). The part between the
outer hook points is a fixed sequence of device operations on fixed buffers: on a GPU with
``compile()`` it is captured once as a CUDA graph and replayed, captured again only when the set
of systems changes. Steps at which a hook inside the step fires run eagerly.
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
from alchemi_core.dynamics.hook import dispatch
from alchemi_core.dynamics.masks import Masks
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.errors import InvalidDataError

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


class StepLoop(Masks):
    """The step layer of the engine (see the module docstring)."""

    #: Every distinct context of this run; each step writes its index into them.
    _contexts: tuple[Any, ...] = ()

    def check(self, k: int) -> None:
        """The checks after step ``k`` (``admission.Admission`` implements them)."""
        raise NotImplementedError

    def health_check(self, k: int) -> None:
        """The quarantine part of a check, for runs without checks (``admission.Admission``)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the model
    def forward(self) -> None:
        """One model evaluation per distinct model; results written into the batch buffers.
        Atoms marked ``frozen`` feel no force (as under ASE's ``FixAtoms``): no integrator, FIRE's
        velocity mixing included, moves them, and ``fmax`` counts only the atoms that move."""
        batch = self.batch
        assert batch is not None
        if len(self.models) == 1:
            out = self.models[0](batch, compute_stress=self.needs_stress) if self.needs_stress else self.models[0](batch)
            self._store(batch, out)
            _hold_frozen(batch)
            return
        # Several models: each system takes the forces (and stress) of its own stage's model.
        kwargs = {"compute_stress": True} if self.needs_stress else {}
        base = self.models[0](batch, **kwargs)
        self._store(batch, base)
        for m in self.models[1:]:
            out = m(batch, **kwargs)
            for s in self.subs:
                if s.dynamics.model is m and s.sys_mask is not None:
                    nm = s.sys_mask.index_select(0, batch.batch_idx).unsqueeze(-1)
                    batch.forces.copy_(torch.where(nm, out["forces"], batch.forces))
                    batch.energy.copy_(torch.where(s.sys_mask.unsqueeze(-1), out["energy"], batch.energy))
                    if self.needs_stress and out.get("stress") is not None:
                        rows = s.sys_mask.view(-1, 1, 1)
                        batch.stress.copy_(torch.where(rows, out["stress"], batch.stress))
        _hold_frozen(batch)

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
    def _store(batch: Any, out: Any) -> None:
        try:
            energy, forces = out["energy"], out["forces"]
        except (KeyError, TypeError):
            raise InvalidDataError(
                "a model must return a mapping with 'energy' [B, 1] and 'forces' [V, 3]"
            ) from None
        f = batch.forces
        if forces is not f:
            f.copy_(forces)
        e = batch.energy
        if energy is not e:
            e.copy_(energy.reshape(e.shape))
        stress = out.get("stress") if hasattr(out, "get") else None
        if stress is not None:
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
        if table[BEFORE_STEP]:
            dispatch(table[BEFORE_STEP], batch, k)
        if self.graph_requested and batch.device.type == "cuda" and not self._inner_hooks_fire(k):
            self._graph_step(k)
        else:
            self._core(k, self._inner_hooks)
        if table[AFTER_STEP]:
            dispatch(table[AFTER_STEP], batch, k)
        self.step_count = k + 1
        if self.check_interval and (k % self.check_interval == 0 or k >= self._budget_check):
            self.check(k)
        elif self.health_every and self.step_count % self.health_every == 0:
            self.health_check(k)

    def _core(self, k: int, hooks: bool) -> None:
        """Integrator halves around the model forward: the part a CUDA graph can hold.

        Inner hook points run here only when ``hooks`` is set; hooks of each sub-stage run next
        to that stage's update, a fused stage's own hooks once around all of them.
        """
        batch, subs, own = self.batch, self.subs, self.owner_hooks
        assert batch is not None
        with torch.no_grad():
            if hooks and own[BEFORE_PRE_UPDATE]:
                dispatch(own[BEFORE_PRE_UPDATE], batch, k)
            for s in subs:
                if hooks and s.hooks[BEFORE_PRE_UPDATE]:
                    dispatch(s.hooks[BEFORE_PRE_UPDATE], batch, k)
                s.dynamics.pre_update(batch)
                if hooks and s.hooks[AFTER_PRE_UPDATE]:
                    dispatch(s.hooks[AFTER_PRE_UPDATE], batch, k)
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
            self._core(k, False)
        torch.cuda.current_stream().wait_stream(side)
        release_cached_memory(self.batch.device)
        graph, _ = capture_graph(lambda: self._core(k, False), side, replaces=old, spare=not much)
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


def _hold_frozen(batch: Any) -> None:
    """Zero the forces on atoms marked ``frozen`` (in place: nothing allocated, no read-back)."""
    if "frozen" in batch:
        frozen = batch.frozen
        mask = frozen if frozen.dtype == torch.bool else frozen.to(torch.bool)
        batch.forces.masked_fill_(mask.view(-1, 1), 0.0)
