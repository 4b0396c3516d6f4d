"""Batched neighbour lists: one cell list per system, rebuilt on the device when needed.

Example:
    >>> from alchemi_potentials.neighbors import BatchedNeighborList
    >>> BatchedNeighborList(cutoff=5.0, skin=0.5).radius
    5.5
"""

from __future__ import annotations

from alchemi_potentials.neighbors.cell_list import BatchedNeighborList, check_cells
from alchemi_potentials.neighbors.edges import EdgeList, Edges
from alchemi_potentials.neighbors.layout import NeighborMatrix

__all__ = ["BatchedNeighborList", "EdgeList", "Edges", "NeighborMatrix", "check_cells"]
