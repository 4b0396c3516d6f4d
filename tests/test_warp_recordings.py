"""Launches recorded from an earlier recording of the same kernel (``alchemi_core.warp_recordings``):
each runs on its own arguments, shares nothing with the recording it came from, keeps no array
alive, and picks the overload its arguments' types need."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch

from alchemi_core import warp_recordings, warp_runtime
from alchemi_core.testing.fixtures import CPU_AND_GPU

wp = pytest.importorskip("warp")  # kernels below are defined in functions: their annotations read it here

DEVICES = CPU_AND_GPU


@pytest.fixture(autouse=True)
def _reuse_everywhere(monkeypatch):
    # On for every device here: the GPU case is what decides whether CUDA may turn it on.
    for device_type in ("cpu", "cuda"):
        monkeypatch.setitem(warp_recordings.REUSE, device_type, True)


@wp.struct
class Scaled:
    values: wp.array(dtype=wp.float32)
    factor: wp.float32


@wp.kernel
def scale(s: Scaled):
    i = wp.tid()
    s.values[i] = s.values[i] * s.factor


def _kernels() -> tuple[Any, Any]:
    """Two kernels of their own (not recorded by any other test): a float32 ``y += a x`` and a
    generic ``y = x + x``."""
    @wp.kernel
    def axpy(x: wp.array(dtype=wp.float32), y: wp.array(dtype=wp.float32), a: wp.float32):
        i = wp.tid()
        y[i] = y[i] + a * x[i]

    @wp.kernel
    def double(x: wp.array(dtype=Any), y: wp.array(dtype=Any)):
        i = wp.tid()
        y[i] = x[i] + x[i]

    return axpy, double


def _sequence(device: str) -> warp_runtime.LaunchSequence:
    warp_runtime.warp()
    return warp_runtime.LaunchSequence(warp_runtime.warp_device(torch.device(device)))


def _kept(kernel: Any) -> int:
    return sum(1 for key in warp_recordings._recordings if key[0] is kernel)


@pytest.mark.parametrize("device", DEVICES)
def test_a_launch_recorded_from_an_earlier_one_runs_on_its_own_arguments(device):
    axpy, _ = _kernels()
    x1, y1 = torch.arange(5, dtype=torch.float32, device=device), torch.ones(5, device=device)
    x2, y2 = torch.full((9,), 10.0, device=device), torch.zeros(9, device=device)
    first, second = _sequence(device), _sequence(device)
    first.add(axpy, 5, [warp_runtime.view(x1), warp_runtime.view(y1), wp.float32(2.0)])
    assert _kept(axpy) == 1
    second.add(axpy, 9, [warp_runtime.view(x2), warp_runtime.view(y2), wp.float32(3.0)])
    assert _kept(axpy) == 1  # the second came from the first's recording
    second.run(warp_runtime.stream_for(torch.device(device)))
    first.run(warp_runtime.stream_for(torch.device(device)))  # untouched by the second
    second.run(warp_runtime.stream_for(torch.device(device)))
    torch.testing.assert_close(y1, 1.0 + 2.0 * x1)
    torch.testing.assert_close(y2, torch.full((9,), 60.0, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_each_overload_is_recorded_from_its_own_kind_of_arguments(device):
    _, double = _kernels()
    tiny = 1e-12  # lost in float32, kept in float64
    for _ in range(2):  # the second round comes from the first round's recordings
        for dtype in (torch.float64, torch.float32):
            x = torch.full((4,), 1.0 + tiny, dtype=dtype, device=device)
            y = torch.zeros(4, dtype=dtype, device=device)
            seq = _sequence(device)
            seq.add(double, 4, [warp_runtime.view(x), warp_runtime.view(y)])
            seq.run(warp_runtime.stream_for(torch.device(device)))
            torch.testing.assert_close(y, 2.0 * x, rtol=0.0, atol=0.0)
            if dtype == torch.float64:
                assert float(y[0]) - 2.0 == pytest.approx(2 * tiny, rel=1e-3)
    assert _kept(double) == 2


def test_a_kernel_of_a_struct_is_kept_once_whatever_struct_instance_it_gets():
    """Warp 1.5 gives every struct instance a class of its own: the recordings are keyed by the
    struct's definition, else each launch would record anew and keep one more recording."""
    outputs = []
    for factor in (2.0, 3.0):
        data = torch.ones(4)
        s = Scaled()
        s.values, s.factor = warp_runtime.view(data), factor
        seq = _sequence("cpu")
        seq.add(scale, 4, [s])
        seq.run()
        outputs.append(data)
    assert _kept(scale) == 1
    torch.testing.assert_close(outputs[0], torch.full((4,), 2.0))
    torch.testing.assert_close(outputs[1], torch.full((4,), 3.0))


