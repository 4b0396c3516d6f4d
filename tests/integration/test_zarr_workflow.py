"""The seed's full workflow on the CPU: a Zarr dataset streamed through SizeAwareSampler and a
FusedStage of DemoDynamics into a ZarrData sink, with every structure accounted for exactly once.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("alchemi_zarr")

from alchemi_core.data import AtomicData  # noqa: E402
from alchemi_core.data.datapipes import AtomicDataZarrReader, AtomicDataZarrWriter, Dataset  # noqa: E402
from alchemi_core.dynamics import ConvergenceHook, DemoDynamics, SizeAwareSampler, ZarrData  # noqa: E402
from alchemi_core.models.demo import DemoModelWrapper  # noqa: E402

NUM_STRUCTURES = 200


def small_structure(i: int) -> AtomicData:
    g = torch.Generator().manual_seed(i)
    n = 2 + i % 5
    return AtomicData(
        atomic_numbers=torch.randint(1, 9, (n,), generator=g),
        positions=torch.randn(n, 3, generator=g) * 1.2,
    )


@pytest.fixture
def structures_zarr(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    AtomicDataZarrWriter("structures.zarr").write([small_structure(i) for i in range(NUM_STRUCTURES)])
    return tmp_path


@pytest.mark.parametrize(
    ("device", "asynchronous", "workers"),
    [
        ("cpu", False, 0),
        ("cpu", True, 0),
        ("cpu", False, 2),  # the store read in two worker processes
        pytest.param("cuda", True, 0, marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ]),
    ],
)
def test_every_structure_reaches_the_zarr_sink_exactly_once(structures_zarr, device, asynchronous, workers):
    model = DemoModelWrapper()
    reader = AtomicDataZarrReader("structures.zarr")
    dataset = Dataset(reader, device=device)
    sampler = SizeAwareSampler(dataset=dataset, max_atoms=1000, max_edges=5000, max_batch_size=32, workers=workers)
    output = ZarrData("results.zarr", capacity=100000, asynchronous=asynchronous)

    opt = DemoDynamics(
        model=model, n_steps=40, dt=1.0,
        sampler=sampler, refill_frequency=1,
        convergence_hook=ConvergenceHook.from_fmax(0.05),
        sinks=[output],
    )
    md = DemoDynamics(
        model=model, n_steps=40, dt=0.5,
        convergence_hook=ConvergenceHook(criteria=[{"key": "fmax", "threshold": 0.01}]),
    )
    fused = opt + md
    with fused:
        assert fused.run() is None  # with a sampler and sinks, the results are in the sinks
    output.close()
    assert sampler.worker_builds == (NUM_STRUCTURES if workers else 0)

    results = AtomicDataZarrReader("results.zarr")
    ids = [int(results[i].system_id) for i in range(len(results))]
    assert sorted(ids) == list(range(NUM_STRUCTURES))  # each exactly once
    for i in range(len(results)):
        done = results[i]
        start = small_structure(int(done.system_id))
        assert torch.equal(done.atomic_numbers, start.atomic_numbers)  # the right structure...
        assert not torch.equal(done.positions, start.positions)  # ...after it was simulated
        assert int(done.status) == 2  # graduated from both stages
        assert done.velocities.dtype == done.positions.dtype == torch.float32
    # The sink's batch view agrees with the reader's.
    assert sorted(ZarrData("results.zarr").read().system_id.tolist()) == list(range(NUM_STRUCTURES))


def test_seed_full_workflow_example_with_hooks(structures_zarr):
    """The seed's example as written (fewer steps), where alchemi-hooks provides its hooks."""
    hooks = pytest.importorskip("alchemi_core.dynamics.hooks")
    try:
        from alchemi_core.dynamics.hooks import LoggingHook, MaxForceClampHook, SnapshotHook
    except ImportError as exc:
        pytest.skip(f"alchemi-hooks is not installed: {exc}")
    del hooks

    model = DemoModelWrapper()
    reader = AtomicDataZarrReader("structures.zarr")
    dataset = Dataset(reader, device="cpu")
    sampler = SizeAwareSampler(dataset=dataset, max_atoms=1000, max_edges=5000, max_batch_size=32)
    output = ZarrData("results.zarr", capacity=100000)
    opt = DemoDynamics(
        model=model, n_steps=50, dt=1.0,
        sampler=sampler, refill_frequency=1,
        convergence_hook=ConvergenceHook.from_fmax(0.05),
        hooks=[MaxForceClampHook(max_force=10.0)],
    )
    md = DemoDynamics(
        model=model, n_steps=100, dt=0.5,
        convergence_hook=ConvergenceHook(criteria=[{"key": "fmax", "threshold": 0.01}]),
        hooks=[
            LoggingHook(backend="csv", log_path="md_log.csv", frequency=100),
            SnapshotHook(sink=output, frequency=50),
        ],
    )
    fused = opt + md
    with fused:
        fused.run()
    snapshots = AtomicDataZarrReader("results.zarr")
    assert len(snapshots) > 0
    assert {int(snapshots[i].system_id) for i in range(len(snapshots))} <= set(range(NUM_STRUCTURES))
