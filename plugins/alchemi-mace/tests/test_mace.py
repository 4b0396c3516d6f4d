"""model:mace against MACE's own ASE calculator, and inside alchemi's engine."""

from __future__ import annotations

import pickle

import pytest
import torch
from alchemi_mace import MaceModel

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_potentials.testing import (
    compare_with_calculator,
    reference_structures,
    relax_then_md,
)


def test_float64_batch_equals_mace_calculator(mp_small_file):
    from mace.calculators import MACECalculator

    model = MaceModel(model_path=mp_small_file, trust_model_file=True, dtype="float64")
    calc = MACECalculator(model_paths=str(mp_small_file), device="cpu", default_dtype="float64")
    worst = compare_with_calculator(model, calc, reference_structures(), torch.float64,
                                    energy_tol=1e-8, force_tol=1e-8, stress_tol=1e-8)
    assert worst["forces"] < 1e-8


def test_chunked_evaluation_equals_mace_calculator(mp_small_file):
    """Systems in chunks of at most 20 atoms (the 32-atom bulk alone, the 16-atom crystal, the
    5-atom molecule with the 12-atom slab), one forward and backward each: still MACE's results."""
    from mace.calculators import MACECalculator

    model = MaceModel(model_path=mp_small_file, trust_model_file=True, dtype="float64", chunk_atoms=20)
    calc = MACECalculator(model_paths=str(mp_small_file), device="cpu", default_dtype="float64")
    compare_with_calculator(model, calc, reference_structures(), torch.float64,
                            energy_tol=1e-8, force_tol=1e-8, stress_tol=1e-8)
    model(Batch.from_atoms(reference_structures(), dtype=torch.float64))
    assert [c.num_nodes for c in model.chunking.chunks] == [32, 16, 17]


def test_float32_positions_run_a_float64_model(mp_small_file):
    model = MaceModel(model_path=mp_small_file, trust_model_file=True, dtype="float64")
    atoms = reference_structures()[:2]
    out32 = model(Batch.from_atoms(atoms, dtype=torch.float32))
    out64 = model(Batch.from_atoms(atoms, dtype=torch.float64))
    assert out32["forces"].dtype == torch.float32
    torch.testing.assert_close(out32["energy"].double(), out64["energy"], rtol=1e-6, atol=1e-5)


def test_a_model_file_is_only_unpickled_when_trusted(mp_small_file):
    with pytest.raises(ConfigurationError, match="trust_model_file=True"):
        MaceModel(model_path=mp_small_file)
    with pytest.raises(ConfigurationError, match="trust_model_file=True"):
        registry.build("model:mace", model_path=str(mp_small_file), trust_model_file="yes")
    with pytest.raises(ConfigurationError, match="exactly one"):
        MaceModel()


def test_unknown_head_and_species_are_errors(tiny_net):
    with pytest.raises(ConfigurationError, match="no head 'omat'"):
        MaceModel(tiny_net, head="omat")
    model = MaceModel(tiny_net)
    from ase import Atoms

    with pytest.raises(InvalidDataError, match="atomic numbers \\[92\\]"):
        model.check_batch(Batch.from_atoms([Atoms("U2", positions=[[0, 0, 0], [0, 0, 2.5]])]))


def test_checkpoints_stay_safe_to_load_after_import_mace(tmp_path):
    """``import mace`` sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1; alchemi's loads must still refuse code."""
    import os

    from alchemi_core.dynamics import checkpoint

    assert os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD") == "1"
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    bad = tmp_path / "bad.ckpt"
    torch.save({"format": "alchemi-checkpoint", "state": Payload()}, bad)
    with pytest.raises(pickle.UnpicklingError, match="(?i)weights.only"):
        torch.load(bad, weights_only=True)  # what alchemi's loads pass, explicitly
    with pytest.raises(Exception):  # noqa: B017 - any refusal will do, as long as nothing ran
        checkpoint.load(bad)
    assert not marker.exists(), "loading a checkpoint ran code from it"


