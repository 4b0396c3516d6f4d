"""One step of the engine, and its capture as a CUDA graph.

A step is: ``BEFORE_STEP`` hooks; per stage its integrator's ``pre_update``; the model forward
(``forward``, one per distinct model); per stage ``post_update``; the stage-step counters;
``AFTER_STEP`` hooks; then the checks when one is due (``checks.Checks.check``). The part between
the outer hook points is a fixed sequence of device operations on fixed buffers: on a GPU with
``compile()`` it is captured once as a CUDA graph and replayed, captured again only when the set
of systems changes. Steps at which a hook inside the step fires run eagerly.

*Running ahead.* A check reads a few flags back, and until they arrive the host cannot act on
them; with checks every step (a relaxation) the GPU then idles while the host acts, and the host
while the GPU works. Where nothing the host does after a check can change what the next step
computes, the check queues the next step's device work before it waits for its flags
(:meth:`StepLoop.step_ahead`): the masks are rewritten from the statuses the check just set (by
the step itself where it rewrites them, ``CoreTuning.masks_in_step``), so systems that converged or
failed do not step, and the step is launched. That holds for a run (``run()``, no checkpoints) of
stages that systems only leave (no fused stage's next stage, no sampler, no sinks), with no
``ON_CONVERGE`` hook, no hook before or inside the next step, checks not scheduled by budgets and
no ``energy_change`` criterion (:meth:`StepLoop.may_run_ahead`). The result is the one the run
gives without running ahead, with two differences: the step after the last check is queued too
and does nothing to any system (every mask is False; its forces are evaluated again at the same
positions), and a run that raises at a check (a model's error) has taken the next step first.
``CoreTuning.run_ahead`` (``alchemi_core.tuning``) says where it is on, per device type: on a CPU
the host does the device work itself and nothing overlaps.
"""

from __future__ import annotations

import torch

from alchemi_core.data import Batch
from alchemi_core.dynamics.capture import (
    capture_graph,
    capture_stream,
    gpu_index,
    holds_much_memory,
    release_cached_memory,
    retire_graph,
)
from alchemi_core.dynamics.checks import Checks
from alchemi_core.dynamics.forward import forward
from alchemi_core.dynamics.hook import dispatch
from alchemi_core.dynamics.masks import Masks
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.dynamics.state import RunState

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


