"""model:sevennet against SevenNet's own ASE calculator, pinned 7net-0 values, and the engine."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from ase.build import bulk

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.errors import ConfigurationError
from alchemi_potentials.testing import (
    compare_with_calculator,
    reference_structures,
    relax_then_md,
)

#: 7net-0 energies per atom (eV) of ideal fcc Cu (a = 3.61 Å) and diamond Si (a = 5.43 Å), as
#: SevenNetCalculator gives them (sevenn 0.13.0, CPU).
PINNED = {"Cu": -4.096191883087158, "Si": -5.400829792022705}


def test_float32_batch_equals_sevennet_calculator(seven_net):
    from sevenn.calculator import SevenNetCalculator

    calc = SevenNetCalculator("7net-0", device="cpu")
    compare_with_calculator(seven_net, calc, reference_structures(), torch.float32,
                            energy_tol=2e-4, force_tol=2e-5, stress_tol=1e-6)


def test_chunked_evaluation_equals_sevennet_calculator():
    """Systems in chunks of at most 20 atoms (three chunks), one forward and backward each."""
    from alchemi_sevennet import SevenNetModel
    from sevenn.calculator import SevenNetCalculator

    chunked = SevenNetModel("7net-0", chunk_atoms=20)
    calc = SevenNetCalculator("7net-0", device="cpu")
    compare_with_calculator(chunked, calc, reference_structures(), torch.float32,
                            energy_tol=2e-4, force_tol=2e-5, stress_tol=1e-6)
    chunked(Batch.from_atoms(reference_structures(), dtype=torch.float32))
    assert [c.num_nodes for c in chunked.chunking.chunks] == [32, 16, 17]


def test_cuequivariance_asked_for_is_never_a_quiet_fallback():
    """sevenn itself would warn and stay on e3nn; alchemi says what is missing."""
    from alchemi_sevennet import SevenNetModel

    from alchemi_core.errors import MissingDependencyError

    if importlib.util.find_spec("cuequivariance_torch") is None:
        with pytest.raises(MissingDependencyError, match="pip install cuequivariance-torch"):
            SevenNetModel("7net-0", enable_cueq=True)
    elif not torch.cuda.is_available():
        with pytest.raises(ConfigurationError, match="only where CUDA is available"):
            SevenNetModel("7net-0", enable_cueq=True)
    else:
        assert SevenNetModel("7net-0", enable_cueq=True).uses_cueq


def test_cuequivariance_is_not_used_unasked_on_a_cpu():
    from alchemi_sevennet import SevenNetModel

    model = SevenNetModel("7net-0")
    if not torch.cuda.is_available():
        # The memory estimate is asked before the first batch and looks ahead to the kernels.
        assert model.bytes_per_atom() == SevenNetModel.BYTES_PER_ATOM
    model(Batch.from_atoms(reference_structures()[:1], dtype=torch.float32))
    assert not model.uses_cueq and "cuequivariance" not in repr(model)
    assert model.bytes_per_atom() == SevenNetModel.BYTES_PER_ATOM


def test_a_failed_rebuild_on_cuequivariance_unasked_keeps_e3nn(monkeypatch):
    """Unasked, the rebuild at the first GPU call is sevenn's converter: when it fails, the model
    warns and gives e3nn's results."""
    from alchemi_sevennet import SevenNetModel

    batch = Batch.from_atoms(reference_structures()[:2], dtype=torch.float32)
    expected = SevenNetModel("7net-0", enable_cueq=False)(batch)["forces"]
    model = SevenNetModel("7net-0")

    def broken(**kwargs):
        raise RuntimeError("no cuequivariance layer for this block")

    monkeypatch.setattr(model._checkpoint, "build_model", broken)
    monkeypatch.setattr(model._kernels, "settle", lambda device: True)  # as on a GPU with the kernels
    with pytest.warns(UserWarning, match="staying on e3nn.*no cuequivariance layer"):
        forces = model(batch)["forces"]
    assert not model.uses_cueq
    torch.testing.assert_close(forces, expected, rtol=0, atol=1e-6)


def test_7net_0_energies_per_atom_are_pinned(seven_net):
    cu = bulk("Cu", "fcc", a=3.61, cubic=True)
    si = bulk("Si", "diamond", a=5.43, cubic=True)
    out = seven_net(Batch.from_atoms([cu, si], dtype=torch.float32))
    per_atom = out["energy"][:, 0] / torch.tensor([len(cu), len(si)])
    assert per_atom[0].item() == pytest.approx(PINNED["Cu"], abs=2e-5)
    assert per_atom[1].item() == pytest.approx(PINNED["Si"], abs=2e-5)


