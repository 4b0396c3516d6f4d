"""On a GPU: the waits for the device that checks make, and what the host does meanwhile
(``readback``, ``SizeAwareSampler.prefetch``, deferred health checks of runs without checks)."""

from __future__ import annotations

import pytest
import torch
from ase.build import bulk

from alchemi_core import registry
from alchemi_core.data import AtomicData, Batch
from alchemi_core.dynamics import ConvergenceHook, FusedStage, HostMemory, SizeAwareSampler
from alchemi_core.testing.gpu import no_host_sync

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _model():
    return registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5, shift_energy=True)


class ArgonOnRequest:
    """Rattled argon cells of 32, 108 and 256 atoms, built when asked (as a file reader would)."""

    def __init__(self, count: int) -> None:
        self.repeats = [(2, 3, 4)[i % 3] for i in range(count)]
        self.built = 0

    def __len__(self) -> int:
        return len(self.repeats)

    def __getitem__(self, index: int) -> AtomicData:
        self.built += 1
        atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(self.repeats[index])
        atoms.rattle(0.1, seed=index)
        return AtomicData.from_atoms(atoms, dtype=torch.float32)

    def get_metadata(self, index: int) -> tuple[int, int]:
        return 4 * self.repeats[index] ** 3, 0


def _relax_then_md(prefetch: int) -> tuple[Batch, SizeAwareSampler]:
    dataset = ArgonOnRequest(60)
    sampler = SizeAwareSampler(dataset, max_atoms=1500, bin_width=16, prefetch=prefetch)
    model, sink = _model(), HostMemory(capacity=None)
    relax = registry.build("integrator:fire", model=model, n_steps=400, sampler=sampler, refill_frequency=5,
                           convergence_hook=ConvergenceHook.from_fmax(0.05, frequency=5))
    md = registry.build("integrator:langevin", model=model, n_steps=40, dt=2.0, temperature=50.0, friction=0.01,
                        random_seed=0, sinks=[sink], refill_frequency=5)
    fused = FusedStage([(0, relax), (1, md)]).compile()
    with fused:
        fused.run(sampler.build_initial_batch("cuda"))
    return sink.read(), sampler


def test_a_sampler_builds_structures_while_checks_wait_and_the_run_is_the_same() -> None:
    plain, _ = _relax_then_md(prefetch=0)
    ahead, sampler = _relax_then_md(prefetch=64)
    assert sampler.prefetched > 0  # some were built while a check waited for the GPU
    assert sorted(ahead.system_id.tolist()) == sorted(plain.system_id.tolist()) == list(range(60))
    assert (ahead.status == 2).all() and (plain.status == 2).all()
    order_a, order_p = ahead.system_id.argsort(), plain.system_id.argsort()
    torch.testing.assert_close(ahead.energy.view(-1)[order_a], plain.energy.view(-1)[order_p], rtol=1e-4, atol=1e-4)


def test_a_run_without_checks_does_not_wait_for_its_health_check() -> None:
    """A plain MD run looks for bad structures every 100 steps; the look does not synchronise
    (its codes are read at the next one), and a structure gone bad is still quarantined."""
    from alchemi_core.testing.exploding import ExplodingModel

    cells = [bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3) for _ in range(3)]
    batch = Batch.from_atoms(cells, dtype=torch.float32).to("cuda")
    stage = registry.build("integrator:langevin", model=ExplodingModel(_model(), explode=[1], after=20),
                           n_steps=1000, dt=2.0, temperature=50.0, friction=0.01, random_seed=0)
    for _ in range(50):
        stage.step(batch)
    with no_host_sync():  # across the look at step 99
        for _ in range(100):
            stage.step(batch)
    assert [(q.system_id, q.step) for q in stage.quarantined] == [(1, 99)]
    assert batch.status.tolist()[0] == 0 and batch.status.tolist()[2] == 0 and batch.status.tolist()[1] < 0
