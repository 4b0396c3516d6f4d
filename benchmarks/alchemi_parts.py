"""alchemi pieces the benchmarks share that need alchemi-core only (not its plugins): W3's cells
as a dataset, a sink that keeps graduated ``system_id`` values, and a count of converged
structures. The alchemi adapter (``benchmarks.adapters.alchemi``) and the W4 pipeline script
(``plugins/alchemi-nccl/benchmarks/w4_pipeline.py``, which falls back to ``DemoDynamics`` when
plugins are missing) both use them.

Example:
    >>> from benchmarks.alchemi_parts import CellDataset
    >>> from benchmarks.structures import ArgonCells
    >>> data = CellDataset(ArgonCells([2, 3]))
    >>> len(data), data.get_metadata(1), data[1].num_nodes
    (2, (108, 0), 108)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.dynamics import DataSink, DynamicsStage, Hook
from benchmarks import spec
from benchmarks.adapters.base import IdTally
from benchmarks.structures import ArgonCells


class ConvergedCount(Hook):
    """Counts the systems the relaxation released by convergence (read at check steps)."""

    stage = DynamicsStage.ON_CONVERGE

    def __init__(self) -> None:
        super().__init__(frequency=1)
        self.count = 0

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        mask = dynamics.converged_mask
        if mask is not None:
            self.count += int(mask.sum())


class IdTallySink(IdTally, DataSink):
    """The ``system_id`` of every structure that graduated (nothing else leaves the device)."""

    def write(self, batch: Batch, mask: torch.Tensor | None = None) -> None:
        self.add(batch.system_id, mask)


class CellDataset:
    """W3's cells as alchemi ``AtomicData``, made when the sampler asks for them.

    Args:
        cells: The cells.
        dtype: Floating dtype of positions, cells and masses.
    """

    def __init__(self, cells: ArgonCells, dtype: torch.dtype = torch.float32) -> None:
        self.cells = cells
        self.dtype = dtype

    def __len__(self) -> int:
        return len(self.cells)

    def __getitem__(self, index: int) -> AtomicData:
        pos, cell = self.cells.cell(index)
        n = len(pos)
        return AtomicData(
            atomic_numbers=torch.full((n,), spec.ARGON_Z, dtype=torch.long),
            positions=pos.to(self.dtype),
            cell=cell.to(self.dtype).unsqueeze(0),
            pbc=torch.ones(1, 3, dtype=torch.bool),
            atomic_masses=torch.full((n,), spec.ARGON_MASS, dtype=self.dtype),
            system_id=torch.tensor([index], dtype=torch.long),
        )

    def get_metadata(self, index: int) -> tuple[int, int]:
        return self.cells.num_atoms(index), 0

    def get_all_metadata(self) -> tuple[np.ndarray, np.ndarray]:
        counts = self.cells.atom_counts()
        return counts, np.zeros_like(counts)
