"""Held atoms and components in the core engine (``alchemi_core.dynamics.constraints``): every
stage, the core's demo integrator included, leaves them in place; a malformed field is refused."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.dynamics import DemoDynamics
from alchemi_core.errors import InvalidDataError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch
from alchemi_core.testing.contracts import assert_held, hold_some


def test_the_demo_integrator_leaves_held_components_in_place() -> None:
    batch = make_batch([3, 5], dtype=torch.float64)
    start, held = batch.positions.clone(), hold_some(batch)
    out = DemoDynamics(model=DemoModelWrapper(), n_steps=10, dt=0.5).run(batch)
    assert out is not None
    assert_held(out, held, start)


def test_frozen_axes_of_another_shape_are_refused_with_what_it_takes() -> None:
    batch = make_batch([3, 4])
    batch.set_field("frozen_axes", torch.zeros(7, 2, dtype=torch.bool), "node")
    with pytest.raises(InvalidDataError, match=r"'frozen_axes' has shape \(7, 2\).*\(7, 3\)"):
        DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5).run(batch)
