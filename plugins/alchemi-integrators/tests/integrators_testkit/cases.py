"""Integrator configurations that test_backends.py (CPU) and test_gpu.py run on both backends."""

from __future__ import annotations

from typing import Any

import torch

from alchemi_core.dynamics import ConvergenceHook
from alchemi_integrators import CSVR, FIRE, FIRE2, Langevin, NoseHooverChain, VelocityVerlet

CASES: list[tuple[type, dict[str, Any]]] = [
    (VelocityVerlet, {"dt": torch.tensor([4.0, 5.0, 6.0], dtype=torch.float64)}),
    (NoseHooverChain, {"dt": 5.0, "temperature": torch.tensor([40.0, 50.0, 60.0]), "tau": 100.0}),
    (NoseHooverChain, {"dt": 5.0, "temperature": 50.0, "tau": 60.0, "yoshida_order": 5, "chain_steps": 2,
                       "chain_length": 4}),
    (Langevin, {"dt": 5.0, "temperature": 50.0, "friction": 0.0}),
    (CSVR, {"dt": 5.0, "temperature": torch.tensor([40.0, 50.0, 60.0]), "tau": 30.0, "random_seed": 2}),
    (FIRE, {"dt": 5.0, "dt_max": 40.0, "convergence_hook": ConvergenceHook.from_fmax(2e-3)}),
    (FIRE, {"dt": 5.0, "dt_max": 40.0, "maxstep": 0.05, "maxstep_scope": "system"}),
    (FIRE2, {"dt": 5.0, "dt_max": 40.0, "convergence_hook": ConvergenceHook.from_fmax(2e-3)}),
    (FIRE2, {"dt": 5.0, "dt_max": 40.0, "maxstep": 0.01, "maxstep_scope": "system", "half_step_back": False}),
]
