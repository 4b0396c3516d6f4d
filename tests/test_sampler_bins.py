"""The sampler's best fit from its size bins (``size_bins.SizeBins.take`` and ``likely``).

Each bin remembers the fewest atoms of a structure it holds, so that a budget ending inside a
bin's range, below everything in it, skips the bin instead of scanning it; the structures handed
out must be exactly those of a plain scan, whatever the sizes and budgets.
"""

from __future__ import annotations

import itertools
from collections import deque

import numpy as np

from alchemi_core.dynamics import SizeAwareSampler
from alchemi_core.dynamics import sampler as module


class Sizes:
    """A dataset known only by its structures' sizes (``_take`` builds nothing)."""

    def __init__(self, atoms: np.ndarray) -> None:
        self.atoms = atoms

    def __len__(self) -> int:
        return len(self.atoms)

    def __getitem__(self, index: int) -> None:
        raise AssertionError("nothing is built here")

    def get_metadata(self, index: int) -> tuple[int, int]:
        return int(self.atoms[index]), 0


def _scan_take(bins: dict[int, deque[int]], atoms: np.ndarray, width: int, budget: int) -> int | None:
    """The plain scan: the first structure that fits in the highest bin that has one."""
    if budget < 1:
        return None
    for b in sorted((k for k in bins if k <= budget // width), reverse=True):
        for pos, i in enumerate(bins[b]):
            if atoms[i] <= budget:
                del bins[b][pos]
                if not bins[b]:
                    del bins[b]
                return i
    return None


def test_takes_equal_a_plain_scan_of_the_bins_for_any_sizes_and_budgets() -> None:
    rng = np.random.default_rng(3)
    for sizes in (rng.integers(1, 200, 600), rng.choice([32, 108, 256, 864], 600)):  # mixed, W3's
        sampler = SizeAwareSampler(Sizes(sizes), max_atoms=4000, bin_width=32, seed=1)
        mirror = {b: deque(q) for b, q in sampler._bins.queues.items()}
        taken, skipped = [], 0
        for budget in itertools.chain(rng.integers(0, 1000, 2000), [10**6] * 700):
            got = sampler._take(int(budget), None)
            assert got == _scan_take(mirror, sizes, 32, int(budget))
            taken.append(got)
            skipped += got is None
            for b, (least, count) in sampler._bins.smallest.items():  # what a bin remembers is true
                held = sizes[list(sampler._bins.queues[b])]
                assert least == held.min() and count == (held == least).sum()
        assert sampler.exhausted and not mirror and sampler._bins.smallest == {}
        assert sorted(i for i in taken if i is not None) == list(range(600)) and skipped > 0


def test_the_prefetch_plan_equals_a_plain_scan() -> None:
    rng = np.random.default_rng(5)
    sizes = rng.choice([32, 108, 256, 864], 3000)
    sampler = SizeAwareSampler(Sizes(sizes), max_atoms=20_000, bin_width=32, seed=2, prefetch=400)
    for budget in rng.integers(100, 900, 500):  # the bins' smallest sizes move as structures go
        sampler._take(int(budget), None)
        plan = list(sampler._likely())
        keys = sorted(sampler._bins.queues, reverse=True)
        heads = [i for b in keys for i in itertools.islice(sampler._bins.queues[b], module.PREFETCH_HEADS)]
        assert plan[: len(heads)] == heads
        rest, count = [], len(heads)
        atoms = min(module.PREFETCH_BATCHES * 20_000, module.PREFETCH_MAX_ATOMS)
        for b in keys:
            for i in sampler._bins.queues[b]:
                if atoms < b * 32 or count >= 400:
                    break
                if sizes[i] <= atoms:
                    rest.append(i)
                    atoms -= int(sizes[i])
                    count += 1
        assert plan[len(heads):] == rest
