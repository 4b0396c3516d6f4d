"""Per-system sums in levels of chunks equal a plain per-system sum, whatever the sizes:
systems smaller than a chunk, exactly one chunk, spanning chunk and level-two boundaries, one
system of many chunks, a batch whose length is not a multiple of the chunk."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.workspace import Workspace

SIZES = {
    "one atom": [1],
    "under a chunk": [5],
    "many small": [1, 2, 3, 1, 7, 31, 1, 1, 33, 2] * 20,
    "chunk sized": [32, 32, 64, 1024, 32],
    "straddling": [31, 33, 1000, 1025, 3, 2049, 17],
    "one large": [70_001],
    "large among small": [3, 40_000, 1, 1, 5_000, 2],
    "level boundaries": [255, 257, 4095, 4097, 1, 16, 17, 15, 4096],
}


def _case(sizes: list[int], dtype: torch.dtype, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor(sizes)
    values = torch.randn(int(counts.sum()), 3, generator=g, dtype=torch.float64)
    system = torch.repeat_interleave(torch.arange(len(sizes)), counts)
    return values.to(dtype=dtype, device=device), system.to(device)


def _sums(values: torch.Tensor, system: torch.Tensor, systems: int, largest: int | None = None) -> torch.Tensor:
    from alchemi_integrators.kernel_funcs import Launches
    from alchemi_integrators.system_sums import system_sums

    out = torch.zeros(systems, 3, dtype=values.dtype, device=values.device)
    system_sums(Launches(), Workspace(), "t", values, system, out, largest)
    return out


def _reference(values: torch.Tensor, system: torch.Tensor, systems: int) -> torch.Tensor:
    out = torch.zeros(systems, 3, dtype=torch.float64)
    return out.index_add_(0, system.cpu(), values.double().cpu())


@pytest.mark.parametrize("levels", ["all levels", "levels by size"])
@pytest.mark.parametrize("name", list(SIZES))
def test_chunked_sums_equal_a_plain_sum(name: str, levels: str) -> None:
    """All three levels, or as few as the largest system needs (one for systems of up to 256
    atoms, two up to 4,096)."""
    sizes = SIZES[name]
    values, system = _case(sizes, torch.float64, "cpu")
    got = _sums(values, system, len(sizes), max(sizes) if levels == "levels by size" else None)
    torch.testing.assert_close(got, _reference(values, system, len(sizes)), rtol=1e-12, atol=1e-10)


def test_a_batch_of_small_systems_takes_one_launch() -> None:
    from alchemi_integrators.kernel_funcs import Launches
    from alchemi_integrators.system_sums import system_sums

    values, system = _case([256] * 8, torch.float64, "cpu")
    launches = Launches()
    names: list[str] = []
    original = launches.launch
    launches.launch = lambda name, *args: (names.append(name), original(name, *args))[1]  # type: ignore[method-assign]
    system_sums(launches, Workspace(), "t", values, system, torch.zeros(8, 3, dtype=torch.float64), 256)
    assert names == ["t:sums0"]


def test_float32_sums_and_totals_are_added_to_not_replaced() -> None:
    sizes = SIZES["straddling"]
    values, system = _case(sizes, torch.float32, "cpu", seed=3)
    from alchemi_integrators.kernel_funcs import Launches
    from alchemi_integrators.system_sums import system_sums

    out = torch.full((len(sizes), 3), 10.0)
    launches, work = Launches(), Workspace()
    system_sums(launches, work, "t", values, system, out)
    system_sums(launches, work, "t", values, system, out)  # replayed: adds again
    expected = 10.0 + 2.0 * _reference(values, system, len(sizes))
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["many small", "straddling", "large among small", "level boundaries"])
def test_chunked_sums_on_gpu(name: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    sizes = SIZES[name]
    values, system = _case(sizes, torch.float64, "cuda")
    for largest in (None, max(sizes)):
        got = _sums(values, system, len(sizes), largest)
        torch.testing.assert_close(got.cpu(), _reference(values, system, len(sizes)), rtol=1e-12, atol=1e-10)


@pytest.mark.gpu
def test_one_system_of_a_million_atoms_on_gpu() -> None:
    """The case per-atom atomics serialised: one system of 2^20 atoms (float32, as W1)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    values, system = _case([1 << 20], torch.float32, "cuda", seed=5)
    got = _sums(values, system, 1)
    torch.testing.assert_close(got.double().cpu(), _reference(values, system, 1), rtol=1e-4, atol=0.05)
