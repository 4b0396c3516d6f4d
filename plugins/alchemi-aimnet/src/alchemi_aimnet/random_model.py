"""AIMNet2 networks with random weights, saved as aimnet's own model files (the ``.pt`` format
that ``aimnet export`` writes and ``AIMNet2Calculator`` loads), for tests and benchmarks: aimnet
ships no weights.

The network is the released wB97M-D3 architecture (aimnet's ``aimnet2_dftd3_wb97m.yaml``): the
learned short-range part with a short-range Coulomb term embedded, and the long-range Coulomb and
DFT-D3(BJ) terms left to the calculator, as in the published models.

Example:
    >>> import tempfile, os
    >>> path = random_aimnet2_file(os.path.join(tempfile.mkdtemp(), "random.pt"), seed=0)
    >>> sorted(torch.load(path, weights_only=True)["implemented_species"])[:3]
    [1, 6, 7]
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence

import numpy as np
import torch

#: Elements the random networks have parameters for (H, C, N, O, F, S, Cl).
SPECIES: tuple[int, ...] = (1, 6, 7, 8, 9, 16, 17)


def random_aimnet2_file(path: str | os.PathLike[str], seed: int = 0, species: Sequence[int] = SPECIES,
                        config: str = "aimnet2_dftd3_wb97m.yaml", spin_polarised: bool = False) -> str:
    """Build an AIMNet2 network with seeded random weights and save it at ``path`` the way
    ``aimnet export`` does (torch's generator is restored afterwards).

    Args:
        path: Where to write the ``.pt`` file.
        seed: Seed of the weights and of the per-element energy shifts.
        species: Atomic numbers with parameters (others are NaN, as in aimnet's exports).
        config: One of aimnet's model configurations (``aimnet/models/*.yaml``).
        spin_polarised: Two charge channels (aimnet's NSE models: they read the spin multiplicity).

    Returns:
        ``path`` as a string.
    """
    import aimnet
    import yaml
    from aimnet.config import build_module
    from aimnet.models.artifact_validation import resolve_model_import_policy, validate_v2_artifact_with_policy
    from aimnet.models.utils import strip_lr_modules_from_yaml
    from aimnet.train.export_model import bake_sae_into_model, extract_cutoff, mask_not_implemented_species

    with open(os.path.join(os.path.dirname(aimnet.__file__), "models", config)) as f:
        full_config = yaml.safe_load(f)
    if spin_polarised:
        full_config["kwargs"]["num_charge_channels"] = 2
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        weights = build_module(copy.deepcopy(full_config)).state_dict()
    finally:
        torch.random.set_rng_state(state)
    # What aimnet export does: the long-range terms leave the network for the calculator.
    core, coulomb_mode, needs_dispersion, d3_params, sr_rc, sr_envelope, _ = strip_lr_modules_from_yaml(
        full_config, weights)
    core_yaml = yaml.dump(core, default_flow_style=False, sort_keys=False)
    network = build_module(copy.deepcopy(core))
    network.load_state_dict(weights, strict=False)  # the short-range Coulomb's rc is its config's
    rng = np.random.default_rng(seed)
    shifts = {int(z): -float(rng.uniform(10.0, 60.0)) for z in species}
    network = mask_not_implemented_species(bake_sae_into_model(network, shifts), sorted(shifts))
    embedded = coulomb_mode == "sr_embedded"
    artifact = {
        "format_version": 2, "model_yaml": core_yaml, "cutoff": extract_cutoff(network),
        "needs_coulomb": embedded, "needs_dispersion": needs_dispersion, "coulomb_mode": coulomb_mode,
        "coulomb_sr_rc": sr_rc if embedded else None, "coulomb_sr_envelope": sr_envelope if embedded else None,
        "d3_params": d3_params if needs_dispersion else None, "has_embedded_lr": embedded,
        "has_embedded_d3ts": False, "implemented_species": sorted(shifts), "state_dict": network.state_dict(),
    }
    validate_v2_artifact_with_policy(artifact, resolve_model_import_policy(None, "extend"), validation="canonical")
    torch.save(artifact, os.fspath(path))
    return os.fspath(path)