class StepLoop:
    """Steps a run's batch (see the module docstring).

    Args:
        state: The run's state.
        masks: Rewrites the masks (at a step's start where the step does that).
        checks: The checks that follow a step when one is due.
    """

    def __init__(self, state: RunState, masks: Masks, checks: Checks) -> None:
        self.state, self.masks, self.checks = state, masks, checks

    def step(self, batch: Batch) -> None:
        """One step of every sub-stage, then the checks that are due."""
        st = self.state
        k = st.step_count
        table = st.table
        for ctx in st.contexts:
            ctx.step = k
        if st.ran_ahead == k:
            st.ran_ahead = -1  # queued by the last check, which found no hook due before it
        else:
            if table[BEFORE_STEP]:
                dispatch(table[BEFORE_STEP], batch, k)
            self._advance(batch, k)
        if table[AFTER_STEP]:
            dispatch(table[AFTER_STEP], batch, k)
        st.step_count = k + 1
        if st.check_interval and (k % st.check_interval == 0 or k >= st.budget_check):
            ahead = self._steps_ahead_at(k)
            self.checks.check(batch, k, (lambda: self.step_ahead(batch, k + 1)) if ahead else None)
        elif st.health_every and st.step_count % st.health_every == 0:
            self.checks.health_check(batch, k)

    def _advance(self, batch: Batch, k: int) -> None:
        """Step ``k``'s device work: the captured graph where it applies, else the eager step."""
        st = self.state
        if st.graph_requested and batch.device.type == "cuda" and not self._inner_hooks_fire(k):
            self._graph_step(batch, k)
        else:
            self._body(batch, k, st.inner_hooks)

    def _body(self, batch: Batch, k: int, hooks: bool) -> None:
        """A step's device work, eager or captured: the masks rewritten where the run's steps do
        that (``CoreTuning.masks_in_step``), then the integrators and the model (:meth:`_core`)."""
        if self.state.masks_in_step:
            self.masks.write_in_step(batch)
        self._core(batch, k, hooks)

    # ------------------------------------------------------------------ running ahead
    def may_run_ahead(self, batch: Batch | None) -> bool:
        """Whether this run's checks may queue the next step before their read-back: nothing the
        host does after one changes what that step computes (the module docstring)."""
        st = self.state
        return (batch is not None and st.tuning().run_ahead and st.masked
                and not st.moves_enter_stages and st.sampler is None and not st.sinks
                and st.graduate_to_sinks and not st.schedule_budgets and not st.track_energy_change
                and not st.table[ON_CONVERGE])

    def _steps_ahead_at(self, k: int) -> bool:
        """Whether the check after step ``k`` queues step ``k + 1`` before its read-back."""
        st, nxt = self.state, k + 1
        return (st.ahead_on and (st.ahead_until is None or nxt < st.ahead_until)
                and not any(nxt % f == 0 for f, _, _ in st.table[BEFORE_STEP])
                and not self._inner_hooks_fire(nxt))

    def step_ahead(self, batch: Batch, k: int) -> None:
        """Queue step ``k``'s device work now (a check's, before it waits for its flags): masks
        rewritten from the statuses the check set, then the step; ``step()`` then only runs its
        ``AFTER_STEP`` hooks and checks."""
        st = self.state
        if not st.masks_in_step:  # (else the step rewrites them at its start)
            self.masks.update(batch)
        for ctx in st.contexts:
            ctx.step = k
        self._advance(batch, k)
        st.ran_ahead = k
        st.steps_run_ahead += 1

    def settle_ahead(self, batch: Batch | None) -> None:
        """The run ended with a step queued ahead that no check asked for (it moved no system):
        wait for it, so the graphs it replays are not handed on while it runs."""
        st = self.state
        if st.ran_ahead < 0:
            return
        st.ran_ahead = -1
        if batch is not None and batch.device.type == "cuda":
            torch.cuda.current_stream(batch.device).synchronize()

    # ------------------------------------------------------------------ the step's device work
    def _core(self, batch: Batch, k: int, hooks: bool) -> None:
        """Integrator halves around the model forward: the part a CUDA graph can hold.

        Inner hook points run here only when ``hooks`` is set; hooks of each sub-stage run next
        to that stage's update, a fused stage's own hooks once around all of them.
        """
        st = self.state
        subs, own = st.subs, st.owner_hooks
        # Held atoms and components, symmetry, a fixed centre of mass (``constraints``): whatever
        # the updates do against them is undone here, for every integrator and backend alike.
        constraints = st.constraints if st.constraints.active else None
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
        if hooks and st.table[BEFORE_COMPUTE]:
            dispatch(st.table[BEFORE_COMPUTE], batch, k)
        forward(st, batch)
        if st.track_energy_change:
            torch.sub(batch.energy.view(-1), batch.energy_prev.view(-1), out=batch.energy_change).abs_()
            batch.energy_prev.copy_(batch.energy)
        if hooks and st.table[AFTER_COMPUTE]:
            dispatch(st.table[AFTER_COMPUTE], batch, k)
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
            if st.masked:
                for s in subs:
                    steps.add_(s.sys_mask)
            else:
                steps.add_(1)

    def _inner_hooks_fire(self, k: int) -> bool:
        return any(k % f == 0 for f in self.state.inner_frequencies)

    # ------------------------------------------------------------------ the captured step
    def _graph_step(self, batch: Batch, k: int) -> None:
        """Replay the captured step; capture it first when the set of systems changed.

        A check that moves systems between stages rewrites the masks, and the values derived from
        them (``StepContext.derived``), in place: the graph stays right across it. Capturing
        records without executing, so step ``k`` itself runs eagerly (on a side stream, which also
        warms up lazily initialised libraries) and the capture of the same sequence serves the
        following steps.
        """
        st = self.state
        key = batch.version
        if st.graph is not None and st.graph_key == key:
            st.graph.replay()
            return
        old, st.graph = st.graph, None
        much = holds_much_memory(batch.device)
        if old is not None and much:
            # A large model's graph (a MACE step holds gigabytes): its memory goes back before the
            # eager step below needs its own, as one graph's pool cannot serve the other's.
            old = None
        side = capture_stream(gpu_index(batch.device))
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._body(batch, k, False)
        torch.cuda.current_stream().wait_stream(side)
        release_cached_memory(batch.device)
        graph, _ = capture_graph(lambda: self._body(batch, k, False), side, replaces=old, spare=not much)
        del old  # never replayed again: the new graph took over its memory pool
        st.graph, st.graph_key = graph, key
        st.graph_captures += 1

    def retire_graph(self, batch: Batch | None) -> None:
        """Drop the captured step (the next step captures anew); its memory pool serves the next
        capture on this GPU (``capture.retire_graph``)."""
        st = self.state
        graph, st.graph, st.graph_key = st.graph, None, -1
        if graph is not None:
            assert batch is not None
            retire_graph(graph, gpu_index(batch.device))
