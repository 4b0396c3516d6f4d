"""TorchSim models for tests: TorchSim's own Lennard-Jones with argon's parameters, and a small
MACE network with random weights for MACE's TorchSim wrapper (mace-torch ships no weights;
it is a test dependency of this package).

Example:
    >>> round(float(lennard_jones().cutoff), 4)
    8.5125
"""

from __future__ import annotations

from typing import Any

import torch

#: Argon's Lennard-Jones parameters (eV, Å) with the cutoff TorchSim uses by default (2.5 sigma).
ARGON = {"sigma": 3.405, "epsilon": 0.0104, "cutoff": 2.5 * 3.405}


def lennard_jones(dtype: torch.dtype = torch.float64, stress: bool = True) -> Any:
    """TorchSim's ``LennardJonesModel`` with :data:`ARGON`'s parameters, on the CPU."""
    from torch_sim.models.lennard_jones import LennardJonesModel

    return LennardJonesModel(**ARGON, dtype=dtype, compute_stress=stress)


def small_mace(seed: int = 0, r_max: float = 4.5) -> torch.nn.Module:
    """A float64 ``ScaleShiftMACE`` of elements 1..30 with seeded random weights (torch's
    generator is restored afterwards)."""
    import mace  # noqa: F401 - before e3nn (mace-torch pins e3nn 0.4.4, which fails under torch >= 2.6 otherwise)
    import numpy as np
    from e3nn import o3
    from mace import modules

    state, previous = torch.random.get_rng_state(), torch.get_default_dtype()
    try:
        torch.manual_seed(seed)
        torch.set_default_dtype(torch.float64)
        block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
        net = modules.ScaleShiftMACE(
            r_max=r_max, num_bessel=8, num_polynomial_cutoff=5, max_ell=1, interaction_cls=block,
            interaction_cls_first=block, num_interactions=2, num_elements=30,
            hidden_irreps=o3.Irreps("8x0e + 8x1o"), MLP_irreps=o3.Irreps("8x0e"),
            atomic_energies=-np.random.default_rng(seed).uniform(0.5, 5.0, 30), avg_num_neighbors=20.0,
            atomic_numbers=list(range(1, 31)), correlation=2, gate=torch.nn.functional.silu,
            radial_MLP=[16, 16], atomic_inter_scale=0.8, atomic_inter_shift=-0.1,
        )
    finally:
        torch.set_default_dtype(previous)
        torch.random.set_rng_state(state)
    return net.double()


def mace_torchsim(seed: int = 0, stress: bool = True) -> Any:
    """MACE's own TorchSim wrapper (``MaceTorchSimModel``) around :func:`small_mace`, on the CPU."""
    net = small_mace(seed)
    from mace.calculators.mace_torchsim import MaceTorchSimModel

    return MaceTorchSimModel(net, device=torch.device("cpu"), dtype=torch.float64, compute_stress=stress)
