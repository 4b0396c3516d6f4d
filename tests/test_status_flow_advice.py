"""With sub-stage codes that skip one ([0, 2]), the default exit status (-1: the number of
stages, 2) is a stage's code: the error advises a value that works, not the default that gave
it (issue 59, item 11)."""

from __future__ import annotations

import re

import pytest

from alchemi_core.dynamics import ConvergenceHook, DemoDynamics, FusedStage
from alchemi_core.errors import ConfigurationError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch


def _stages():
    conv = ConvergenceHook.from_fmax(1e6)  # converged at the first check: straight on
    return [(0, DemoDynamics(model=DemoModelWrapper(), n_steps=5, dt=0.5, convergence_hook=conv)),
            (2, DemoDynamics(model=DemoModelWrapper(), n_steps=5, dt=0.5))]


def test_the_advice_for_codes_that_skip_one_is_a_value_that_works():
    with pytest.raises(ConfigurationError) as err:
        FusedStage(_stages())
    message = str(err.value)
    assert "exit_status=-1" not in message and "the default, -1" in message
    advised = int(re.search(r"pass exit_status=(-?\d+)", message).group(1))
    assert advised == 3
    fused = FusedStage(_stages(), exit_status=advised)  # following the advice works
    out = fused.run(make_batch([3, 2]))
    assert out.status.tolist() == [3, 3]
