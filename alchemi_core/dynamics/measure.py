"""A check's device work up to its one read-back: the engine's measuring layer.

Quarantine marked, ``fmax`` updated, convergence and budgets applied, and the flags the read-back
answers stacked, all on the device (:class:`~alchemi_core.dynamics.check_capture.Measurement`);
on a GPU under ``compile()`` replayed as a CUDA graph where it can be
(:mod:`~alchemi_core.dynamics.check_capture`). What the read-back says is acted on by
``admission.Admission.check``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from alchemi_core.dynamics.check_capture import Measurement, field_addresses
from alchemi_core.dynamics.force_max import system_force_max
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.dynamics.step import StepLoop

ON_CONVERGE = int(DynamicsStage.ON_CONVERGE)
#: Where the models' error flag sits in a measurement's flags (then one per stage: converged).
MODEL_FLAG = 5


class Measuring(StepLoop):
    """The measuring layer of the engine (see the module docstring)."""

    def _quarantine(self, k: int) -> bool:
        """A strict check's quarantine (``admission.Admission`` implements it)."""
        raise NotImplementedError

    def _update_fmax(self) -> None:
        """Each system's largest force norm, in a Warp kernel where it applies (``force_max``)."""
        b = self.batch
        assert b is not None
        if self.tuning().force_max_kernel and system_force_max(b.forces, b.batch_idx, b.fmax):
            return
        norms = torch.linalg.vector_norm(b.forces, dim=-1)
        b.fmax.zero_().scatter_reduce_(0, b.batch_idx, norms, reduce="amax", include_self=False)

    def _measure_check(self, k: int) -> Measurement:
        """The check's device work up to its read-back: replayed as a CUDA graph where it can be
        (:mod:`~alchemi_core.dynamics.check_capture`), eager otherwise."""
        if not self._may_capture_check():
            return self._measure(k, models=True)
        capture = self._check_capture
        batch = self.batch
        assert batch is not None
        due = self._criteria_due(k)
        held = self._masks_status
        key = (batch.version, due, field_addresses(batch),
               None if held is None else (held.data_ptr(), tuple(held.shape)))
        # Models' flags live in their own buffers: asked for outside the graph and written into
        # its last flag after the replay. Models that cannot flag verify once quarantine is marked.
        model_errors, unflagged = self._model_flags()
        m = capture.measure(key, lambda: self._measure(k, models=False))
        if model_errors is not None:
            m.model_flag.copy_(model_errors)
        if unflagged:
            self._verify_or_restore(lambda: [model.verify(batch) for model in unflagged], m.before)
        return m

    def _criteria_due(self, k: int) -> tuple[bool, ...]:
        """Per sub-stage: whether its convergence criteria are evaluated at step ``k``."""
        return tuple(s.conv is not None and k % s.conv.frequency == 0 for s in self.subs)

    def _may_capture_check(self) -> bool:
        batch = self.batch
        return (self._check_capture.enabled and self.graph_requested and batch is not None
                and batch.device.type == "cuda" and batch.num_graphs > 0 and not self.health.strict
                and all(c.custom_op is None for s in self.subs if s.conv is not None for c in s.conv.criteria))

    def _measure(self, k: int, models: bool) -> Measurement:
        """Quarantine marked, convergence and budgets applied, and the read-back's flags stacked,
        all on the device (``models``: ask the models for their error flags here, too)."""
        batch = self.batch
        assert batch is not None
        status = batch.status
        before = status.clone()
        # First: a model's own checks would stop at the structures that went bad. Marked on the
        # device; the records are read below, with the check's one read-back (strict: at once).
        codes = self._mark_quarantined(k)
        model_errors = self.model_error_flags() if models else None  # models that cannot flag verify now
        due = self._criteria_due(k)
        if self.track_fmax and any(due):
            self._update_fmax()
        none = status.new_zeros((), dtype=torch.bool)
        # Per stage: whether some system converged, for its ON_CONVERGE hooks, which run after
        # the read-back (Admission.check): a hook may read back, and the measurement must not.
        converged = [none] * len(self.subs)
        for i, (s, evaluated) in enumerate(zip(self.subs, due, strict=True)):
            if evaluated:
                assert s.conv is not None
                conv = s.conv.evaluate(batch) & (before == s.source) & (status == s.source)
                s.dynamics.converged_mask = conv
                status.masked_fill_(conv, s.target)
                if s.hooks[ON_CONVERGE]:
                    converged[i] = conv.any()
            if self.graduate_on_budget:
                done = (before == s.code) & (batch.stage_steps >= s.budget) & (status == s.code)
                status.masked_fill_(done, s.target)
        self._pass_empty_stages()
        moved = status != before
        flags = torch.stack([moved.any(), self._status_changed_since_masks(), self.active_mask().any(),
                             self.graduated_mask().all(), codes.any() if codes is not None else none,
                             model_errors.reshape(()) if model_errors is not None else none, *converged])
        return Measurement(before, moved, codes, flags, flags[MODEL_FLAG])

    def _verify_or_restore(self, verify: Callable[[], object], before: torch.Tensor) -> None:
        """Run ``verify`` (models' ``verify``); if it raises, the check takes no effect but the
        quarantine (which verify leaves out of its errors): statuses go back to ``before``."""
        try:
            verify()
        except Exception:
            assert self.batch is not None
            status = self.batch.status
            status.copy_(torch.where(status < 0, status, before))
            raise

    def _pass_empty_stages(self) -> None:
        """Systems at the status of a stage with ``n_steps=0`` move straight on: such a stage
        takes no step (in stage order, so a run of empty stages is crossed at once)."""
        if not self.graduate_on_budget or self.batch is None:
            return
        status = self.batch.status
        for s in self.subs:
            if s.budget == 0:
                status.masked_fill_(status == s.code, s.target)

    def _mark_quarantined(self, k: int) -> torch.Tensor | None:
        """The check's quarantine: failure statuses set on the device and the codes returned for
        the check's read-back (None: nothing to check, or ``strict``, which raised or found none)."""
        batch = self.batch
        if batch is None or batch.num_graphs == 0:
            return None
        if self.health.strict:
            self._quarantine(k)
            return None
        return self.health.mark(batch, self.active_mask())
