"""Which systems and atoms each stage owns, and the inverse masses: the engine's masks.

At a check where some status changed (and whenever systems arrive or leave) the engine
rewrites, per stage, a ``[B]`` system mask (status equals the stage's code and budget left), a
``[V, 1]`` atom weight (0 for atoms of other stages and for atoms marked ``frozen``) and
``inv_mass * weight``, and publishes them in the stage's
:class:`~alchemi_core.dynamics.context.StepContext` with a new version; it also rereads the held
atoms and components (:mod:`~alchemi_core.dynamics.constraints`). The buffers are reallocated only
when the batch's layout changes and rewritten in place otherwise, so a captured CUDA graph keeps
seeing them. Each rewrite rebuilds, in place, what the stages registered as derived from the
masks (``StepContext.derived``), and a change of systems drops it.

Where every stage's derived values are built on the device alone
(``BaseDynamics.mask_values_in_step``: FIRE), a run's step rewrites the masks itself, at its start
(:meth:`Masks.write_in_step`, captured with the step on a GPU): a check whose systems converged
then leaves the masks to the next step, instead of rewriting them and the derived values from the
host before it (``CoreTuning.masks_in_step``, per device type; :meth:`Masks.may_write_in_step`
says when it applies).
"""

from __future__ import annotations

import torch

from alchemi_core.data import Batch
from alchemi_core.dynamics.constraints import has_constraints
from alchemi_core.dynamics.context import next_version
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.dynamics.state import NEVER, RunState, SubStage
from alchemi_core.units import ACCELERATION


