"""Symmetry kept through a relaxation, as ASE's ``FixSymmetry`` keeps it.

A system whose system field ``symprec`` is above 0 (ASE's ``FixSymmetry(atoms, symprec)``;
:func:`alchemi_core.data.ase_io` reads and writes it) keeps its space group: when it first enters a
run its cell and positions are refined to the group spglib finds at that tolerance (ASE's
``refine_symmetry``) and its operations are stored (ASE's ``prep_symmetry``); from then on, on the
device and with nothing read back,

* the forces after each model forward are averaged over the group: the force of atom ``i``,
  rotated by each operation ``R``, goes to the atom ``i`` maps to, and the sum is divided by the
  number of operations (ASE's ``symmetrize_rank1``);
* the stress becomes the group average of ``R^T S R`` (``symmetrize_rank2``);
* each step's change of the cell (the deformation ``C - I``, with ``cell_new = cell_old C``) is
  averaged as the stress is, and the positions' step, taken from the old positions carried by that
  deformation, as the forces are (ASE's ``adjust_cell`` and ``adjust_positions``).

The operations are kept in Cartesian form (``R = L^T r L^-T`` of spglib's fractional ``r`` and
the refined cell ``L``, rows as cell vectors): a deformation averaged over the group commutes with
every ``R``, so they stay right while the cell relaxes. They are found once per system and run,
kept by ``system_id``, so refills, graduation and checkpoints (which carry ``symprec``) need
nothing more. spglib and ASE are optional: ``pip install 'alchemi-core[symmetry]'``. The rotations
are laid out per atom (``[K, V, 3, 3]``, K the most distinct rotations of a system of the batch,
at most 48): a vector's average is the mean over each atom's orbit under the group's pure
translations (the lattice points of a supercell), then one batched product and one scatter.

Example:
    >>> from ase.build import bulk
    >>> numbers, x, cell = [29], [[0.0, 0.0, 0.0]], bulk("Cu", "fcc", a=3.6).cell.array
    >>> ops = find_symmetry(numbers, x, cell, symprec=0.01)
    >>> ops.rotations.shape, ops.images.shape, ops.number
    ((48, 3, 3), (48, 1), 225)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from alchemi_core.data.fields import SYMPREC
from alchemi_core.errors import InvalidDataError, MissingDependencyError
from alchemi_core.workspace import Workspace

if TYPE_CHECKING:
    from alchemi_core.data import Batch

__all__ = ["SYMPREC", "Symmetry", "SymmetryOps", "find_symmetry", "has_symmetry", "require_symmetry"]


def has_symmetry(batch: Batch) -> bool:
    """Whether ``batch`` has the system field ``symprec`` (some system may keep its symmetry)."""
    return SYMPREC in batch


class SymmetryOps(NamedTuple):
    """One structure's space group: refined positions and cell, and its operations."""

    #: ``[N, 3]`` positions refined to the group (Å).
    positions: np.ndarray
    #: ``[3, 3]`` cell refined to the group (rows: cell vectors).
    cell: np.ndarray
    #: ``[K, 3, 3]`` Cartesian rotations ``R`` (column vectors: ``x' = R x``), one operation per
    #: distinct rotation (the others differ from it by a translation of the cell's lattice).
    rotations: np.ndarray
    #: ``[K, N]`` the atom each of these operations takes each atom to.
    images: np.ndarray
    #: ``[N]`` the first atom of each atom's orbit under the group's pure translations.
    orbits: np.ndarray
    #: The space group's number (International Tables).
    number: int


def require_symmetry() -> Any:
    """ASE's ``ase.spacegroup.symmetrize`` (with spglib behind it).

    Raises:
        MissingDependencyError: spglib or ASE not installed.
    """
    try:
        import spglib  # noqa: F401
        from ase.spacegroup import symmetrize
    except ImportError:
        raise MissingDependencyError(
            "a system with the field 'symprec' (ASE's FixSymmetry) needs spglib and ASE to find its space "
            "group: pip install 'alchemi-core[symmetry]' (or pip install spglib ase)"
        ) from None
    return symmetrize


