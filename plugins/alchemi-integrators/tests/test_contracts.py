"""Every integrator passes alchemi's integrator contract (its one implementation, Warp kernels)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from alchemi_core.data import Batch
from alchemi_core.dynamics import DynamicsStage
from alchemi_core.testing.contracts import IntegratorContract
from alchemi_integrators import (
    BFGS,
    CSVR,
    FIRE,
    FIRE2,
    LBFGS,
    NPH,
    NPTMTK,
    Langevin,
    NoseHooverChain,
    NPTCRescale,
    VelocityVerlet,
)

_AFTER_STEP = DynamicsStage.AFTER_STEP
_Contract = IntegratorContract


class TestVelocityVerlet(_Contract):
    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> VelocityVerlet:
        return VelocityVerlet(model=model, n_steps=n_steps, dt=0.5, **kwargs)


class TestVelocityVerletWarmStart(_Contract):
    """Velocities drawn for entering systems (as after a relaxation in a fused stage); the draw
    depends on the batch's layout, so trajectories are not compared across layouts."""

    deterministic = False
    integrator_kwargs = {"initial_temperature": 300.0, "random_seed": 3}

    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> VelocityVerlet:
        return VelocityVerlet(model=model, n_steps=n_steps, dt=0.5, **kwargs)


class TestLangevin(_Contract):
    deterministic = False
    integrator_kwargs = {"temperature": 300.0, "friction": 0.05, "random_seed": 1}

    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> Langevin:
        return Langevin(model=model, n_steps=n_steps, dt=0.5, **kwargs)


class TestLangevinFreeCentreOfMass(TestLangevin):
    """Noise not projected onto zero net momentum (``fix_com=False``): held atoms still hold."""

    integrator_kwargs = {**TestLangevin.integrator_kwargs, "fix_com": False}


class TestNoseHoover(_Contract):
    integrator_kwargs = {"temperature": 300.0, "tau": 20.0}

    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> NoseHooverChain:
        return NoseHooverChain(model=model, n_steps=n_steps, dt=0.5, **kwargs)


class TestCSVR(_Contract):
    deterministic = False
    integrator_kwargs = {"temperature": 300.0, "tau": 10.0, "random_seed": 1}

    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> CSVR:
        return CSVR(model=model, n_steps=n_steps, dt=0.5, **kwargs)


class TestFIRE(_Contract):
    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> FIRE:
        return FIRE(model=model, n_steps=n_steps, dt=0.5, **kwargs)


class TestFIRE2(_Contract):
    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> FIRE2:
        return FIRE2(model=model, n_steps=n_steps, dt=0.5, **kwargs)


class TestLBFGS(_Contract):
    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> LBFGS:
        return LBFGS(model=model, n_steps=n_steps, memory=5, **kwargs)


class TestBFGS(_Contract):
    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> BFGS:
        return BFGS(model=model, n_steps=n_steps, **kwargs)


# The same suites on a GPU; skipped without CUDA (conftest.py).
@pytest.mark.gpu
class TestVelocityVerletGpu(TestVelocityVerlet):
    device = "cuda"


@pytest.mark.gpu
class TestLangevinGpu(TestLangevin):
    device = "cuda"


@pytest.mark.gpu
class TestNoseHooverGpu(TestNoseHoover):
    device = "cuda"


@pytest.mark.gpu
class TestCSVRGpu(TestCSVR):
    device = "cuda"


@pytest.mark.gpu
class TestFIREGpu(TestFIRE):
    device = "cuda"


@pytest.mark.gpu
class TestFIRE2Gpu(TestFIRE2):
    device = "cuda"


@pytest.mark.gpu
class TestLBFGSGpu(TestLBFGS):
    device = "cuda"


@pytest.mark.gpu
class TestBFGSGpu(TestBFGS):
    device = "cuda"


# Integrators that move cells: periodic argon cells and a model that gives stress.
class _CellContract(IntegratorContract):
    def model(self) -> Any:
        from integrators_testkit.lj_reference import ReferenceLJ

        return ReferenceLJ()

    def batch(self, sizes: list[int], dtype: torch.dtype = torch.float64) -> Batch:
        from integrators_testkit.lj_reference import argon

        cells = [argon(2, rattle=0.05, seed=i, dtype=dtype) for i in range(len(sizes))]
        return Batch.from_data_list(cells).to(self.device)


class TestFIRECellFilter(_CellContract):
    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> FIRE:
        return FIRE(model=model, n_steps=n_steps, dt=2.0, cell_filter="frechet", **kwargs)


class TestFIRE2UnitCellFilter(_CellContract):
    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> FIRE2:
        return FIRE2(model=model, n_steps=n_steps, dt=2.0, cell_filter="unit", hydrostatic_strain=True, **kwargs)


class TestLBFGSCellFilter(_CellContract):
    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> LBFGS:
        return LBFGS(model=model, n_steps=n_steps, cell_filter="frechet", **kwargs)


