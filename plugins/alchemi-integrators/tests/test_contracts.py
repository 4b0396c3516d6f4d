"""Every integrator passes alchemi's integrator contract, on each backend available here."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from alchemi_core.data import Batch
from alchemi_core.testing.contracts import IntegratorContract
from alchemi_integrators import FIRE, FIRE2, NPTMTK, Langevin, NoseHooverChain, NPTCRescale, VelocityVerlet
from alchemi_integrators.base import warp_available

BACKENDS = ["torch"] + (["warp"] if warp_available() else [])


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


class _Contract(IntegratorContract):
    @pytest.fixture(autouse=True)
    def _backend(self, backend: str) -> None:
        self.integrator_kwargs = {**type(self).integrator_kwargs, "backend": backend}


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


class TestNoseHoover(_Contract):
    integrator_kwargs = {"temperature": 300.0, "tau": 20.0}

    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> NoseHooverChain:
        return NoseHooverChain(model=model, n_steps=n_steps, dt=0.5, **kwargs)


class TestFIRE(_Contract):
    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> FIRE:
        return FIRE(model=model, n_steps=n_steps, dt=0.5, **kwargs)


class TestFIRE2(_Contract):
    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> FIRE2:
        return FIRE2(model=model, n_steps=n_steps, dt=0.5, **kwargs)


# The same suites on a GPU (both backends); skipped without CUDA (conftest.py).
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
class TestFIREGpu(TestFIRE):
    device = "cuda"


@pytest.mark.gpu
class TestFIRE2Gpu(TestFIRE2):
    device = "cuda"


# Integrators that move cells: periodic argon cells and a model that gives stress (torch backend).
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


class TestNPTMTK(_CellContract):
    integrator_kwargs = {"temperature": 50.0, "tau_p": 200.0}

    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> NPTMTK:
        return NPTMTK(model=model, n_steps=n_steps, dt=5.0, **kwargs)


class TestNPTMTKAnisotropic(TestNPTMTK):
    integrator_kwargs = {"temperature": 50.0, "tau_p": 200.0, "anisotropic": True}


class TestNPTCRescale(_CellContract):
    deterministic = False
    integrator_kwargs = {"temperature": 50.0, "tau_p": 200.0, "random_seed": 2, "anisotropic": True}

    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> NPTCRescale:
        return NPTCRescale(model=model, n_steps=n_steps, dt=5.0, **kwargs)