def find_symmetry(numbers: Any, positions: Any, cell: Any, symprec: float = 0.01,
                  pbc: Any = True) -> SymmetryOps:
    """Refine a structure to the space group spglib finds at ``symprec`` (Å) and list its operations,
    as ``FixSymmetry(atoms, symprec)`` does (ASE's ``refine_symmetry`` and ``prep_symmetry``).

    Raises:
        MissingDependencyError: spglib or ASE not installed.
        InvalidDataError: spglib finds no space group (a cell of zero volume, atoms on top of each other).
    """
    symmetrize = require_symmetry()
    import ase

    atoms = ase.Atoms(numbers=np.asarray(numbers), positions=np.asarray(positions, dtype=np.float64),
                      cell=np.asarray(cell, dtype=np.float64), pbc=pbc)
    try:
        dataset = symmetrize.refine_symmetry(atoms, symprec)
        rotations, _, maps = symmetrize.prep_symmetry(atoms, symprec)
    except Exception as exc:  # spglib reports a failure as None, which ASE's helpers trip over
        raise InvalidDataError(
            f"spglib found no space group for a structure of {len(atoms)} atoms at symprec={symprec} ({exc}); "
            "FixSymmetry needs a periodic cell of non-zero volume with atoms apart"
        ) from None
    maps = np.asarray(maps, dtype=np.int64)
    flat = rotations.reshape(len(rotations), 9)
    # The pure translations (identity rotation) form a normal subgroup: the group's average is the
    # average over each atom's translation orbit, then over one operation per distinct rotation.
    translations = (flat == np.eye(3, dtype=flat.dtype).reshape(9)).all(axis=1)
    orbits = maps[translations].min(axis=0)
    first = np.sort(np.unique(flat, axis=0, return_index=True)[1])
    lattice = atoms.cell.array
    # R = L^T r L^-T: spglib's rotations act on fractional columns.
    cart = lattice.T @ rotations[first].astype(np.float64) @ np.linalg.inv(lattice).T
    return SymmetryOps(atoms.positions.copy(), lattice.copy(), cart, maps[first], orbits, int(dataset.number))


