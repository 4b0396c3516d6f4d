"""``warp_runtime.view``: the Warp view ``wp.from_torch`` makes, built from the tensor's own
pointer, shape and strides (a run makes a hundred views), used by kernels the same way."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from alchemi_core import warp_runtime
from alchemi_core.testing.fixtures import CPU_AND_GPU

wp = pytest.importorskip("warp")  # the kernel below reads it in its annotations

DEVICES = CPU_AND_GPU


@wp.kernel
def add_index(a: wp.array2d(dtype=wp.int32)):
    i, j = wp.tid()
    a[i, j] = a[i, j] + i * 100 + j


def _cases(device: str) -> list[tuple[str, torch.Tensor, object]]:
    base = torch.arange(60, dtype=torch.float32, device=device)
    return [
        ("int32", torch.arange(7, dtype=torch.int32, device=device), None),
        ("bool", torch.tensor([True, False, True], device=device), None),
        ("vec3 rows", base.view(20, 3), wp.vec3f),
        ("vec3 every other row", base.view(20, 3)[::2], wp.vec3f),
        ("vec3 rows of a wider table", base.view(15, 4)[:, :3], wp.vec3f),
        ("vec3 from row 5", base.view(20, 3)[5:], wp.vec3f),
        ("mat33 float64", torch.zeros((4, 3, 3), dtype=torch.float64, device=device), wp.mat33d),
        ("transposed int32", torch.zeros((5, 7), dtype=torch.int32, device=device).t(), None),
        ("row of a table", torch.zeros((4, 9), dtype=torch.int32, device=device)[2], None),
        ("empty", torch.zeros((0, 3), device=device), wp.vec3f),
        ("float64 scalars", torch.zeros(5, dtype=torch.float64, device=device), wp.float64),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_views_equal_warps_own_for_every_kind_of_tensor(device):
    for name, tensor, dtype in _cases(device):
        ours = [warp_runtime.view(tensor, dtype) for _ in range(2)]  # the first call learns the pairing
        theirs = wp.from_torch(tensor, dtype=dtype) if dtype is not None else wp.from_torch(tensor)
        for view in ours:
            assert (view.ptr, view.shape, view.strides, view.dtype, view.is_contiguous, str(view.device)) == (
                theirs.ptr, theirs.shape, theirs.strides, theirs.dtype, theirs.is_contiguous, str(theirs.device)
            ), name


@pytest.mark.parametrize("device", DEVICES)
def test_a_kernel_writes_through_a_strided_view_into_the_tensor(device):
    table = torch.zeros((6, 5), dtype=torch.int32, device=device)
    transposed = table.t()  # [5, 6], strides (1, 5): not contiguous
    for _ in range(2):
        view = warp_runtime.view(transposed)
    wp.launch(add_index, dim=transposed.shape, inputs=[view], device=view.device)
    i, j = torch.meshgrid(torch.arange(5), torch.arange(6), indexing="ij")
    assert torch.equal(transposed.cpu(), (i * 100 + j).to(torch.int32))


def test_a_view_keeps_its_tensors_memory_alive():
    tensor = torch.arange(5, dtype=torch.int32)
    warp_runtime.view(tensor)
    view = warp_runtime.view(tensor)
    ref = weakref.ref(tensor)
    del tensor
    gc.collect()
    assert ref() is not None
    assert view.numpy().tolist() == [0, 1, 2, 3, 4]


def test_bad_pairings_raise_warps_own_errors_every_time():
    for _ in range(2):
        with pytest.raises(RuntimeError, match="inner shape is"):
            warp_runtime.view(torch.zeros(4, 2), wp.vec3f)
        with pytest.raises(RuntimeError, match="Cannot convert Torch type"):
            warp_runtime.view(torch.zeros(4, dtype=torch.float64), wp.vec3f)
    warp_runtime.view(torch.zeros(4, 3), wp.vec3f)
    with pytest.raises(RuntimeError, match="not contiguous"):
        warp_runtime.view(torch.zeros(3, 6)[:, ::2], wp.vec3f)


def test_a_tensor_that_needs_a_gradient_gets_warps_view_with_its_gradient():
    tensor = torch.zeros(4, 3, requires_grad=True)
    view = warp_runtime.view(tensor, wp.vec3f)
    assert view.requires_grad and view.grad is not None