def test_past_its_limit_the_store_of_recordings_starts_again(monkeypatch):
    monkeypatch.setattr(warp_recordings, "MAX_KEPT", 2)
    warp_recordings.forget()
    x, y = torch.ones(3), torch.zeros(3)
    for _ in range(3):
        axpy, _double = _kernels()  # a new kernel each time: a new key
        _sequence("cpu").add(axpy, 3, [warp_runtime.view(x), warp_runtime.view(y), wp.float32(1.0)])
    assert len(warp_recordings._recordings) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_kept_recording_keeps_no_array_alive(device):
    axpy, _ = _kernels()
    x, y = torch.ones(3, device=device), torch.zeros(3, device=device)
    seq = _sequence(device)
    seq.add(axpy, 3, [warp_runtime.view(x), warp_runtime.view(y), wp.float32(1.0)])
    alive = weakref.ref(x)
    del seq, x
    gc.collect()
    assert _kept(axpy) == 1 and alive() is None


def test_arguments_of_another_type_are_still_checked():
    axpy, _ = _kernels()
    x, y = torch.ones(3), torch.zeros(3)
    _sequence("cpu").add(axpy, 3, [warp_runtime.view(x), warp_runtime.view(y), wp.float32(1.0)])
    wrong = torch.ones(3, dtype=torch.int32)
    with pytest.raises(Exception, match="(?i)type|dtype|overload"):
        _sequence("cpu").add(axpy, 3, [warp_runtime.view(wrong), warp_runtime.view(y), wp.float32(1.0)])


def test_with_reuse_off_every_launch_is_recorded_by_warp(monkeypatch):
    monkeypatch.setitem(warp_recordings.REUSE, "cpu", False)
    axpy, _ = _kernels()
    x, y = torch.ones(3), torch.zeros(3)
    seq = _sequence("cpu")
    seq.add(axpy, 3, [warp_runtime.view(x), warp_runtime.view(y), wp.float32(4.0)])
    seq.run()
    assert _kept(axpy) == 0
    torch.testing.assert_close(y, torch.full((3,), 4.0))


@pytest.mark.parametrize("device", DEVICES)
def test_a_fire_relaxation_is_the_same_with_recordings_reused(monkeypatch, device):
    """The whole path (neighbour list, forces, FIRE; on a GPU the captured step) with recordings
    reused against Warp's own: the same relaxed positions."""
    from alchemi_core.data import Batch

    build = pytest.importorskip("ase.build")
    integrators = pytest.importorskip("alchemi_integrators")
    potentials = pytest.importorskip("alchemi_potentials")
    cells = []
    for seed in range(4):
        atoms = build.bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)
        atoms.rattle(0.1, seed=seed)
        cells.append(atoms)
    start = Batch.from_atoms(cells).to(device)

    def relax(reuse: bool) -> torch.Tensor:
        monkeypatch.setitem(warp_recordings.REUSE, torch.device(device).type, reuse)
        warp_recordings.forget()
        model = potentials.LennardJones(0.0104, 3.405, 8.5125, max_neighbors=160)
        fire = integrators.FIRE(model, n_steps=30)
        if device == "cuda":
            fire.compile()
        for _ in range(2):  # the second run's launches come from the first's recordings
            batch = start.clone()
            with fire:
                fire.run(batch)
        return batch.positions

    reused, fresh = relax(True), relax(False)
    assert float((reused - start.positions).abs().max()) > 1e-3  # the atoms moved
    torch.testing.assert_close(reused, fresh, rtol=0.0, atol=1e-5)
