"""MACE networks with random weights shaped like MACE-MP-0 "small" (89 elements, r_max 6 Å,
``128x0e``, two interactions, correlation 3, l_max 3), for tests and the W7 benchmark (mace-torch
ships no weights).

Example:
    >>> net = mace_mp_small_like(seed=0, channels=8, max_ell=1, correlation=2)
    >>> float(net.r_max), len(net.atomic_numbers)
    (6.0, 89)
"""

from __future__ import annotations

import torch

from alchemi_mace.imports import import_mace


def mace_mp_small_like(seed: int = 0, *, channels: int = 128, max_ell: int = 3, correlation: int = 3,
                       num_interactions: int = 2, r_max: float = 6.0, num_elements: int = 89,
                       dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """A ``ScaleShiftMACE`` with seeded random weights (MACE-MP-0 small's shape by default).

    Args:
        seed: Seed of the weights (torch's generator is restored afterwards).
        channels: Hidden scalar channels (``{channels}x0e``).
        max_ell: Highest spherical harmonic of the edges.
        correlation: Body order of the products.
        num_interactions: Message-passing layers.
        r_max: Cutoff in Å.
        num_elements: Elements 1..num_elements.
        dtype: Floating-point dtype of the weights.
    """
    import_mace()
    import numpy as np
    from e3nn import o3
    from mace import modules

    state = torch.random.get_rng_state()
    previous = torch.get_default_dtype()
    try:
        torch.manual_seed(seed)
        torch.set_default_dtype(dtype)
        z = list(range(1, num_elements + 1))
        rng = np.random.default_rng(seed)
        net = modules.ScaleShiftMACE(
            r_max=r_max, num_bessel=8, num_polynomial_cutoff=5, max_ell=max_ell,
            interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            interaction_cls_first=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            num_interactions=num_interactions, num_elements=num_elements,
            hidden_irreps=o3.Irreps(f"{channels}x0e"), MLP_irreps=o3.Irreps("16x0e"),
            atomic_energies=-rng.uniform(0.5, 5.0, num_elements), avg_num_neighbors=60.0,
            atomic_numbers=z, correlation=correlation, gate=torch.nn.functional.silu,
            radial_MLP=[64, 64, 64], atomic_inter_scale=0.8, atomic_inter_shift=-0.1,
        )
    finally:
        torch.set_default_dtype(previous)
        torch.random.set_rng_state(state)
    return net.to(dtype)
