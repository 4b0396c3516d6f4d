"""buffer:warp gives bit-identical results to the torch ops for every dtype and row shape.

Each test runs on the CPU (Warp's CPU kernels, asked for explicitly) and, on a GPU machine, on
CUDA (the ``gpu``-marked parameter).
"""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data.buffer_ops import TorchBufferOps
from alchemi_core.errors import InvalidDataError
from alchemi_warp.buffer_ops import WarpBufferOps

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.float16, torch.uint8]
TRAILING = [(), (3,), (3, 3), (2,)]
TORCH = TorchBufferOps()


def ops_for(device: str) -> WarpBufferOps:
    return WarpBufferOps(allow_cpu=(device == "cpu"), every_op=True)


def random_rows(n: int, trailing: tuple[int, ...], dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    """Rows whose bit patterns exercise every byte: NaN payloads, -0.0, values above 2**32."""
    g = torch.Generator().manual_seed(seed)
    shape = (n, *trailing)
    if dtype == torch.bool:
        t = torch.rand(shape, generator=g) < 0.5
    elif dtype.is_floating_point:
        t = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
        flat = t.view(-1)
        specials = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf")], dtype=dtype)
        flat[: min(4, flat.numel())] = specials[: min(4, flat.numel())]
    else:
        hi = 2**40 if dtype == torch.int64 else (2**20 if dtype == torch.int32 else 255)
        lo = 0 if dtype == torch.uint8 else -hi
        t = torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)
    return t.to(device)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN == NaN when the payloads match; -0.0 != 0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("trailing", TRAILING, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gather_into_a_buffer_slice_matches_torch(device, dtype, trailing):
    src = random_rows(11, trailing, dtype, device)
    index = torch.tensor([10, 0, 3, 3, 7], device=device)
    buf_warp = random_rows(9, trailing, dtype, device, seed=1)
    buf_torch = buf_warp.clone()
    ops_for(device).gather(src, index, buf_warp[2:7])
    TORCH.gather(src, index, buf_torch[2:7])
    assert same_bits(buf_warp, buf_torch)  # rows outside the slice are untouched too


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_gather_shifted_matches_torch(device, dtype):
    src = random_rows(8, (2,), dtype, device)
    index = torch.tensor([7, 1, 1, 4], device=device)
    shift = torch.tensor([5, -3, 0, 2**33 if dtype == torch.int64 else 2**20], device=device)
    out_warp = torch.zeros(6, 2, dtype=dtype, device=device)
    out_torch = out_warp.clone()
    ops_for(device).gather_shifted(src, index, shift, out_warp[1:5])
    TORCH.gather_shifted(src, index, shift, out_torch[1:5])
    assert same_bits(out_warp, out_torch)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_shifted_on_floats_keeps_torch_semantics(device):
    src = random_rows(5, (2,), torch.float64, device)
    index = torch.tensor([4, 0], device=device)
    shift = torch.tensor([1, 2], device=device)
    out = torch.empty(2, 2, dtype=torch.float64, device=device)
    ops_for(device).gather_shifted(src, index, shift, out)
    expected = src[index] + shift.unsqueeze(-1)
    assert same_bits(out, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_misaligned_slices_fall_back_to_narrow_words(device):
    """A 3-byte bool row or a slice starting mid-word must still copy exactly."""
    ops = ops_for(device)
    big = random_rows(13, (3,), torch.bool, device)
    src = big[1:]  # starts 3 bytes into the storage
    out = torch.zeros(20, 3, dtype=torch.bool, device=device)
    index = torch.tensor([0, 11, 5], device=device)
    ops.gather(src, index, out[5:8])
    assert torch.equal(out[5:8], src[index]) and not out[:5].any() and not out[8:].any()
    f = torch.as_strided(random_rows(21, (), torch.float32, device), (10, 2), (2, 1), 1)  # 4-byte offset
    out32 = torch.zeros(3, 2, dtype=torch.float32, device=device)
    ops.gather(f, torch.tensor([9, 0, 4], device=device), out32)
    assert same_bits(out32, f[torch.tensor([9, 0, 4], device=device)])


@pytest.mark.parametrize("device", DEVICES)
def test_strided_source_is_copied_correctly(device):
    src = random_rows(6, (4,), torch.float32, device)[:, ::2]  # not contiguous
    out = torch.zeros(2, 2, device=device)
    ops_for(device).gather(src, torch.tensor([5, 1], device=device), out)
    assert same_bits(out, src[torch.tensor([5, 1], device=device)])


@pytest.mark.parametrize("device", DEVICES)
def test_zero_clears_every_dtype_in_place(device):
    tensors = [random_rows(7, trailing, dtype, device, seed=3) for dtype in DTYPES for trailing in TRAILING]
    tensors.append(random_rows(5, (3,), torch.float32, device)[:, 1])  # a strided view
    ptrs = [t.data_ptr() for t in tensors]
    ops_for(device).zero(tensors)
    for t, p in zip(tensors, ptrs):
        assert t.data_ptr() == p
        assert not t.any(), t.dtype
        if t.dtype.is_floating_point:
            assert not torch.signbit(t).any()  # +0.0, not -0.0


@pytest.mark.parametrize("device", DEVICES)
def test_empty_copies_are_no_ops(device):
    ops = ops_for(device)
    src = random_rows(3, (3,), torch.float32, device)
    out = torch.ones(0, 3, device=device)
    ops.gather(src, torch.zeros(0, dtype=torch.long, device=device), out)
    ops.gather(torch.zeros(0, 3, device=device), torch.zeros(0, dtype=torch.long, device=device), out)
    ops.zero([out, torch.zeros(0, dtype=torch.bool, device=device)])


def test_int32_indices_are_accepted():
    ops = ops_for("cpu")
    src = random_rows(4, (3,), torch.int64, "cpu")
    out = torch.zeros(2, 3, dtype=torch.int64)
    ops.gather(src, torch.tensor([3, 1], dtype=torch.int32), out)
    assert torch.equal(out, src[[3, 1]])


@pytest.mark.parametrize(
    ("src", "index", "out", "words"),
    [
        (torch.zeros(4, 3), torch.tensor([0, 1]), torch.zeros(2, 3, dtype=torch.float64), "same dtype"),
        (torch.zeros(4, 3), torch.tensor([0, 1]), torch.zeros(2, 2), "row shape"),
        (torch.zeros(4, 3), torch.tensor([0, 1, 2]), torch.zeros(2, 3), "one source row index"),
        (torch.zeros(4, 3), torch.tensor([[0, 1]]), torch.zeros(2, 3), "one source row index"),
        (torch.zeros(4, 3), torch.tensor([0.0, 1.0]), torch.zeros(2, 3), "integer tensor"),
    ],
)
def test_mismatched_arguments_name_the_problem(src, index, out, words):
    with pytest.raises(InvalidDataError, match=words):
        ops_for("cpu").gather(src, index, out)


def test_shift_must_have_one_entry_per_row():
    with pytest.raises(InvalidDataError, match="one shift per row"):
        ops_for("cpu").gather_shifted(
            torch.zeros(3, 2, dtype=torch.long), torch.tensor([0, 1]), torch.tensor([1]), torch.zeros(2, 2, dtype=torch.long)
        )


def test_supports_cuda_only_unless_cpu_is_asked_for():
    assert not WarpBufferOps().supports("cpu")
    assert WarpBufferOps(allow_cpu=True).supports(torch.device("cpu"))
    assert not WarpBufferOps(allow_cpu=True).supports("meta")
    if not torch.cuda.is_available():
        assert not WarpBufferOps().supports("cuda")


@pytest.mark.gpu
def test_core_picks_warp_for_cuda():
    from alchemi_core.data.buffer_ops import buffer_ops_for

    assert isinstance(buffer_ops_for(torch.device("cuda")), WarpBufferOps)


def test_by_default_only_shifted_gathers_run_as_warp_kernels(monkeypatch):
    """The measured split: plain gathers and zeroing go to torch, index shifts to Warp."""
    from alchemi_core import warp_runtime

    launched = []
    real_run = warp_runtime.launch_tensors
    monkeypatch.setattr(warp_runtime, "launch_tensors", lambda kernel, *a, **k: (launched.append(kernel.key), real_run(kernel, *a, **k)))
    ops = WarpBufferOps(allow_cpu=True)
    src = torch.arange(12, dtype=torch.int64).reshape(6, 2)
    out = torch.zeros(3, 2, dtype=torch.int64)
    ops.gather(src, torch.tensor([5, 0, 2]), out)
    ops.zero([out])
    assert launched == [] and out.sum() == 0
    ops.gather_shifted(src, torch.tensor([5, 0, 2]), torch.tensor([100, 100, 100]), out)
    assert len(launched) == 1 and "shifted" in launched[0]
    assert out.tolist() == [[110, 111], [100, 101], [104, 105]]
    every = WarpBufferOps(allow_cpu=True, every_op=True)
    every.gather(src, torch.tensor([1]), out[:1])
    every.zero([out])
    assert len(launched) == 3