@pytest.mark.parametrize("inflight", [False, True], ids=["fused", "inflight"])
def test_fire_then_langevin(tiny_net, inflight):
    model = MaceModel(tiny_net, dtype="float64")
    structures = reference_structures()[:3]
    relax_then_md(model, structures, torch.float64, inflight=inflight, fire_steps=8, md_steps=8)


def test_chunked_fire_then_langevin_follows_the_whole_batch(tiny_net):
    structures = reference_structures()[:3]
    whole = relax_then_md(MaceModel(tiny_net, dtype="float64"), structures, torch.float64, inflight=False,
                          fire_steps=8, md_steps=8)
    chunked = relax_then_md(MaceModel(tiny_net, dtype="float64", chunk_atoms=20), structures, torch.float64,
                            inflight=False, fire_steps=8, md_steps=8)
    torch.testing.assert_close(chunked.positions, whole.positions, rtol=0, atol=1e-9)


def test_cuequivariance_kernels_give_mace_calculator_results(mp_small_file):
    """The network converted to cuEquivariance (its plain-torch code on a CPU; on a GPU its CUDA
    kernels, tests/test_gpu.py) still gives MACE's e3nn results, and torch's default dtype is
    left as it was."""
    pytest.importorskip("cuequivariance_torch")
    from mace.calculators import MACECalculator

    model = MaceModel(model_path=mp_small_file, trust_model_file=True, dtype="float64", enable_cueq=True)
    calc = MACECalculator(model_paths=str(mp_small_file), device="cpu", default_dtype="float64")
    before = torch.get_default_dtype()
    compare_with_calculator(model, calc, reference_structures(), torch.float64,
                            energy_tol=1e-8, force_tol=1e-8, stress_tol=1e-8)
    assert model.uses_cueq and "cuequivariance" in repr(model)
    assert torch.get_default_dtype() == before


def test_cuequivariance_is_not_used_unasked_on_a_cpu(tiny_net):
    model = MaceModel(tiny_net, dtype="float64")
    model(Batch.from_atoms(reference_structures()[:1], dtype=torch.float64))
    assert not model.uses_cueq


def test_a_failed_conversion_unasked_keeps_e3nn_and_asked_is_an_error(tiny_net, monkeypatch):
    """The converter is mace-torch's: when it fails, a model that was not told to use
    cuEquivariance warns and stays on e3nn; one that was told raises, naming the cause."""
    pytest.importorskip("cuequivariance_torch")
    import mace.cli.convert_e3nn_cueq as converter

    def broken(*args, **kwargs):
        raise AttributeError("no buffer_num_segments")

    monkeypatch.setattr(converter, "run", broken)
    batch = Batch.from_atoms(reference_structures()[:1], dtype=torch.float64)
    asked = MaceModel(tiny_net, dtype="float64", enable_cueq=True)
    with pytest.raises(ConfigurationError, match="no buffer_num_segments"):
        asked(batch)
    from alchemi_mace.model import to_cueq

    with pytest.warns(UserWarning, match="staying on e3nn"):
        kept = to_cueq(tiny_net, torch.device("cpu"), required=False)
    assert kept is tiny_net


def test_the_memory_estimate_follows_the_kernels_the_network_will_run_on(tiny_net):
    """A sampler asks before the first batch, so the estimate looks ahead to the conversion."""
    assert MaceModel(tiny_net, dtype="float32", enable_cueq=False).bytes_per_atom() == MaceModel.BYTES_PER_ATOM
    assert MaceModel(tiny_net, dtype="float64", enable_cueq=True).bytes_per_atom() == 2 * MaceModel.BYTES_PER_ATOM_CUEQ
    from alchemi_potentials.cueq import cueq_kernels_installed

    unasked = MaceModel(tiny_net, dtype="float32")
    kernels = torch.cuda.is_available() and cueq_kernels_installed()
    assert unasked.bytes_per_atom() == (MaceModel.BYTES_PER_ATOM_CUEQ if kernels else MaceModel.BYTES_PER_ATOM)
    # Its first call is on a CPU, where it stays on e3nn, and the estimate follows.
    unasked(Batch.from_atoms(reference_structures()[:1], dtype=torch.float32))
    assert unasked.bytes_per_atom() == MaceModel.BYTES_PER_ATOM
