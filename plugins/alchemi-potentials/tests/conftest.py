"""Shared test helpers: random structures and an independent numpy reference.

The reference sums every pair over every periodic image within the cutoff by brute force (no
cell list, no skin, no Warp), in float64, so it checks the kernels and the neighbour list alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest_plugins = ["alchemi_core.testing.fixtures"]

_HERE = Path(__file__).parent

PairFunction = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def reference_pairs(
    positions: np.ndarray,
    numbers: np.ndarray,
    cell: np.ndarray,
    pbc: np.ndarray,
    cutoff: float,
    pair: PairFunction,
) -> tuple[float, np.ndarray, np.ndarray]:
    """Energy, forces and virial (sum over pairs of ``0.5 f_ij (x) d_ij``) by brute force.

    ``pair(zi, zj, r)`` returns the pair energy and dU/dr for arrays of element pairs.
    """
    x = np.asarray(positions, dtype=np.float64)
    n = len(x)
    ranges = []
    inv = np.linalg.inv(cell)  # the tests always give a full-rank cell
    frac = x @ inv
    for a in range(3):
        if pbc[a]:
            spacing = 1.0 / np.linalg.norm(inv[:, a])
            # Atoms may sit outside the cell: widen by the span of their fractional coordinates.
            reach = int(np.ceil(cutoff / spacing + np.ptp(frac[:, a]))) + 1
            ranges.append(range(-reach, reach + 1))
        else:
            ranges.append(range(0, 1))
    energy = 0.0
    forces = np.zeros((n, 3))
    virial = np.zeros((3, 3))
    zi, zj = np.meshgrid(numbers, numbers, indexing="ij")
    for shift in itertools.product(*ranges):
        offset = np.asarray(shift, dtype=np.float64) @ cell
        d = x[None, :, :] + offset - x[:, None, :]  # d[i, j] = x_j + offset - x_i
        r = np.linalg.norm(d, axis=-1)
        mask = r < cutoff
        if not any(shift):
            np.fill_diagonal(mask, False)
        if not mask.any():
            continue
        ii, jj = np.nonzero(mask)
        u, du = pair(zi[ii, jj], zj[ii, jj], r[ii, jj])
        energy += 0.5 * u.sum()
        fij = (du / r[ii, jj])[:, None] * d[ii, jj]
        np.add.at(forces, ii, fij)
        virial += 0.5 * np.einsum("pa,pb->ab", fij, d[ii, jj])
    return energy, forces, virial


def reference_by_neighbor_list(atoms, cutoff: float, pair: PairFunction) -> tuple[float, np.ndarray, np.ndarray]:
    """:func:`reference_pairs` with the pairs from ``ase.neighborlist`` instead of every image:
    O(N), for systems too large for the brute-force sum (independent of this package all the same)."""
    from ase.neighborlist import neighbor_list

    i, j, r, d = neighbor_list("ijdD", atoms, cutoff)
    u, du = pair(atoms.numbers[i], atoms.numbers[j], r)
    fij = (du / r)[:, None] * d
    forces = np.zeros((len(atoms), 3))
    np.add.at(forces, i, fij)
    return 0.5 * u.sum(), forces, 0.5 * np.einsum("pa,pb->ab", fij, d)


def lennard_jones_pair(eps: Callable, sig: Callable, cutoff: float, shift: bool) -> PairFunction:
    def pair(zi: np.ndarray, zj: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        e, s = eps(zi, zj), sig(zi, zj)
        u = 4 * e * ((s / r) ** 12 - (s / r) ** 6)
        du = 4 * e * (-12 * s**12 / r**13 + 6 * s**6 / r**7)
        if shift:
            u = u - 4 * e * ((s / cutoff) ** 12 - (s / cutoff) ** 6)
        return u, du

    return pair


def morse_pair(depth: Callable, alpha: Callable, r0: Callable, cutoff: float, shift: bool,
               onset: float | None = None) -> PairFunction:
    def pair(zi: np.ndarray, zj: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d, a, q = depth(zi, zj), alpha(zi, zj), r0(zi, zj)
        x = np.exp(-a * (r - q))
        u = d * (x * x - 2 * x)
        du = 2 * d * a * x * (1 - x)
        if shift:
            xc = np.exp(-a * (cutoff - q))
            u = u - d * (xc * xc - 2 * xc)
        if onset is not None:
            t = np.clip((cutoff - r) / (cutoff - onset), 0.0, 1.0)
            s = 10 * t**3 - 15 * t**4 + 6 * t**5
            ds = -30 * t**2 * (1 - t) ** 2 / (cutoff - onset)
            ds = np.where(r > onset, ds, 0.0)
            u, du = u * s, du * s + u * ds
        return u, du

    return pair


def random_cell(rng: np.random.Generator, lengths: tuple[float, float, float], tilt: float) -> np.ndarray:
    """A triclinic cell: rows of the given lengths, tilted by up to ``tilt`` (fraction)."""
    cell = np.diag(lengths).astype(np.float64)
    cell[1, 0] = rng.uniform(-tilt, tilt) * lengths[1]
    cell[2, 0] = rng.uniform(-tilt, tilt) * lengths[2]
    cell[2, 1] = rng.uniform(-tilt, tilt) * lengths[2]
    return cell


def random_atoms(rng: np.random.Generator, n: int, cell: np.ndarray, pbc, species=(18,), min_distance=2.6,
                 outside: float = 0.0):
    """Atoms at random, no two closer than ``min_distance`` (over images), some possibly
    ``outside`` cells beyond the box, as an ``ase.Atoms``."""
    import ase

    frac: list[np.ndarray] = []
    probe = ase.Atoms(cell=cell, pbc=pbc)
    tries = 0
    while len(frac) < n:
        tries += 1
        if tries > 20000:
            raise RuntimeError("could not place atoms; lower min_distance")
        f = rng.uniform(0, 1, 3)
        if frac:
            probe = ase.Atoms("X" * (len(frac) + 1), scaled_positions=np.vstack([*frac, f]), cell=cell, pbc=pbc)
            dist = probe.get_distances(len(frac), list(range(len(frac))), mic=bool(np.any(pbc)))
            if dist.min() < min_distance:
                continue
        frac.append(f)
    positions = np.vstack(frac) @ cell
    if outside:
        # Move whole lattice vectors on periodic axes (same physics) and leave the box otherwise.
        for i in range(n):
            k = rng.integers(-int(outside), int(outside) + 1, 3) * np.asarray(pbc)
            positions[i] += k @ cell
    numbers = rng.choice(np.asarray(species), n)
    return ase.Atoms(numbers=numbers, positions=positions, cell=cell, pbc=pbc)


def assert_close(actual, expected, rtol: float = 1e-6, what: str = "") -> None:
    """Largest deviation relative to the largest expected magnitude below ``rtol``."""
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    scale = max(np.abs(expected).max(), 1e-12)
    err = np.abs(actual - expected).max() / scale
    assert err < rtol, f"{what}: relative error {err:.2e} (scale {scale:.3e})"


def batch_of(atoms_list, dtype=torch.float64, device="cpu"):
    from alchemi_core.data import Batch

    return Batch.from_atoms(atoms_list, dtype=dtype, device=device)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240611)


@pytest.fixture(scope="session")
def ref() -> SimpleNamespace:
    """The helpers above (test modules cannot import conftest under --import-mode=importlib)."""
    return SimpleNamespace(
        pairs=reference_pairs,
        pairs_by_neighbor_list=reference_by_neighbor_list,
        lennard_jones=lennard_jones_pair,
        morse=morse_pair,
        cell=random_cell,
        atoms=random_atoms,
        batch=batch_of,
        close=assert_close,
    )


@pytest.fixture
def tuning(request):
    """The potentials' tuning for the models and lists a test builds (``tuning=tuning``): None,
    the device's own, unless ``--tuning=cuda`` asks for a GPU's (its code paths on a CPU)."""
    from alchemi_core.testing.fixtures import tuning_device
    from alchemi_potentials.tuning import PotentialsTuning

    device = tuning_device(request.config)
    return None if device is None else PotentialsTuning.for_device(device)


#: Test modules that never run a Warp kernel on the CPU.
_WITHOUT_CPU_WARP = {"test_registration.py", "test_ase_model.py", "test_gpu.py"}


def pytest_collection_modifyitems(config, items):
    """Skip tests marked ``gpu`` where there is no CUDA device, and the CPU tests where Warp has
    no CPU backend (some CUDA builds of warp-lang ship without its compiler)."""
    here = [item for item in items if item.path.parent == _HERE]
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in here:
            if "gpu" in item.keywords:
                item.add_marker(skip)
        return
    import warp as wp

    wp.init()
    if wp.is_cpu_available():
        return
    skip = pytest.mark.skip(reason="this warp-lang build cannot run kernels on the CPU")
    for item in here:
        if "gpu" not in item.keywords and item.path.name not in _WITHOUT_CPU_WARP:
            item.add_marker(skip)
