"""A check: its device work up to its one read-back, and what the host does with the answer.

At a check step the engine reads back from the device, the only place it does. Before that, on
the device (:meth:`Checks.measure`, replayed as a CUDA graph where it can be,
:mod:`~alchemi_core.dynamics.check_capture`): quarantine marked, ``fmax`` updated, convergence
criteria and budgets applied, and the flags the read-back answers stacked
(:class:`~alchemi_core.dynamics.check_capture.Measurement`). After it, on the host
(:meth:`Checks.check`): quarantined structures recorded, models' errors raised, ``ON_CONVERGE``
hooks run, systems that moved set up in their next stage, graduates handed to the sinks and
their slots refilled (``admission``), the masks rewritten where a status changed, and whether
the run is done. A run without checks still looks for structures that went bad
(:meth:`Checks.health_check`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from alchemi_core.data import Batch
from alchemi_core.dynamics.admission import Admission
from alchemi_core.dynamics.check_capture import Measurement, field_addresses
from alchemi_core.dynamics.force_max import system_force_max
from alchemi_core.dynamics.forward import model_flags, verify_models
from alchemi_core.dynamics.hook import dispatch
from alchemi_core.dynamics.masks import Masks
from alchemi_core.dynamics.quarantine import Quarantined
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.dynamics.state import RunState, SubStage

ON_CONVERGE = int(DynamicsStage.ON_CONVERGE)
#: Where the models' error flag sits in a measurement's flags (then one per stage: converged).
MODEL_FLAG = 5


class Checks:
    """The checks of a run (see the module docstring).

    Args:
        state: The run's state.
        masks: Rewritten where a check changed a status.
        admission: Hands graduates on and refills their slots.
    """

    def __init__(self, state: RunState, masks: Masks, admission: Admission) -> None:
        self.state, self.masks, self.admission = state, masks, admission

    def check(self, batch: Batch, k: int, ahead: Callable[[], None] | None = None) -> None:
        """Convergence, budgets, quarantine, graduation and refill after step ``k`` (the only
        device read-backs); ``ahead`` queues the next step before the read-back's wait."""
        st = self.state
        m = self.measure(batch, k)
        before = m.before
        # One read-back for all: did this check move systems, did anything (a hook between
        # checks too) change a status since the masks were written, is any system left to step,
        # has every system graduated, did any go bad, and has a model an error to raise?
        # The wait for it is the GPU finishing the steps queued since the last check: the sampler
        # builds the structures the next refills will likely take meanwhile.
        # Where nothing done below changes what the next step computes, it is queued before the
        # wait (step.StepLoop.step_ahead): the GPU works on it while the host acts on the flags.
        read = st.flags.read(m.flags, self._idle_work, ahead)
        any_moved, any_changed, any_active, all_graduated, any_bad, any_error = read[:MODEL_FLAG + 1]
        codes, moved = m.codes, m.moved
        read_at = batch.version
        if any_error:
            self._verify_or_restore(batch, lambda: verify_models(st.models, batch), before)
        if any_bad:
            assert codes is not None
            st.quarantined.extend(st.health.collect(batch, codes, k))
            self.start_masking()
        for s, converged in zip(st.subs, read[MODEL_FLAG + 1:], strict=True):
            if converged:  # as in nvalchemi, ON_CONVERGE hooks run only when something converged
                dispatch(s.hooks[ON_CONVERGE], batch, k)
        # The masks follow the statuses from the host unless the step ahead rewrote them already,
        # or the run's steps rewrite them at their start (CoreTuning.masks_in_step).
        if any_changed and not (ahead is not None or st.masks_in_step):
            st.masks_stale = True
        if any_moved:  # checks may read back; integrators' resets are not free
            _rest_after_optimisers(batch, st.subs, moved, before)
            batch.stage_steps.masked_fill_(moved, 0)
            if st.moves_enter_stages:
                self.masks.init_entering(batch, moved)
            # A captured step stays: the masks, and what the stages derived from them, are
            # rewritten in place below.
        if st.sampler is not None or st.sinks:
            if k % st.refill_frequency == 0:
                self.admission.graduate_and_refill(batch)
            elif k >= st.budget_check and not any_active:
                # A budget that ends between refill steps leaves its graduates in the batch, not
                # stepping, until the next refill step hands them on with the others: refilling
                # here too would admit systems out of step with the refill cadence. Only a batch
                # with nothing left to step is handed on and refilled at once (graduates left at
                # the end: Admission.flush_graduates).
                self.admission.graduate_and_refill(batch)
        if self.masks.out_of_date(batch):  # a refill rewrote them already; a quiet check keeps them
            self.masks.update(batch)
        # Nothing entered or left since the read-back: its answers still hold.
        self.admission.check_done(batch, (any_active, all_graduated) if batch.version == read_at else None)
        self.admission.flush_graduates(batch)

    def _idle_work(self) -> bool:
        """Host work while a check waits for the GPU: the sampler builds one structure ahead
        (False: nothing to do)."""
        sampler = self.state.sampler
        return sampler is not None and sampler.prefetch()

    # ------------------------------------------------------------------ the measurement
    def measure(self, batch: Batch, k: int) -> Measurement:
        """The check's device work up to its read-back: replayed as a CUDA graph where it can be
        (:mod:`~alchemi_core.dynamics.check_capture`), eager otherwise."""
        st = self.state
        if not self._may_capture(batch):
            return self._measure(batch, k, models=True)
        due = self._criteria_due(k)
        held = st.masks_status
        key = (batch.version, due, field_addresses(batch),
               None if held is None else (held.data_ptr(), tuple(held.shape)))
        # Models' flags live in their own buffers: asked for outside the graph and written into
        # its last flag after the replay. Models that cannot flag verify once quarantine is marked.
        model_errors, unflagged = model_flags(st.models, batch)
        m = st.check_capture.measure(key, lambda: self._measure(batch, k, models=False))
        if model_errors is not None:
            m.model_flag.copy_(model_errors)
        if unflagged:
            self._verify_or_restore(batch, lambda: verify_models(unflagged, batch), m.before)
        return m

    def _criteria_due(self, k: int) -> tuple[bool, ...]:
        """Per sub-stage: whether its convergence criteria are evaluated at step ``k``."""
        return tuple(s.conv is not None and k % s.conv.frequency == 0 for s in self.state.subs)

    def _may_capture(self, batch: Batch) -> bool:
        st = self.state
        return (st.check_capture.enabled and st.graph_requested and batch.device.type == "cuda"
                and batch.num_graphs > 0 and not st.health.strict
                and all(c.custom_op is None for s in st.subs if s.conv is not None for c in s.conv.criteria))

    def _measure(self, batch: Batch, k: int, models: bool) -> Measurement:
        """Quarantine marked, convergence and budgets applied, and the read-back's flags stacked,
        all on the device (``models``: ask the models for their error flags here, too; those that
        cannot flag verify now, which reads back)."""
        st = self.state
        status = batch.status
        before = status.clone()
        # First: a model's own checks would stop at the structures that went bad. Marked on the
        # device; the records are read below, with the check's one read-back (strict: at once).
        codes = self._mark_quarantined(batch, k)
        model_errors = None
        if models:
            model_errors, unflagged = model_flags(st.models, batch)
            verify_models(unflagged, batch)
        due = self._criteria_due(k)
        if st.track_fmax and any(due):
            self._update_fmax(batch)
        none = status.new_zeros((), dtype=torch.bool)
        # Per stage: whether some system converged, for its ON_CONVERGE hooks, which run after
        # the read-back (check): a hook may read back, and the measurement must not.
        converged = [none] * len(st.subs)
        for i, (s, evaluated) in enumerate(zip(st.subs, due, strict=True)):
            if evaluated:
                assert s.conv is not None
                conv = s.conv.evaluate(batch) & (before == s.source) & (status == s.source)
                s.dynamics.converged_mask = conv
                status.masked_fill_(conv, s.target)
                if s.hooks[ON_CONVERGE]:
                    converged[i] = conv.any()
            if st.graduate_on_budget:
                done = (before == s.code) & (batch.stage_steps >= s.budget) & (status == s.code)
                status.masked_fill_(done, s.target)
        self.masks.pass_empty_stages(batch)
        moved = status != before
        flags = torch.stack([moved.any(), self.masks.status_changed(batch), st.active_mask().any(),
                             st.graduated_mask().all(), codes.any() if codes is not None else none,
                             model_errors.reshape(()) if model_errors is not None else none, *converged])
        return Measurement(before, moved, codes, flags, flags[MODEL_FLAG])

    def _update_fmax(self, b: Batch) -> None:
        """Each system's largest force norm, in a Warp kernel where it applies (``force_max``)."""
        if self.state.tuning().force_max_kernel and system_force_max(b.forces, b.batch_idx, b.fmax):
            return
        norms = torch.linalg.vector_norm(b.forces, dim=-1)
        b.fmax.zero_().scatter_reduce_(0, b.batch_idx, norms, reduce="amax", include_self=False)

    @staticmethod
    def _verify_or_restore(batch: Batch, verify: Callable[[], object], before: torch.Tensor) -> None:
        """Run ``verify`` (models' ``verify``); if it raises, the check takes no effect but the
        quarantine (which verify leaves out of its errors): statuses go back to ``before``."""
        try:
            verify()
        except Exception:
            status = batch.status
            status.copy_(torch.where(status < 0, status, before))
            raise

    # ------------------------------------------------------------------ quarantine
    def _mark_quarantined(self, batch: Batch, k: int) -> torch.Tensor | None:
        """The check's quarantine: failure statuses set on the device and the codes returned for
        the check's read-back (None: nothing to check, or ``strict``, which raised or found none)."""
        st = self.state
        if batch.num_graphs == 0:
            return None
        if st.health.strict:
            self._quarantine(batch, k)
            return None
        return st.health.mark(batch, st.active_mask())

    def start_masking(self) -> None:
        """From now on each stage steps only its own systems (a failed system must not step). A
        step captured unmasked steps every system: the next step captures anew. A step captured
        masked stays: it reads the masks, which the next update rewrites in place."""
        st = self.state
        if st.masked:
            return
        st.masked = True
        for s in st.subs:
            s.buffers_version = -1  # masks allocated at the next update
        st.graph_key = -1

    def _quarantine(self, batch: Batch, k: int) -> bool:
        """Give structures that went bad their failure status (``quarantine``); True if any."""
        st = self.state
        if batch.num_graphs == 0:
            return False
        found = st.health.find(batch, st.active_mask(), k)
        if not found:
            return False
        st.quarantined.extend(found)
        self.start_masking()
        return True

    def health_check(self, batch: Batch, k: int) -> None:
        """The quarantine of a run without checks. Its codes are read at the next health check
        (:meth:`settle_health`), so the GPU's queue of steps never drains for it
        (:class:`~alchemi_core.dynamics.quarantine.PendingCodes`); ``strict`` raises at once."""
        st = self.state
        self.settle_health(batch)
        if batch.num_graphs == 0:
            return
        if st.health.strict:
            if self._quarantine(batch, k):
                self.masks.update(batch)
            return
        st.health_pending = st.health.start(batch, st.active_mask(), k)

    def settle_health(self, batch: Batch | None) -> None:
        """Act on the last health check's codes: bad systems get their status and records."""
        st = self.state
        pending, st.health_pending = st.health_pending, None
        if pending is None or batch is None:
            return
        found = st.health.settle(batch, pending)
        if found:
            st.quarantined.extend(found)
            self.start_masking()
            self.masks.update(batch)

    def quarantine_records(self) -> list[Quarantined]:
        """Every structure quarantined so far, a health check still on its way included."""
        self.settle_health(self.state.batch)
        return list(self.state.quarantined)


def _rest_after_optimisers(batch: Batch, subs: Sequence[SubStage], moved: torch.Tensor, before: torch.Tensor) -> None:
    """Systems leaving an optimiser (a stage whose ``velocities_are_physical`` is False, FIRE)
    leave at rest: its velocities are the minimiser's, not the atoms' (ASE keeps them apart too),
    so neither the next stage nor ``to_atoms`` of a relaxed structure inherits them."""
    for s in subs:
        if getattr(s.dynamics, "velocities_are_physical", True):
            continue
        left = moved & (before == s.code)
        batch.velocities.masked_fill_(left.index_select(0, batch.batch_idx).unsqueeze(-1), 0.0)