class Masks:
    """Writes and publishes the masks of a run (see the module docstring).

    Args:
        state: The run's state; the masks' buffers live in its sub-stages.
    """

    def __init__(self, state: RunState) -> None:
        self.state = state

    def inv_mass(self, batch: Batch) -> torch.Tensor:
        """``[V, 1]`` acceleration per unit force (Å/fs² per eV/Å) for every atom."""
        st = self.state
        if st.inv_mass_version != batch.version or st.inv_mass is None:
            st.inv_mass = (ACCELERATION / batch.atomic_masses).unsqueeze(-1)
            st.inv_mass_version = batch.version
        return st.inv_mass

    def update(self, batch: Batch) -> None:
        """Which systems (and atoms) each stage integrates until the next check.

        The masks live in buffers that are reallocated only when the set of systems changes,
        and are rewritten in place otherwise, so a captured CUDA graph keeps seeing them; each
        rewrite gives the contexts a new version and rebuilds their derived values. Atoms of a
        batch field ``frozen`` get weight 0 in every stage, and the step puts back whatever an
        update moved of them and of the components ``frozen_axes`` holds (``constraints``).
        """
        st = self.state
        inv_mass = self.inv_mass(batch)
        version = next_version()
        frozen = batch.frozen.reshape(-1).to(torch.bool) if "frozen" in batch else None
        fresh = st.masks_version != batch.version  # other systems, or buffers reallocated below
        for s in st.subs:
            if not st.masked and frozen is None:
                s.sys_mask = s.node_weight = None
                s.weighted_inv_mass = inv_mass
                self._publish(s, batch, inv_mass, version)
                continue
            if s.buffers_version != batch.version or s.node_weight is None or s.weighted_inv_mass is None:
                s.sys_mask = torch.empty(batch.num_graphs, dtype=torch.bool, device=batch.device) if st.masked else None
                s.node_weight = torch.empty(batch.num_nodes, 1, dtype=batch.positions.dtype, device=batch.device)
                s.weighted_inv_mass = torch.empty_like(s.node_weight)
                s.buffers_version = batch.version
                fresh = True
            if s.sys_mask is not None:
                self._write_stage_mask(s, batch, frozen)
            else:
                assert frozen is not None  # unmasked stages get buffers only for frozen atoms
                s.node_weight.copy_((~frozen).unsqueeze(-1))
            torch.mul(inv_mass, s.node_weight, out=s.weighted_inv_mass)
            self._publish(s, batch, inv_mass, version)
        self._publish_owner(batch, inv_mass, version)
        if not all([ctx.refresh_derived(systems_changed=fresh) for ctx in st.contexts]):
            st.graph_key = -1  # a derived value changed its layout: the step is captured anew
        st.constraints.write(batch, st.moves_cells)
        self._schedule_budget_check(batch)
        held = st.masks_status
        if held is None or held.shape != batch.status.shape or held.device != batch.status.device:
            st.masks_status = batch.status.clone()
        else:
            held.copy_(batch.status)
        st.masks_version, st.masks_stale = batch.version, False

    def _write_stage_mask(self, s: SubStage, batch: Batch, frozen: torch.Tensor | None) -> None:
        """Stage ``s``'s system mask and atom weights from the statuses, in place."""
        assert s.sys_mask is not None and s.node_weight is not None
        torch.eq(batch.status, s.code, out=s.sys_mask)
        if self.state.graduate_on_budget:
            s.sys_mask.logical_and_(batch.stage_steps < s.budget)
        atoms = s.sys_mask.index_select(0, batch.batch_idx)
        s.node_weight.copy_((atoms & ~frozen if frozen is not None else atoms).unsqueeze(-1))

    def may_write_in_step(self, batch: Batch | None) -> bool:
        """Whether this run's steps may rewrite the masks themselves: every stage can rebuild what
        it derives from them on the device, the masks are per stage (``masked``) with buffers
        written, and nothing reads them between a check and the next step's start (no hook before
        or inside the step, no fused stage's own hooks, no ``frozen`` atoms re-read at checks,
        no budget checks scheduled from them); on a GPU, a step captured as a graph."""
        st = self.state
        return (batch is not None and st.rewrites_masks_in_steps() and st.masked
                and not st.schedule_budgets and not st.extra_hooks and not st.inner_hooks
                and not st.table[int(DynamicsStage.BEFORE_STEP)] and not has_constraints(batch)
                and st.masks_status is not None
                and all(s.sys_mask is not None and s.node_weight is not None and s.weighted_inv_mass is not None
                        and s.dynamics.mask_values_in_step for s in st.subs))

    def write_in_step(self, batch: Batch) -> None:
        """The start of a step that rewrites the masks itself: each stage's mask, atom weights and
        weighted inverse masses from the statuses (same buffers and versions), the statuses they
        were written for, and the values derived from them (``StepContext.derived``)."""
        st = self.state
        assert st.masks_status is not None
        inv_mass = self.inv_mass(batch)
        for s in st.subs:
            assert s.weighted_inv_mass is not None and s.node_weight is not None
            self._write_stage_mask(s, batch, None)
            torch.mul(inv_mass, s.node_weight, out=s.weighted_inv_mass)
        st.masks_status.copy_(batch.status)
        for ctx in st.contexts:
            ctx.refresh_derived(systems_changed=False)

    def out_of_date(self, batch: Batch) -> bool:
        """Whether a status changed or systems came or went since the masks were written (atoms
        and components held fixed are reread at every check: a hook may have changed them)."""
        st = self.state
        return st.masks_stale or st.masks_version != batch.version or has_constraints(batch)

    def status_changed(self, batch: Batch) -> torch.Tensor:
        """``[]`` bool on the device: some status differs from the one the masks were written for
        (a hook may move systems between checks, as a ``ConvergenceHook`` run by itself does)."""
        held = self.state.masks_status
        if held is None or held.shape != batch.status.shape:
            return torch.ones((), dtype=torch.bool, device=batch.device)
        return (held != batch.status).any()

    def _publish(self, s: SubStage, batch: Batch, inv_mass: torch.Tensor, version: int) -> None:
        ctx = s.context
        ctx.batch = batch
        ctx.system_mask, ctx.node_weight, ctx.weighted_inv_mass = s.sys_mask, s.node_weight, s.weighted_inv_mass
        ctx.inv_mass = inv_mass
        ctx.version = version

    def _publish_owner(self, batch: Batch, inv_mass: torch.Tensor, version: int) -> None:
        """A fused stage's context: every system of any of its sub-stages. Kept only when the fused
        stage has hooks of its own (the only readers during a run), so other runs pay nothing."""
        st = self.state
        ctx = st.owner_context
        if any(ctx is s.context for s in st.subs):
            return
        ctx.batch, ctx.inv_mass, ctx.version = batch, inv_mass, version
        if not st.extra_hooks:
            ctx.system_mask = ctx.node_weight = ctx.weighted_inv_mass = None
            return
        masks = [s.sys_mask for s in st.subs if s.sys_mask is not None]
        weights = [s.node_weight for s in st.subs if s.node_weight is not None]
        if len(masks) != len(st.subs) or len(weights) != len(st.subs):
            ctx.system_mask, ctx.node_weight, ctx.weighted_inv_mass = None, None, inv_mass
            return
        system_mask, node_weight, weighted = ctx.system_mask, ctx.node_weight, ctx.weighted_inv_mass
        stale = st.owner_buffers_version != batch.version
        if stale or system_mask is None or node_weight is None or weighted is None:
            system_mask = torch.empty(batch.num_graphs, dtype=torch.bool, device=batch.device)
            node_weight = torch.empty(batch.num_nodes, 1, dtype=batch.positions.dtype, device=batch.device)
            weighted = torch.empty_like(node_weight)
            ctx.system_mask, ctx.node_weight, ctx.weighted_inv_mass = system_mask, node_weight, weighted
            st.owner_buffers_version = batch.version
        system_mask.copy_(masks[0])
        node_weight.copy_(weights[0])
        for m, w in zip(masks[1:], weights[1:]):
            system_mask.logical_or_(m)
            torch.maximum(node_weight, w, out=node_weight)
        torch.mul(inv_mass, node_weight, out=weighted)

    def _schedule_budget_check(self, batch: Batch) -> None:
        """Set ``budget_check`` to the step after which the first active system will have used
        its stage's budget (one read-back, where the masks are rewritten anyway)."""
        st = self.state
        st.budget_check = NEVER
        if not st.schedule_budgets or not batch.num_graphs:
            return
        steps = batch.stage_steps
        left = torch.full_like(steps, NEVER)
        for s in st.subs:
            torch.where(s.sys_mask, torch.clamp_min(s.budget - steps, 1).minimum(left), left, out=left)
        soonest = int(left.min())
        if soonest < NEVER:
            st.budget_check = st.step_count + soonest - 1

    def init_entering(self, batch: Batch, entering: torch.Tensor) -> None:
        """Let each stage set up integrator state for systems that just entered it.

        The systems changed before the masks are rewritten, so the contexts get a new version
        and inverse masses first, and drop their derived values: they describe the old layout.
        """
        st = self.state
        # Newcomers that keep their symmetry are refined to their group before any stage starts
        # from their cell (a cell filter takes it as its reference).
        st.constraints.symmetry.write(batch)
        if st.inv_mass_version != batch.version:
            inv_mass, version = self.inv_mass(batch), next_version()
            for ctx in st.contexts:
                ctx.batch, ctx.inv_mass, ctx.version = batch, inv_mass, version
                ctx.refresh_derived(systems_changed=True)
        status = batch.status
        for s in st.subs:
            s.dynamics.init_state(batch, entering & (status == s.code))

    def pass_empty_stages(self, batch: Batch) -> None:
        """Systems at the status of a stage with ``n_steps=0`` move straight on: such a stage
        takes no step (in stage order, so a run of empty stages is crossed at once)."""
        if not self.state.graduate_on_budget:
            return
        status = batch.status
        for s in self.state.subs:
            if s.budget == 0:
                status.masked_fill_(status == s.code, s.target)