class Symmetry:
    """The operations of one engine's systems that keep their symmetry, padded into tensors.

    ``write`` (at each rewrite of the masks; reads back when systems came) refines newcomers and
    lays the operations out; ``forces``, ``stress``, ``cell_step`` and ``position_step`` run inside
    the step (see the module docstring). Systems without ``symprec`` take the identity.
    """

    def __init__(self) -> None:
        #: ``[B, K, 3, 3]`` Cartesian rotations (zeros where a system has fewer than K); None: no system
        #: of the batch keeps its symmetry.
        self.rotations: torch.Tensor | None = None
        self._atom_rotations: torch.Tensor | None = None  # [K, V, 3, 3]
        self._images: torch.Tensor | None = None  # [K * V] the atom each operation takes each atom to
        self._atom_scale: torch.Tensor | None = None  # [V, 1] 1 / the atom's system's K
        self._system_scale: torch.Tensor | None = None  # [B, 1, 1]
        self._system_on: torch.Tensor | None = None  # [B, 1, 1] the system keeps its symmetry
        self._atom_on: torch.Tensor | None = None  # [V, 1] the atom's system keeps its symmetry
        self._orbits: torch.Tensor | None = None  # [V] the first atom of the atom's translation orbit
        self._orbit_scale: torch.Tensor | None = None  # [V, 1] 1 / the size of that orbit
        self._found: dict[int, SymmetryOps] = {}
        self._version = -1
        self._work = Workspace()

    @property
    def active(self) -> bool:
        """Whether some system of the batch keeps its symmetry."""
        return self.rotations is not None

    def write(self, batch: Batch) -> None:
        """Lay out the operations of ``batch``'s systems (when its systems changed), refining the
        cell and positions of those seen for the first time in this run (reads back).

        Raises:
            MissingDependencyError: spglib or ASE not installed.
            InvalidDataError: spglib finds no space group for a system.
        """
        if not has_symmetry(batch):
            self.rotations = None
            return
        if self._version == batch.version:
            return
        self._version = batch.version
        precs = getattr(batch, SYMPREC).reshape(-1).double().cpu().numpy()
        if not (precs > 0).any():
            self.rotations, self._found = None, {}
            return
        ids = (batch.system_id.reshape(-1).cpu().tolist() if "system_id" in batch
               else list(range(batch.num_graphs)))
        ptr = [0, *np.cumsum(batch.num_nodes_per_system).tolist()]
        ops: dict[int, SymmetryOps] = {}
        for b in np.flatnonzero(precs > 0).tolist():
            found = self._found.get(ids[b])
            if found is None or found.images.shape[1] != ptr[b + 1] - ptr[b]:
                found = self._found[ids[b]] = self._refine(batch, b, ptr[b], ptr[b + 1], float(precs[b]))
            ops[b] = found
        self._found = {ids[b]: o for b, o in ops.items()}  # systems that left are not kept
        self._lay_out(batch, ops, ptr)

    @staticmethod
    def _refine(batch: Batch, b: int, start: int, stop: int, symprec: float) -> SymmetryOps:
        """Find system ``b``'s group and write its refined positions and cell into the batch."""
        x = batch.positions[start:stop]
        pbc = batch.pbc[b].cpu().numpy() if "pbc" in batch else True
        found = find_symmetry(batch.atomic_numbers[start:stop].cpu().numpy(), x.double().cpu().numpy(),
                              batch.cell[b].double().cpu().numpy(), symprec, pbc)
        x.copy_(torch.from_numpy(found.positions).to(x))
        batch.cell[b].copy_(torch.from_numpy(found.cell).to(batch.cell))
        return found

    def _lay_out(self, batch: Batch, ops: dict[int, SymmetryOps], ptr: list[int]) -> None:
        k = max(o.rotations.shape[0] for o in ops.values())
        n, v = batch.num_graphs, batch.num_nodes
        rotations = np.zeros((n, k, 3, 3))
        rotations[:, 0] = np.eye(3)
        images = np.tile(np.arange(v), (k, 1))
        orbits = np.arange(v)
        counts = np.ones(n)
        on = np.zeros(n, dtype=bool)
        on[list(ops)] = True
        for b, o in ops.items():
            kb = o.rotations.shape[0]
            rotations[b, :kb] = o.rotations
            images[:kb, ptr[b]:ptr[b + 1]] = o.images + ptr[b]
            orbits[ptr[b]:ptr[b + 1]] = o.orbits + ptr[b]
            counts[b] = kb
        dtype, dev = batch.positions.dtype, batch.device
        self.rotations = torch.as_tensor(rotations, dtype=dtype, device=dev)
        self._atom_rotations = self.rotations.index_select(0, batch.batch_idx).transpose(0, 1).contiguous()
        self._images = torch.as_tensor(images.reshape(-1), device=dev)
        self._orbits = torch.as_tensor(orbits, device=dev)
        sizes = np.bincount(orbits, minlength=v)[orbits]
        self._orbit_scale = torch.as_tensor(1.0 / sizes, dtype=dtype, device=dev).view(-1, 1)
        scale = torch.as_tensor(1.0 / counts, dtype=dtype, device=dev)
        self._system_scale = scale.view(-1, 1, 1)
        self._atom_scale = scale.index_select(0, batch.batch_idx).view(-1, 1)
        system_on = torch.as_tensor(on, device=dev)
        self._system_on = system_on.view(-1, 1, 1)
        self._atom_on = system_on.index_select(0, batch.batch_idx).view(-1, 1)

    # ------------------------------------------------------------------ inside the step
    def rank1(self, batch: Batch, vectors: torch.Tensor) -> None:
        """Average ``[V, 3]`` ``vectors`` (forces, a step) over each system's group, in place."""
        rot, images, scale = self._atom_rotations, self._images, self._atom_scale
        orbits, orbit_scale = self._orbits, self._orbit_scale
        assert rot is not None and images is not None and scale is not None
        assert orbits is not None and orbit_scale is not None
        k, v = rot.shape[0], rot.shape[1]
        w = self._work
        orbit_sums = w.get("orbit_sums", v, v, (3,), rot.dtype, rot.device)
        orbit_sums.zero_().index_add_(0, orbits, vectors.to(rot.dtype))
        mean = w.get("orbit_mean", v, v, (3,), rot.dtype, rot.device)
        torch.index_select(orbit_sums, 0, orbits, out=mean).mul_(orbit_scale)
        rotated = w.get("rotated", k, k, (v, 3, 1), rot.dtype, rot.device)
        torch.matmul(rot, mean.view(1, v, 3, 1), out=rotated)
        total = w.get("total", v, v, (3,), rot.dtype, rot.device)
        total.zero_().index_add_(0, images, rotated.view(k * v, 3))
        vectors.copy_(total.mul_(scale))

    def rank2(self, matrices: torch.Tensor) -> None:
        """Average ``[B, 3, 3]`` ``matrices`` (stress, a deformation) as ``R^T S R``, in place."""
        rot, scale = self.rotations, self._system_scale
        assert rot is not None and scale is not None
        b, k = rot.shape[0], rot.shape[1]
        w = self._work
        left = w.get("left", b, b, (k, 3, 3), rot.dtype, rot.device)
        torch.matmul(rot.transpose(-1, -2), matrices.to(rot.dtype).unsqueeze(1), out=left)
        both = w.get("both", b, b, (k, 3, 3), rot.dtype, rot.device)
        torch.matmul(left, rot, out=both)
        total = w.get("sum", b, b, (3, 3), rot.dtype, rot.device)
        torch.sum(both, dim=1, out=total)
        matrices.copy_(total.mul_(scale))

    def forces(self, batch: Batch) -> None:
        """Forces (and the stress, where the batch has one) averaged over each group."""
        self.rank1(batch, batch.forces)
        if "stress" in batch:
            self.rank2(batch.stress)

    def cell_step(self, batch: Batch, old: torch.Tensor, carry: torch.Tensor) -> None:
        """Average each symmetric system's cell change ``carry`` (``cell_new = old carry``) over
        its group as a rank-2 tensor (``carry - I``), in place, and set its new cell from it;
        other systems keep theirs bit for bit."""
        assert self._system_on is not None
        w = self._work
        eye = w.get("eye", 1, 1, (3, 3), carry.dtype, carry.device)
        torch.eye(3, dtype=carry.dtype, device=carry.device, out=eye[0])
        change = w.get("change", carry.shape[0], carry.shape[0], (3, 3), carry.dtype, carry.device)
        torch.sub(carry, eye, out=change)
        self.rank2(change)
        torch.where(self._system_on, change.add_(eye), carry, out=carry)
        cell = w.get("cell", carry.shape[0], carry.shape[0], (3, 3), carry.dtype, carry.device)
        torch.matmul(old, carry, out=cell)
        torch.where(self._system_on, cell.to(batch.cell.dtype), batch.cell, out=batch.cell)

    def position_step(self, batch: Batch, start: torch.Tensor) -> None:
        """Positions of symmetric systems moved from ``start`` by the step averaged over each
        group, in place (other systems' positions are kept bit for bit)."""
        x = batch.positions
        step = self._work.get("step", x.shape[0], x.shape[0], (3,), x.dtype, x.device)
        torch.sub(x, start, out=step)
        self.rank1(batch, step)
        torch.where(self._atom_on, step.add_(start), x, out=x)
