"""An independent Lennard-Jones force for the relaxation check: dense pairs over periodic images,
float64, plain torch, sharing no code with any framework under test.

Example:
    >>> from benchmarks.structures import ArgonCells
    >>> cells = ArgonCells([2, 2]).systems()
    >>> fmax = largest_forces(cells.positions, cells.cells, cells.counts, device="cpu")
    >>> fmax.shape, bool((fmax > 0).all())
    (torch.Size([2]), True)
"""

from __future__ import annotations

import math

import torch

from benchmarks import spec

#: Pair evaluations per chunk (each holds ~100 bytes while it is computed).
_CHUNK_PAIRS = {"cuda": 20_000_000, "cpu": 1_000_000}


def _image_shifts(cell: torch.Tensor, cutoff: float) -> torch.Tensor:
    """``[S, 3]`` lattice translations reaching every image within ``cutoff``."""
    volume = torch.linalg.det(cell).abs()
    reach = []
    for i in range(3):
        height = volume / torch.linalg.cross(cell[(i + 1) % 3], cell[(i + 2) % 3]).norm()
        reach.append(int(math.ceil(cutoff / float(height))))
    grid = torch.stack(
        torch.meshgrid(*[torch.arange(-r, r + 1, dtype=cell.dtype, device=cell.device) for r in reach], indexing="ij"), -1
    )
    return grid.reshape(-1, 3) @ cell


def _forces(pos: torch.Tensor, cell: torch.Tensor, cutoff: float) -> torch.Tensor:
    """``[b, N, 3]`` LJ forces of ``b`` systems of N atoms sharing one cell shape (float64)."""
    shifts = _image_shifts(cell, cutoff).to(pos)  # [S, 3]
    # r_ij = x_j + shift - x_i for every i, j, image.
    d = pos[:, None, :, None, :] + shifts[None, None, None, :, :] - pos[:, :, None, None, :]  # [b, N, N, S, 3]
    r2 = (d * d).sum(-1)
    inside = (r2 < cutoff * cutoff) & (r2 > 1e-12)
    inv6 = torch.where(inside, (spec.SIGMA**2 / r2.clamp(min=1e-12)) ** 3, torch.zeros_like(r2))
    # dU/dr / r = -24 eps (2 s^12/r^12 - s^6/r^6) / r^2: force on i along -r_ij.
    coef = torch.where(
        inside, 24.0 * spec.EPSILON * (2.0 * inv6 * inv6 - inv6) / r2.clamp(min=1e-12), torch.zeros_like(r2)
    )
    return -(coef[..., None] * d).sum(dim=(2, 3))


def largest_forces(
    positions: torch.Tensor, cells: torch.Tensor, counts: torch.Tensor, device: str, cutoff: float = spec.CUTOFF
) -> torch.Tensor:
    """``[B]`` largest atomic force norm (eV/Å) of each system, float64.

    Args:
        positions: ``[V, 3]`` Å, systems concatenated.
        cells: ``[B, 3, 3]`` Å.
        counts: ``[B]`` atoms per system.
        device: Where to compute (``"cuda"`` is much faster for thousands of systems).
    """
    pos_parts = torch.split(positions.to(torch.float64), counts.tolist())
    out = torch.empty(len(pos_parts), dtype=torch.float64)
    start = 0
    while start < len(pos_parts):
        n = int(counts[start])
        cell = cells[start].to(torch.float64)
        images = _image_shifts(cell, cutoff).shape[0]
        per_system = max(1, _CHUNK_PAIRS[device] // (n * n * images))
        stop = start
        while (
            stop < len(pos_parts)
            and stop - start < per_system
            and int(counts[stop]) == n
            and torch.equal(cells[stop], cells[start])
        ):
            stop += 1
        block = torch.stack(pos_parts[start:stop]).to(device)
        f = _forces(block, cell.to(device), cutoff)
        out[start:stop] = f.norm(dim=-1).amax(dim=1).cpu()
        start = stop
    return out
