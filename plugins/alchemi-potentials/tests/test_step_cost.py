"""What a step costs besides its kernels: which torch operations run, and the Warp bridge's
handling of launches Warp cannot make."""

from __future__ import annotations

import pytest
import torch
from ase.build import bulk
from torch.utils._python_dispatch import TorchDispatchMode

from alchemi_core import warp_runtime as _warp
from alchemi_core.data import Batch
from alchemi_core.errors import MissingDependencyError
from alchemi_potentials import LennardJones, pair_potential
from alchemi_potentials.neighbors import BatchedNeighborList

#: Torch operations a step may make: views and the bin-end cumulative sum into its buffer.
ALLOWED = {"aten.slice.Tensor", "aten.cumsum.out", "aten.copy_.default"}


class RecordOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def w1_batch(copies: int, dtype=torch.float32) -> Batch:
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)
    batch = Batch.from_atoms([atoms] * copies, dtype=dtype)
    for name, shape, level in (("forces", tuple(batch.positions.shape), "node"), ("energy", (copies, 1), "system"),
                               ("stress", (copies, 3, 3), "system")):
        batch.set_field(name, torch.zeros(shape, dtype=dtype), level)
    return batch


@pytest.mark.parametrize("fold", [False, True], ids=["direct", "folded"])
def test_steps_make_only_views_and_the_bin_sum(monkeypatch, fold):
    """No allocation per step: after the first forward for a set of systems, steady steps and
    rebuilding steps alike run Warp kernels and nothing in torch but views and an ``out=`` sum."""
    if fold:
        monkeypatch.setattr(pair_potential, "DIRECT_TOTALS_UP_TO", 0)
    batch = w1_batch(4)
    batch.set_field("pbc", batch.pbc.to(torch.int32), "system")  # a non-bool pbc is copied, not cast anew
    model = LennardJones(0.0104, 3.405, 8.5125, skin=0.5, max_neighbors=100)
    model(batch, compute_stress=True)
    step = torch.full_like(batch.positions, 0.2)  # beyond skin/2: every other step rebuilds
    builds = model.neighbor_list.builds(batch).clone()
    for k in range(4):
        batch.positions.add_(step if k % 2 else -step)
        with RecordOps() as record:
            out = model(batch, compute_stress=True)
        assert set(record.ops) <= ALLOWED, f"step {k}: {sorted(set(record.ops) - ALLOWED)}"
        assert out["forces"] is batch.forces and out["stress"] is batch.stress
    assert (model.neighbor_list.builds(batch) - builds).tolist() == [4] * 4


def test_launches_over_no_threads_are_dropped():
    from alchemi_potentials.pair_kernels import zero_forces

    wp = _warp.warp()
    forces = wp.zeros(0, dtype=wp.vec3f, device="cpu")
    seq = _warp.LaunchSequence(forces.device)
    seq.add(zero_forces, 0, [forces])
    seq.add(zero_forces, (0, 4), [forces])
    assert len(seq) == 0
    seq.run()


def test_a_launch_warp_cannot_prepare_raises_instead_of_recording_none(monkeypatch):
    """Warp returns no launch when a kernel's module failed to build for the device (e.g. a
    Warp without its CPU compiler): the sequence must say so, not replay None later."""
    from alchemi_potentials.pair_kernels import zero_forces

    wp = _warp.warp()
    forces = wp.zeros(3, dtype=wp.vec3f, device="cpu")
    monkeypatch.setattr(wp, "launch", lambda *args, **kwargs: None)
    seq = _warp.LaunchSequence(forces.device)
    with pytest.raises(_warp.KernelLaunchError, match="could not prepare kernel .*zero_forces.* building or loading"):
        seq.add(zero_forces, 3, [forces])


def test_a_warp_without_cpu_backend_is_named_for_cpu_batches(monkeypatch):
    wp = _warp.warp()
    monkeypatch.setattr(wp, "is_cpu_available", lambda: False)
    batch = w1_batch(1, torch.float64)
    with pytest.raises(MissingDependencyError, match="cannot run kernels on the CPU.*batch.to\\('cuda'\\)"):
        BatchedNeighborList(6.0).update(batch)
