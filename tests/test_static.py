"""``integrator:static``: every structure evaluated once, inflight, equal to the model on it alone;
bad structures quarantined with their reason; ``alchemi_core.evaluate`` in input order."""

from __future__ import annotations

import pytest
import torch

from alchemi_core import registry
from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import ConvergenceHook, HostMemory, SizeAwareSampler
from alchemi_core.dynamics.quarantine import FAILED_ENERGY, FAILED_FORCES, QuarantineWarning
from alchemi_core.dynamics.static import Static
from alchemi_core.errors import ConfigurationError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import random_structures
from alchemi_core.testing.exploding import ExplodingModel

SIZES = [3, 7, 2, 5, 9, 4, 6, 3, 8, 2, 5]


class Counting(DemoModelWrapper):
    """The demo model, counting the systems it evaluates."""

    def __init__(self) -> None:
        super().__init__()
        self.systems = 0

    def forward(self, batch, compute_stress=False):  # type: ignore[no-untyped-def]
        self.systems += batch.num_graphs
        return super().forward(batch, compute_stress)


def _mixed() -> list[AtomicData]:
    structures = random_structures(SIZES, dtype=torch.float64)
    for i, d in enumerate(structures[::2]):  # every other one periodic, in a cubic cell
        d.cell = (10.0 + i) * torch.eye(3, dtype=torch.float64).unsqueeze(0)
        d.pbc = torch.tensor([[True, True, True]])
    return structures


def _run(structures: list[AtomicData], model, **kwargs) -> tuple[Batch, Static]:
    sampler = SizeAwareSampler(ListDataset(structures), max_atoms=14, max_batch_size=3, bin_width=1)
    sink = HostMemory(capacity=None)
    stage = Static(model, sampler=sampler, sinks=[sink], **kwargs)
    stage.run()
    out = sink.read()
    return out.index_select(torch.argsort(out.system_id.view(-1))), stage


def test_every_structure_once_equal_to_the_model_on_it_alone() -> None:
    structures = _mixed()
    model = Counting()
    out, stage = _run(structures, model)
    assert out.system_id.view(-1).tolist() == list(range(len(SIZES)))
    assert (out.status == 1).all() and stage.quarantined == []
    # One evaluation per structure: newcomers get no forward of their own before their step.
    assert model.systems == len(SIZES)
    for i, (d, alone) in enumerate(zip(out.to_data_list(), structures, strict=True)):
        ref = DemoModelWrapper()(Batch.from_data_list([alone]))
        torch.testing.assert_close(d.energy.view(-1), ref["energy"].view(-1), rtol=0, atol=1e-12, msg=f"system {i}")
        torch.testing.assert_close(d.forces, ref["forces"], rtol=0, atol=1e-12, msg=f"system {i}")
        torch.testing.assert_close(d.positions, alone.positions, rtol=0, atol=0)  # nothing moved


def test_a_structure_with_a_nan_is_quarantined_with_its_reason_and_the_rest_finish() -> None:
    structures = _mixed()
    with pytest.warns(QuarantineWarning, match="forces are not finite"):
        out, stage = _run(structures, ExplodingModel(DemoModelWrapper(), explode=[4]))
    assert out.system_id.view(-1).tolist() == list(range(len(SIZES)))
    assert [(q.system_id, q.reason) for q in stage.quarantined] == [(4, "forces are not finite; energy is not finite")]
    assert int(out.status[4]) == -(FAILED_FORCES | FAILED_ENERGY)
    assert (torch.cat([out.status[:4], out.status[5:]]) == 1).all()
    assert torch.isfinite(torch.cat([out.energy[:4], out.energy[5:]])).all()


def test_static_takes_no_convergence_criteria_and_is_in_the_registry() -> None:
    assert registry.resolve("integrator:static") is Static
    with pytest.raises(ConfigurationError, match="converges nothing"):
        Static(DemoModelWrapper(), convergence_hook=ConvergenceHook.from_fmax(0.1))


def test_stress_only_when_asked() -> None:
    class Stressed(DemoModelWrapper):
        asked: list[bool] = []

        def forward(self, batch, compute_stress=False):  # type: ignore[no-untyped-def]
            self.asked.append(compute_stress)
            out = super().forward(batch)
            if compute_stress:
                out["stress"] = torch.ones(batch.num_graphs, 3, 3, dtype=batch.positions.dtype)
            return out

    batch = Batch.from_data_list(random_structures([3, 4], dtype=torch.float64))
    Static(Stressed()).run(batch)
    assert Stressed.asked == [False] and "stress" not in batch
    Static(Stressed(), compute_stress=True).run(batch)
    assert Stressed.asked == [False, True] and batch.stress.shape == (2, 3, 3)


def test_evaluate_returns_atoms_in_input_order_with_reasons_for_those_it_cannot_evaluate() -> None:
    from ase import Atoms
    from ase.build import molecule

    from alchemi_core import evaluate

    model = DemoModelWrapper()
    names = ["H2O", "CH4", "C6H6", "NH3", "CO2", "C2H6"]
    structures = [molecule(n) for n in names]
    structures.insert(2, Atoms("H2", positions=[[0, 0, 0], [0, 0, 0.01]]))  # on top of each other
    structures.insert(4, Atoms("X2", positions=[[0, 0, 0], [0, 0, 1.0]]))  # no element (Z = 0)
    nan = molecule("H2O")
    nan.positions[0, 0] = float("nan")
    structures.append(nan)
    explodes = len(structures)  # its result is NaN
    structures.append(molecule("H2O"))
    bad = {2: "on top of each other", 4: "unknown", 8: "positions are not finite",
           9: "forces are not finite; energy is not finite"}
    with pytest.warns(QuarantineWarning):
        done = evaluate(structures, ExplodingModel(model, explode=[explodes]), dtype=torch.float64, max_atoms=20)
    assert [a.get_chemical_formula() for a in done] == [a.get_chemical_formula() for a in structures]
    assert [a.info["system_id"] for a in done] == list(range(len(structures)))
    for i, why in bad.items():
        assert why in done[i].info["quarantine"] and done[i].calc is None, (i, done[i].info)
    for i, (a, given) in enumerate(zip(done, structures, strict=True)):
        if i in bad:
            continue
        assert "quarantine" not in a.info
        ref = DemoModelWrapper()(Batch.from_atoms([given], dtype=torch.float64))
        assert a.get_potential_energy() == pytest.approx(float(ref["energy"]), abs=1e-12)
        assert a.get_forces() == pytest.approx(ref["forces"].numpy(), abs=1e-12)


def test_evaluate_is_quiet_unless_asked(capsys) -> None:
    from ase.build import molecule

    from alchemi_core import evaluate

    evaluate([molecule("H2O"), molecule("CH4")], DemoModelWrapper())
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_static_on_the_gpu_gives_the_cpus_results_once_each() -> None:
    structures = _mixed()
    cpu, _ = _run(structures, DemoModelWrapper())
    model = Counting().to("cuda")
    sampler = SizeAwareSampler(ListDataset(structures, device="cuda"), max_atoms=14, max_batch_size=3, bin_width=1)
    sink = HostMemory(capacity=None)
    Static(model, sampler=sampler, sinks=[sink]).run()
    gpu = sink.read().to("cpu")
    gpu = gpu.index_select(torch.argsort(gpu.system_id.view(-1)))
    assert gpu.system_id.view(-1).tolist() == list(range(len(SIZES))) and model.systems == len(SIZES)
    torch.testing.assert_close(gpu.energy, cpu.energy, rtol=0, atol=1e-12)
    torch.testing.assert_close(gpu.forces, cpu.forces, rtol=0, atol=1e-12)