def test_padding_edges_add_nothing(seven_net):
    """A much larger edge capacity (more padding) leaves every result unchanged."""
    from alchemi_sevennet import SevenNetModel

    roomy = SevenNetModel("7net-0", max_edges=5_000)
    batch = Batch.from_atoms(reference_structures()[:2], dtype=torch.float32)
    a, b = seven_net(batch, compute_stress=True), roomy(batch, compute_stress=True)
    assert roomy.edge_list.capacity == 5_000 > seven_net.edge_list.capacity
    for key in ("energy", "forces", "stress"):
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6)


def test_a_direct_call_refuses_what_a_run_refuses(seven_net):
    """A zero-volume cell gave a finite, wrong energy and zero forces; an element 7net-0 lacks,
    sevenn's "Class values must be non-negative"; 119 is no element at all."""
    from alchemi_core.errors import InvalidDataError

    si = bulk("Si", "diamond", a=5.43, cubic=True)
    flat = si.copy()
    flat.cell[2] = flat.cell[0] + flat.cell[1]
    with pytest.raises(InvalidDataError, match=r"sevennet: systems \[0\] have a periodic cell with zero volume"):
        seven_net(Batch.from_atoms([flat], dtype=torch.float32))
    for z, message in ((86, r"no parameters for atomic numbers \[86\]"), (119, r"atomic numbers \[119\] are unknown")):
        batch = Batch.from_atoms([si], dtype=torch.float32)
        batch.atomic_numbers[0] = z
        with pytest.raises(InvalidDataError, match=message):
            seven_net(batch)
    molecule = Batch.from_atoms([bulk("Si", "diamond", a=5.43)], dtype=torch.float32)
    molecule.pbc.zero_()
    molecule.cell.zero_()
    with pytest.raises(InvalidDataError, match=r"stress was asked of systems \[0\]"):
        seven_net(molecule, compute_stress=True)


def test_bad_arguments_are_configuration_errors():
    with pytest.raises(ConfigurationError, match="float32 only"):
        registry.build("model:sevennet", dtype="float64")
    with pytest.raises(ConfigurationError, match="neither a pretrained name"):
        registry.build("model:sevennet", model="7net-nonexistent")
    with pytest.raises(ConfigurationError, match="one fidelity"):
        registry.build("model:sevennet", modal="mpa")


def test_sevennet_plus_d3_is_the_sum_of_its_parts(seven_net):
    pytest.importorskip("torch_dftd")
    d3 = {"component": "model:d3", "cutoff": 10.0, "cn_cutoff": 8.0}
    total = registry.build("model:sum", parts=[seven_net, d3])
    batch = Batch.from_atoms(reference_structures()[:2], dtype=torch.float32)
    out = total(batch)
    alone = seven_net(batch)["energy"] + registry.build("model:d3", cutoff=10.0, cn_cutoff=8.0)(batch)["energy"]
    torch.testing.assert_close(out["energy"], alone)


def test_a_workflow_file_sums_sevennet_and_d3_each_with_its_own_arguments(seven_net, tmp_path):
    """The part that names its checkpoint under model (model:sevennet's own argument)."""
    pytest.importorskip("torch_dftd")
    from alchemi_core.workflow import build_plan, parse_workflow

    workflow = parse_workflow("""
[model]
component = "model:sum"

[[model.parts]]
component = "model:sevennet"
model = "7net-0"

[[model.parts]]
component = "model:d3"
cutoff = 10.0
cn_cutoff = 8.0

[[stage]]
component = "integrator:fire"
n_steps = 1
""", base=tmp_path)
    total = build_plan(workflow, device="cpu").model
    batch = Batch.from_atoms(reference_structures()[:2], dtype=torch.float32)
    alone = seven_net(batch)["energy"] + registry.build("model:d3", cutoff=10.0, cn_cutoff=8.0)(batch)["energy"]
    torch.testing.assert_close(total(batch)["energy"], alone)


@pytest.mark.timeout(900)  # 7net-0 is a large network for two CPU cores
@pytest.mark.parametrize("inflight", [False, True], ids=["fused", "inflight"])
def test_fire_then_langevin(seven_net, inflight):
    # small cells: 7net-0 is a large network for two CPU cores
    cu = bulk("Cu", "fcc", a=3.61, cubic=True)
    si = bulk("Si", "diamond", a=5.43, cubic=True)
    ch4 = reference_structures()[2]
    for i, atoms in enumerate((cu, si)):
        atoms.rattle(0.05, seed=i)
    relax_then_md(seven_net, [cu, si, ch4], torch.float32, inflight=inflight, fire_steps=3, md_steps=3)
