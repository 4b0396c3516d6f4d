"""Random-weight ORB networks and structures for tests of model:orb (this plugin's, and the GPU's).

Example:
    >>> [len(a) for a in mixed_structures()]
    [16, 8, 5, 12]
"""

from __future__ import annotations

import os
from typing import Any

import torch

#: A small orb-v3: the published architecture with narrower layers and two message passes.
SMALL = {"latent_dim": 32, "base_mlp_hidden_dim": 64, "head_mlp_hidden_dim": 32, "num_message_passing_steps": 2}


def saved_and_loaded(kind: str, directory: str | os.PathLike[str], seed: int, dtype: torch.dtype = torch.float32,
                     **shape: Any) -> tuple[Any, Any]:
    """An orb-v3 ``kind`` ("conservative" or "direct") network with random weights (``seed``),
    saved as a state dict in ``directory`` and read back by orb-models' ``load_model``, with the
    adapter of its published models (6 Å, 120 neighbours). ``shape`` overrides :data:`SMALL`'s
    arguments of the architecture function (or adds others: ``has_charge_spin_cond=True``)."""
    from orb_models.forcefield import pretrained
    from orb_models.forcefield.forcefield_adapter import ForcefieldAtomsAdapter

    architecture = getattr(pretrained, f"orb_v3_{kind}_architecture")
    torch.manual_seed(seed)
    path = os.path.join(directory, f"orb-{kind}-{seed}.ckpt")
    shape = {**SMALL, **shape}
    torch.save(architecture(device="cpu", **shape).state_dict(), path)
    default, matmul = torch.get_default_dtype(), torch.get_float32_matmul_precision()
    try:
        network = pretrained.load_model(architecture(device="cpu", **shape), path, device="cpu",
                                        precision="float64" if dtype == torch.float64 else "float32-highest",
                                        compile=False)
    finally:  # orb-models' loader sets both for the whole process
        torch.set_default_dtype(default)
        torch.set_float32_matmul_precision(matmul)
    return network, ForcefieldAtomsAdapter(radius=6.0, max_num_neighbors=120)


def mixed_structures(seed: int = 0, rattle: float = 0.05) -> list[Any]:
    """Rattled SiC (16 atoms) and NaCl (8) crystals, CH4 in a 9 Å box (open) and a Cu(111) slab
    (12 atoms) with 7 Å of vacuum on each side, periodic in all three directions (ORB takes no
    partly periodic systems)."""
    from ase.build import bulk, fcc111, molecule

    sic = bulk("SiC", "zincblende", a=4.36, cubic=True).repeat((2, 1, 1))
    nacl = bulk("NaCl", "rocksalt", a=5.64, cubic=True)
    ch4 = molecule("CH4")
    ch4.set_cell([9.0, 9.0, 9.0])
    ch4.center()
    slab = fcc111("Cu", size=(2, 2, 3), vacuum=7.0)
    slab.pbc = True
    out = [sic, nacl, ch4, slab]
    for i, atoms in enumerate(out):
        atoms.rattle(rattle, seed=seed + i)
    return out