class TestBFGSUnitCellFilter(_CellContract):
    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> BFGS:
        return BFGS(model=model, n_steps=n_steps, cell_filter="unit", **kwargs)


class TestNPTMTK(_CellContract):
    integrator_kwargs = {"temperature": 50.0, "tau_p": 200.0}

    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> NPTMTK:
        return NPTMTK(model=model, n_steps=n_steps, dt=5.0, **kwargs)


class TestNPTMTKAnisotropic(TestNPTMTK):
    integrator_kwargs = {"temperature": 50.0, "tau_p": 200.0, "anisotropic": True}


class TestNPH(_CellContract):
    integrator_kwargs = {"temperature": 50.0, "tau_p": 200.0, "pressure": 0.001}

    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> NPH:
        return NPH(model=model, n_steps=n_steps, dt=5.0, **kwargs)


class TestNPTCRescale(_CellContract):
    deterministic = False
    integrator_kwargs = {"temperature": 50.0, "tau_p": 200.0, "random_seed": 2, "anisotropic": True}

    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> NPTCRescale:
        return NPTCRescale(model=model, n_steps=n_steps, dt=5.0, **kwargs)


@pytest.mark.parametrize("fix_com", [True, False])
def test_langevin_keeps_a_slabs_fixed_atoms(fix_com: bool) -> None:
    """An argon slab whose bottom layer carries ASE's ``FixAtoms``, at 50 K with 5 fs steps: the
    bottom layer stays exactly where it was, with zero velocity, while the rest moves."""
    from ase.build import fcc111
    from ase.constraints import FixAtoms
    from integrators_testkit.lj_reference import ReferenceLJ

    from alchemi_core.testing.contracts import assert_held

    slab = fcc111("Ar", size=(2, 2, 3), a=5.26, vacuum=6.0)
    slab.set_constraint(FixAtoms(mask=slab.get_tags() == 3))
    batch = Batch.from_atoms([slab, slab], dtype=torch.float64)
    start = batch.positions.clone()
    Langevin(ReferenceLJ(), n_steps=20, dt=5.0, temperature=50.0, friction=0.01, fix_com=fix_com,
             initial_temperature=50.0, random_seed=0).run(batch)
    assert_held(batch, batch.frozen.unsqueeze(-1).expand(-1, 3), start)


@pytest.mark.gpu
@pytest.mark.parametrize("contract", [TestFIRECellFilter, TestFIRE2UnitCellFilter, TestLBFGSCellFilter,
                                      TestBFGSUnitCellFilter, TestNPTMTK, TestNPTMTKAnisotropic,
                                      TestNPH, TestNPTCRescale])
def test_held_coordinates_follow_the_cell_on_gpu(contract: type) -> None:
    """Cell filters and barostats with held atoms and components on a GPU."""
    case = contract()
    case.device = "cuda"
    case.test_held_atoms_and_components_never_move()


def test_a_variable_cell_relaxation_then_md_carries_held_atoms_then_keeps_them_exactly() -> None:
    """FIRE with a Frechet cell filter fused with Langevin: held atoms follow the cell while it
    relaxes (fractional coordinates kept), then stay bit for bit once the cell stops changing,
    although the fused stage moves cells."""
    from integrators_testkit.lj_reference import ReferenceLJ, argon

    from alchemi_core.testing.contracts import hold_some

    batch = Batch.from_data_list([argon(2, rattle=0.05, seed=s) for s in range(2)])
    batch.cell.mul_(1.03)
    batch.positions.mul_(1.03)
    held = hold_some(batch)
    frames: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def record(b: Batch, dynamics: Any) -> None:
        frames.append((b.positions.clone(), b.cell.clone(), b.status.clone()))

    record.stage, record.frequency = _AFTER_STEP, 1  # type: ignore[attr-defined]
    relax = FIRE(ReferenceLJ(), n_steps=8, dt=2.0, cell_filter="frechet")
    md = Langevin(ReferenceLJ(), n_steps=8, dt=2.0, temperature=50.0, random_seed=0)
    fused = relax + md
    fused.hooks.append(record)
    out = fused.run(batch)
    assert out is not None and out.status.tolist() == [2, 2]  # both went through both stages
    in_md = 0
    for (x0, cell0, status0), (x1, cell1, status1) in zip(frames, frames[1:]):
        for s in range(2):
            atoms = batch.batch_idx == s
            h = held & atoms.unsqueeze(-1)
            if int(status0[s]) == 1 and int(status1[s]) == 1:
                assert torch.equal(cell0[s], cell1[s]) and torch.equal(x0[h], x1[h])
                in_md += 1
            elif int(status0[s]) == 0 and int(status1[s]) == 0:
                frac0 = x0[atoms] @ torch.linalg.inv(cell0[s])
                frac1 = x1[atoms] @ torch.linalg.inv(cell1[s])
                whole = h[atoms].all(dim=1)
                torch.testing.assert_close(frac1[whole], frac0[whole], rtol=0, atol=1e-12)
    assert in_md >= 10
