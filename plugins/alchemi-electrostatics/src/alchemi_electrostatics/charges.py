"""What the electrostatics models share: the Coulomb constant, the per-atom charges of a batch
and alchemi's edges in the CSR form nvalchemi-toolkit-ops reads.

Charges come, in this order, from the ``charges`` argument (a model before this one in
``model:sum`` predicted them), the batch's atom field ``charges`` (partial charges given or
predicted earlier) or ``initial_charges`` (ASE's ``atoms.set_initial_charges``), in e.

Example:
    >>> import torch
    >>> from alchemi_core.data import AtomicData, Batch
    >>> batch = Batch.from_data_list([AtomicData(atomic_numbers=[11, 17], positions=torch.eye(2, 3),
    ...                                          initial_charges=torch.tensor([1.0, -1.0]))])
    >>> atom_charges(batch, None, "ewald").tolist()
    [1.0, -1.0]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from alchemi_core.errors import InvalidDataError

if TYPE_CHECKING:
    from alchemi_core.data import Batch
    from alchemi_potentials.neighbors.edges import Edges

#: e^2 / (4 pi eps0) in eV Å (ASE's ``units.Hartree * units.Bohr``).
COULOMB = 14.3996454784255
#: Atom fields that hold charges, in the order they are looked for.
CHARGE_FIELDS = ("charges", "initial_charges")


def atom_charges(batch: Batch, given: torch.Tensor | None, name: str) -> torch.Tensor:
    """``[V]`` charges (e) of the batch's atoms (see the module docstring).

    Raises:
        InvalidDataError: No charges anywhere; the message says how to give them.
    """
    if given is not None:
        return given.reshape(-1)
    for field in CHARGE_FIELDS:
        if field in batch:
            return getattr(batch, field).reshape(-1)
    raise InvalidDataError(
        f"model {name!r} needs per-atom charges and the structures have none: give them "
        "(atoms.set_initial_charges([...]) or the atom field 'charges', in e), or put a model that "
        f"predicts them before model:{name} in a model:sum"
    )


def csr_edges(edges: Edges, num_atoms: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """alchemi's COO edges as ops' CSR neighbour list: ``[2, capacity]`` int32 pairs sorted by
    sender, ``[num_atoms + 1]`` int32 row pointers over the real edges only (padding edges sort
    last and fall outside every row), and ``[capacity, 3]`` int32 lattice shifts. A sort of the
    edges on the device; nothing is read back."""
    slots = torch.arange(edges.capacity, device=edges.index.device)
    key = torch.where(slots < edges.count, edges.sender, num_atoms)
    key, order = torch.sort(key, stable=True)
    rows = torch.arange(num_atoms + 1, device=key.device)
    ptr = torch.searchsorted(key, rows).to(torch.int32)
    pairs = edges.index[:, order].to(torch.int32)
    return pairs, ptr, edges.unit_shifts[order].round().to(torch.int32)
