"""``HookContract``: what every per-step hook must satisfy.

Subclass it in a plugin's tests and implement :meth:`HookContract.make_hook` (``self.tmp_path``
is a fresh directory for hooks that write files). The inherited tests check that the hook:

* is a valid hook (a ``DynamicsStage`` point, a frequency >= 1, callable; or ``parts`` that are);
* runs in a single stage, in float32 and float64, and leaves the positions finite;
* given to one sub-stage of a ``FusedStage``, leaves the systems of the other sub-stage exactly
  as they would be without it (a hook acts on its stage's ``context.system_mask`` only);
* runs as a fused stage's own hook (its ``dynamics`` is then the fused stage);
* can serve two runs in a row (state is reset in ``on_run_start``, files closed in
  ``on_run_end``);
* is freed, with its stage and the batch it last saw, as soon as the caller drops them (no
  reference cycle through the hook: ``alchemi_core.dynamics.weak``).

Set ``acts_only_on_its_stage = False`` for a hook whose documented job is to touch every system
(none of the first-party hooks), and ``run_kwargs`` for stage arguments it needs.

Example::

    class TestClamp(HookContract):
        def make_hook(self):
            return MaxForceClampHook(max_force=1.0)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from alchemi_core.data import Batch
from alchemi_core.dynamics.demo import DemoDynamics
from alchemi_core.dynamics.fused import FusedStage
from alchemi_core.dynamics.hook import check_hook, hook_parts
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.testing.factories import make_batch
from alchemi_core.testing.lifetime import collector_off, still_alive, watch


class HookContract:
    """Contract tests for a hook (see the module docstring). Implement ``make_hook()``."""

    device = "cpu"
    #: Steps of each test run.
    n_steps = 12
    #: False for a hook meant to act on every system whatever stage it is given to.
    acts_only_on_its_stage = True
    tmp_path: Path

    def make_hook(self) -> Any:  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    @pytest.fixture(autouse=True)
    def _hook_contract_tmp(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path

    def model(self) -> Any:
        from alchemi_core.models.demo import DemoModelWrapper

        return DemoModelWrapper()

    def batch(self, sizes: list[int] | None = None, dtype: torch.dtype = torch.float64) -> Batch:
        return make_batch(sizes or [3, 4, 2], dtype=dtype).to(self.device)

    def stage(self, hooks: list[Any], **kwargs: Any) -> DemoDynamics:
        return DemoDynamics(model=self.model(), n_steps=self.n_steps, dt=0.25, hooks=hooks, **kwargs)

    # ------------------------------------------------------------------ tests
    def test_is_a_valid_hook(self) -> None:
        hook = self.make_hook()
        check_hook(hook)
        for part in hook_parts(hook):
            assert isinstance(part.stage, DynamicsStage) or DynamicsStage(part.stage) is not None
            assert int(part.frequency) >= 1

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_runs_in_a_stage(self, dtype: torch.dtype) -> None:
        batch = self.batch(dtype=dtype)
        out = self.stage([self.make_hook()]).run(batch)
        assert out is not None and out.positions.dtype == dtype
        assert bool(torch.isfinite(out.positions).all())

    def test_leaves_the_systems_of_other_stages_alone(self) -> None:
        if not self.acts_only_on_its_stage:
            pytest.skip("this hook acts on every system by design")
        results = []
        for hooks in ([], [self.make_hook()]):
            batch = self.batch([3, 4, 2, 5])
            # Systems 0 and 2 stay in stage 0 (huge budget), 1 and 3 run stage 1 with the hook.
            batch.set_field("status", torch.tensor([0, 1, 0, 1], device=batch.device), "system")
            first = DemoDynamics(model=self.model(), n_steps=10**6, dt=0.25)
            second = self.stage(hooks)
            fused = FusedStage([(0, first), (1, second)])
            engine = fused.make_engine()
            fused._engine = engine
            engine.prepare(batch)
            engine.start_hooks()
            try:
                for _ in range(self.n_steps):
                    engine.step()
            finally:
                engine.end_hooks()
            results.append(batch)
        plain, hooked = results
        for name in ("positions", "velocities"):
            for row in (0, 2):
                a = plain.index_select([row])
                b = hooked.index_select([row])
                assert torch.equal(getattr(a, name), getattr(b, name)), (
                    f"the hook changed {name} of system {row}, which belongs to another stage"
                )

    def test_runs_as_a_fused_stage_hook(self) -> None:
        batch = self.batch()
        first = DemoDynamics(model=self.model(), n_steps=self.n_steps // 2, dt=0.25)
        second = DemoDynamics(model=self.model(), n_steps=self.n_steps // 2, dt=0.25)
        out = FusedStage([(0, first), (1, second)], hooks=[self.make_hook()]).run(batch)
        assert out is not None and bool(torch.isfinite(out.positions).all())

    def test_serves_two_runs_in_a_row(self) -> None:
        hook = self.make_hook()
        for _ in range(2):
            out = self.stage([hook]).run(self.batch())
            assert out is not None and bool(torch.isfinite(out.positions).all())

    def test_a_dropped_hook_is_freed_at_once(self) -> None:
        """A hook whose parts hold its own bound methods strongly, or that keeps the stage, forms
        a cycle: the batch it last saw then stays alive until the cycle collector runs."""
        with collector_off():
            hook = self.make_hook()
            stage = self.stage([hook])
            batch = self.batch()
            out = stage.run(batch)
            refs = watch(hook, stage, batch)
            del hook, stage, batch, out
            assert still_alive(refs) == []
