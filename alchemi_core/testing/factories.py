"""Small structures for tests, with every dtype the data model must keep.

Example:
    >>> from alchemi_core.testing import make_batch
    >>> batch = make_batch([3, 5], edges=True, extras=True)
    >>> batch.atomic_numbers.dtype, batch.frozen.dtype, batch.charges.dtype
    (torch.int64, torch.bool, torch.float64)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from alchemi_core.data import AtomicData, Batch


def make_structure(
    num_atoms: int,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    edges: bool = False,
    extras: bool = False,
    spread: float = 1.5,
) -> AtomicData:
    """A random molecule: positions ~ N(0, spread²) Å, elements 1-9.

    Args:
        edges: Add a ring ``neighbor_list`` and per-edge ``shifts``.
        extras: Add a bool atom field ``frozen``, a float64 atom field ``charges``, an int32
            system field ``tag`` and a float64 system field ``dipole`` ``[1, 3]``.
    """
    g = torch.Generator().manual_seed(seed)
    fields: dict = {
        "atomic_numbers": torch.randint(1, 10, (num_atoms,), generator=g),
        "positions": (torch.randn(num_atoms, 3, generator=g) * spread).to(dtype),
        "cell": torch.eye(3, dtype=dtype) * 10.0,
        "pbc": torch.tensor([False, False, False]),
    }
    if edges and num_atoms > 1:
        i = torch.arange(num_atoms)
        fields["neighbor_list"] = torch.stack([i, (i + 1) % num_atoms], dim=1)
        fields["shifts"] = torch.zeros(num_atoms, 3, dtype=dtype)
    elif edges:
        fields["neighbor_list"] = torch.zeros(0, 2, dtype=torch.long)
        fields["shifts"] = torch.zeros(0, 3, dtype=dtype)
    if extras:
        fields["frozen"] = torch.rand(num_atoms, generator=g) < 0.3
        fields["charges"] = torch.randn(num_atoms, generator=g, dtype=torch.float64)
        fields["tag"] = torch.tensor([seed], dtype=torch.int32)
        fields["dipole"] = torch.randn(1, 3, generator=g, dtype=torch.float64)
        levels = {"frozen": "node", "charges": "node", "tag": "system", "dipole": "system"}
    else:
        levels = {}
    return AtomicData(levels=levels, **fields)


def random_structures(sizes: Sequence[int], **kwargs: object) -> list[AtomicData]:
    """One structure per size, seeded by position so each is distinct and reproducible."""
    return [make_structure(n, seed=i, **kwargs) for i, n in enumerate(sizes)]  # type: ignore[arg-type]


def make_batch(sizes: Sequence[int], system_ids: bool = True, **kwargs: object) -> Batch:
    """A batch of :func:`make_structure` systems, with ``system_id`` 0..B-1 when asked."""
    batch = Batch.from_data_list(random_structures(sizes, **kwargs))
    if system_ids:
        batch.set_field("system_id", torch.arange(batch.num_graphs), "system")
    return batch


def rattled_argon(count: int, rattle: float, rattle_step: float,
                  repeats: Sequence[tuple[int, int, int]] = ((2, 2, 2),)) -> list[Any]:
    """``count`` cells of fcc argon (cubic, a = 5.26 Å) as ASE ``Atoms``, cell ``i`` repeated
    ``repeats[i % len(repeats)]`` times and rattled by ``rattle + i * rattle_step`` Å (seed ``i``):
    relaxations from them converge at different steps.

    Example:
        >>> [len(a) for a in rattled_argon(3, 0.05, 0.02, repeats=((2, 2, 2), (3, 2, 2)))]
        [32, 48, 32]
    """
    from ase.build import bulk

    cells = []
    for i in range(count):
        atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeats[i % len(repeats)])
        atoms.rattle(rattle + rattle_step * i, seed=i)
        cells.append(atoms)
    return cells


def _never(value: torch.Tensor) -> torch.Tensor:
    return torch.zeros(value.shape[0], dtype=torch.bool, device=value.device)


def never_converging(frequency: int = 1) -> object:
    """A ``ConvergenceHook`` that never passes (a negative threshold is refused), so systems move
    on only when they have used their stage's budget, checked every ``frequency`` steps."""
    from alchemi_core.dynamics.convergence import ConvergenceHook

    return ConvergenceHook(criteria=[{"key": "fmax", "threshold": 0.0, "custom_op": _never}], frequency=frequency)
