"""``BatchedNeighborList``: Verlet neighbour lists for every system of a batch, built by a cell
list on the device and refreshed without ever asking the host.

Each system has its own cell (triclinic allowed) and its own periodicity per axis (``batch.pbc``;
a batch without ``pbc`` is not periodic, and then needs no ``cell``). Every atom keeps the atoms
within ``cutoff + skin`` in a dense row of a ``[max_neighbors, atoms]`` matrix, with the lattice
shift of the image it sees (from both ends on a GPU; once, by one of its atoms, on a CPU).
Cutoffs larger than half the cell are fine: the search walks as many periodic images as the
radius needs, so a cell smaller than twice the cutoff is handled exactly.

Every call of :meth:`BatchedNeighborList.update` launches the same kernels: the atoms of each
system check how far they moved since their system's last build, and a system rebuilds when one
moved more than ``skin / 2`` or its cell or periodicity changed; the other systems' threads
return at once. No value is read back, so the step can be captured in a CUDA graph. Buffers are
allocated when the set of systems changes (``batch.version``) and reused otherwise.

Errors found on the device (more neighbours than columns, a cell that lost its volume, atoms
hundreds of cells outside theirs) are raised by :meth:`BatchedNeighborList.verify`, which the
engine calls at check steps.

Example:
    >>> from ase.build import bulk
    >>> from alchemi_core.data import Batch
    >>> from alchemi_potentials.neighbors import BatchedNeighborList
    >>> batch = Batch.from_atoms([bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)])
    >>> nl = BatchedNeighborList(cutoff=8.5125, skin=0.5, half_list=False)
    >>> nbrs = nl.update(batch)
    >>> int(nbrs.count.max()), nl.builds(batch).tolist()   # FCC shells within 9.0125 Å
    (78, [1])
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

from alchemi_core.errors import CapacityError, ConfigurationError, InvalidDataError
from alchemi_potentials import _warp

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Columns kept beyond the most neighbours seen when the list sizes itself.
HEADROOM = 1.2
#: Atoms per bin of bin storage: a system gets ceil(atoms / ATOMS_PER_BIN) bins at most. (Bins
#: half a list radius thick hold about 13 atoms of a dense liquid or solid at usual cutoffs; the
#: cap matters for sparse systems, where it keeps memory and the per-step bin scan O(atoms).)
ATOMS_PER_BIN = 2


@attrs.frozen
class NeighborMatrix:
    """The neighbours of every atom, as the kernels read them.

    Attributes:
        index: ``[max_neighbors, atoms]`` int32; neighbour ``k`` of atom ``i`` is ``index[k, i]``.
        shift: ``[max_neighbors, atoms]`` int32 packed lattice shifts (see :func:`decode_shifts`);
            the neighbour's image is at ``x[j] + shift @ cell``.
        count: ``[atoms]`` int32, how many entries of each column are valid.
        warp_index, warp_shift, warp_count: The same memory as Warp arrays.
        warp_atom_system: int32 Warp array, the system of every atom.
        half: True when each pair is listed once (by one of its atoms), False when from both ends.
    """

    index: torch.Tensor
    shift: torch.Tensor
    count: torch.Tensor
    warp_index: Any
    warp_shift: Any
    warp_count: Any
    warp_atom_system: Any
    half: bool


def decode_shifts(codes: torch.Tensor) -> torch.Tensor:
    """Unpack shift codes into integer lattice shifts ``[..., 3]``.

    Example:
        >>> decode_shifts(torch.tensor([512 | 512 << 10 | 513 << 20])).tolist()
        [[0, 0, 1]]
    """
    c = codes.to(torch.int64)
    return torch.stack([(c & 1023) - 512, ((c >> 10) & 1023) - 512, ((c >> 20) & 1023) - 512], dim=-1)


# Buffers of the kernels' SystemState and AtomState structs: name -> (trailing shape, dtype,
# Warp element type name or None, initial value).
_SYSTEM_FIELDS: dict[str, tuple[tuple[int, ...], torch.dtype, str | None, float]] = {
    "moved": ((), torch.int32, None, 1),  # 1: everything builds the first time
    "rebuild": ((), torch.int32, None, 0),
    "builds": ((), torch.int64, None, 0),
    "cell": ((3, 3), torch.float64, "mat33d", math.nan),
    "pbc": ((3,), torch.int32, "vec3i", -1),
    "basis_inv": ((3, 3), torch.float64, "mat33d", 0),
    "spacing": ((3,), torch.float64, "vec3d", 0),
    "lower": ((3,), torch.float64, None, 0),
    "upper": ((3,), torch.float64, None, 0),
    "bin_capacity": ((), torch.int32, None, 0),
    "bin_start": ((), torch.int32, None, 0),
    "dims": ((3,), torch.int32, "vec3i", 0),
    "reach": ((3,), torch.int32, "vec3i", 0),
    "origin": ((3,), torch.float64, "vec3d", 0),
    "inv_width": ((3,), torch.float64, "vec3d", 0),
    "bad_cell": ((), torch.int32, None, 0),
    "most_neighbors": ((), torch.int32, None, 0),
    "shift_out_of_range": ((), torch.int32, None, 0),
}
_ATOM_FIELDS: dict[str, tuple[tuple[int, ...], torch.dtype, str | None, float]] = {
    "system": ((), torch.int32, None, 0),
    "reference": ((3,), torch.float64, "vec3d", 0),
    "fractional": ((3,), torch.float64, "vec3d", 0),
    "wrap": ((3,), torch.int32, "vec3i", 0),
    "bin": ((3,), torch.int32, "vec3i", 0),
    "slot": ((), torch.int32, None, 0),
    "sorted": ((), torch.int32, None, 0),
}


class _Layout:
    """Device buffers for one set of systems (one ``batch.version``), reused while it lasts."""

    def __init__(self, batch: Batch, columns: int, half: bool) -> None:
        from alchemi_potentials.neighbors import kernels

        wp = _warp.warp()
        dev = batch.device
        self.device = dev
        self.half = half
        self.num_systems = n = batch.num_graphs
        self.num_atoms = batch.num_nodes
        s_cap, v_cap = max(1, batch.system_capacity), max(1, batch.node_capacity)
        counts = batch.num_nodes_per_system
        # Bin storage: each system's share, fixed while its atoms stay the same.
        caps = np.maximum(1, -(-counts // ATOMS_PER_BIN)).astype(np.int64)
        starts = np.concatenate(([0], np.cumsum(caps)[:-1])).astype(np.int64)
        self.num_bins = int(caps.sum()) if len(caps) else 0

        def allocate(fields: dict, rows: int, struct: Any) -> dict[str, torch.Tensor]:
            out = {}
            for name, (shape, dtype, wtype, init) in fields.items():
                t = out[name] = torch.full((rows, *shape), init, dtype=dtype, device=dev)
                setattr(struct, name, _warp.view(t, getattr(wp, wtype) if wtype else None))
            return out

        self.systems = kernels.SystemState()
        self.atoms = kernels.AtomState()
        self.system_tensors = allocate(_SYSTEM_FIELDS, s_cap, self.systems)
        self.atom_tensors = allocate(_ATOM_FIELDS, v_cap, self.atoms)
        bins = max(1, self.num_bins)
        self.bin_count = torch.zeros(bins, dtype=torch.int32, device=dev)
        self.bin_end = torch.zeros(bins, dtype=torch.int32, device=dev)
        self.atoms.bin_count, self.atoms.bin_end = _warp.view(self.bin_count), _warp.view(self.bin_end)
        if n:
            self.system_tensors["bin_capacity"][:n] = torch.from_numpy(caps).to(dev, torch.int32)
            self.system_tensors["bin_start"][:n] = torch.from_numpy(starts).to(dev, torch.int32)
            self.atom_tensors["system"][: self.num_atoms] = batch.batch_idx.to(torch.int32)
        self.inputs: dict[str, torch.Tensor] = {}  # cell/pbc stand-ins, see BatchedNeighborList._inputs
        self.allocate_columns(columns)

    def allocate_columns(self, columns: int) -> None:
        """(Re)allocate the neighbour matrix with ``columns`` rows and force a full rebuild."""
        v_cap = self.atom_tensors["system"].shape[0]
        # Indexed [k, i] everywhere. On a GPU the memory is [columns, atoms] (a warp of threads
        # reads one row: coalesced); on a CPU, where one thread walks one atom's neighbours, it is
        # [atoms, columns] seen through a transposed view, so each atom's neighbours are contiguous.
        gpu = self.device.type == "cuda"
        matrices = []
        for _ in ("index", "shift"):
            m = torch.zeros((columns, v_cap) if gpu else (v_cap, columns), dtype=torch.int32, device=self.device)
            matrices.append(m if gpu else m.t())
        count = torch.zeros(v_cap, dtype=torch.int32, device=self.device)
        self.matrix_tensors = (*matrices, count)
        s = self.system_tensors
        s["moved"].fill_(1)
        s["most_neighbors"].zero_()
        s["builds"].zero_()
        self.columns = columns
        n_atoms = self.num_atoms
        self.matrix = NeighborMatrix(
            index=matrices[0][:, :n_atoms],
            shift=matrices[1][:, :n_atoms],
            count=count[:n_atoms],
            warp_index=_warp.view(matrices[0]),
            warp_shift=_warp.view(matrices[1]),
            warp_count=_warp.view(count),
            warp_atom_system=self.atoms.system,
            half=self.half,
        )
        self.launches: dict[tuple[int, ...], tuple[_warp.LaunchSequence, _warp.LaunchSequence]] = {}

    def nbytes(self) -> int:
        held = [*self.system_tensors.values(), *self.atom_tensors.values(), *self.inputs.values(),
                *self.matrix_tensors, self.bin_count, self.bin_end]
        return sum(t.numel() * t.element_size() for t in held)


class BatchedNeighborList:
    """Verlet neighbour lists of all systems of a batch (see the module docstring).

    Args:
        cutoff: Interaction range in Å; pairs closer than this are always in the list.
        skin: Extra range in Å; a system rebuilds once one of its atoms moved more than
            ``skin / 2`` since its last build. Larger skins rebuild less often but hold more pairs.
        max_neighbors: Columns of the neighbour matrix. None sizes it from the structures when
            the set of systems changes (one read-back then); a number never reads back, for CUDA
            graphs, and :meth:`verify` raises if an atom ever has more neighbours.
        half_list: List each pair once (from one of its atoms) instead of from both ends.
            None (default): half on a CPU, where a kernel's threads run one after another and
            Newton's third law halves the work; full on a GPU, where each thread writes only
            its own atom (no atomics on forces) and reads stay coalesced.

    Raises:
        ConfigurationError: A non-positive cutoff or max_neighbors, or a negative skin.
    """

    def __init__(self, cutoff: float, skin: float = 0.5, max_neighbors: int | None = None,
                 half_list: bool | None = None) -> None:
        if not (cutoff > 0 and math.isfinite(cutoff)):
            raise ConfigurationError(f"BatchedNeighborList needs a positive, finite cutoff in Å, got {cutoff!r}")
        if not (skin >= 0 and math.isfinite(skin)):
            raise ConfigurationError(f"BatchedNeighborList needs a skin >= 0 Å, got {skin!r}")
        if max_neighbors is not None and int(max_neighbors) < 1:
            raise ConfigurationError(f"max_neighbors must be a positive integer or None, got {max_neighbors!r}")
        self._cutoff = float(cutoff)
        self._skin = float(skin)
        self._fixed_columns = None if max_neighbors is None else int(max_neighbors)
        self._columns = self._fixed_columns or 32
        self._half_list = half_list
        self._reset()

    def _reset(self) -> None:
        """Forget every device buffer (a new batch, or a copy of this list)."""
        self._layout: _Layout | None = None
        self._key: tuple[Any, ...] | None = None
        # The batch the buffers belong to, weakly: a new batch that happens to reuse a freed
        # batch's id (and version) must never inherit its layout.
        self._batch: weakref.ref[Batch] | None = None
        self.last_cell: torch.Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_layout", "_key", "_batch", "last_cell"):
            state[name] = None
        return state

    # ------------------------------------------------------------------ properties
    @property
    def cutoff(self) -> float:
        """Interaction range in Å (the list holds pairs up to ``cutoff + skin``)."""
        return self._cutoff

    @property
    def skin(self) -> float:
        return self._skin

    @property
    def radius(self) -> float:
        """``cutoff + skin``: the range of the stored pairs."""
        return self._cutoff + self._skin

    @property
    def half_list(self) -> bool | None:
        """True: each pair listed once; False: from both ends; None: by device (half on a CPU)."""
        return self._half_list

    @property
    def sizes_itself(self) -> bool:
        """True when ``max_neighbors`` was None: columns follow the structures."""
        return self._fixed_columns is None

    @property
    def max_neighbors(self) -> int:
        """Columns of the neighbour matrix now (fixed, or sized from the structures)."""
        return self._columns

    def __repr__(self) -> str:
        mode = "auto" if self._fixed_columns is None else "fixed"
        half = {None: "by device", True: "half", False: "full"}[self._half_list]
        return (f"BatchedNeighborList(cutoff={self._cutoff}, skin={self._skin}, "
                f"max_neighbors={self._columns} ({mode}), list={half})")

    # ------------------------------------------------------------------ the step
    def update(self, batch: Batch) -> NeighborMatrix:
        """Bring every system's list up to date (rebuilding only where needed) and return it.

        Makes no host synchronisation once buffers exist for this set of systems, except that
        with ``max_neighbors=None`` the first build of a new set of systems reads back the most
        neighbours any atom has, to size the matrix.
        """
        positions = batch.positions
        if positions.dtype not in (torch.float32, torch.float64):
            raise InvalidDataError(
                f"BatchedNeighborList needs float32 or float64 positions, got {positions.dtype}"
            )
        key = (batch.version, batch.system_capacity, batch.node_capacity, positions.device)
        fresh = key != self._key or self._layout is None or not self._built_for(batch)
        if fresh:
            half = positions.device.type != "cuda" if self._half_list is None else bool(self._half_list)
            self._layout = _Layout(batch, self._columns, half)
            self._key = key
            self._batch = weakref.ref(batch)
        layout = self._layout
        assert layout is not None
        if layout.num_atoms == 0:
            return layout.matrix
        self._run(layout, batch)
        if fresh and self._fixed_columns is None:
            most = int(layout.system_tensors["most_neighbors"][: layout.num_systems].max())
            if most > layout.columns:
                self._columns = max(self._columns, int(math.ceil(most * HEADROOM)) + 8)
                layout.allocate_columns(self._columns)
                self._run(layout, batch)
        return layout.matrix

    def _inputs(self, layout: _Layout, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Positions, cell ``[B, 3, 3]`` in the positions' dtype, and pbc ``[B, 3]`` bool."""
        pos = batch.positions
        n = layout.num_systems
        store = layout.inputs
        if "pbc" in batch:
            pbc = batch.pbc
            if pbc.dtype != torch.bool:
                pbc = store.setdefault("pbc_bool", torch.zeros(pbc.shape, dtype=torch.bool, device=pbc.device))
                pbc.copy_(batch.pbc)
        else:
            pbc = store.setdefault("no_pbc", torch.zeros((n, 3), dtype=torch.bool, device=pos.device))
        if "cell" in batch:
            cell = batch.cell
            if cell.dtype != pos.dtype or not cell.is_contiguous():
                buf = store.get("cell_cast")
                if buf is None or buf.dtype != pos.dtype:
                    buf = store["cell_cast"] = torch.empty((n, 3, 3), dtype=pos.dtype, device=pos.device)
                buf.copy_(cell)
                cell = buf
        else:
            # Periodic axes without a cell show up as a zero-volume cell in verify(); check_batch
            # of the models rejects them before a run.
            cell = store.get("no_cell")
            if cell is None or cell.dtype != pos.dtype:
                cell = store["no_cell"] = torch.zeros((n, 3, 3), dtype=pos.dtype, device=pos.device)
        return pos, cell, pbc

    def _run(self, layout: _Layout, batch: Batch) -> None:
        from alchemi_potentials.neighbors import kernels as k

        pos, cell, pbc = self._inputs(layout, batch)
        self.last_cell = cell
        key = (pos.data_ptr(), cell.data_ptr(), pbc.data_ptr(), int(pos.dtype == torch.float64))
        seqs = layout.launches.get(key)
        if seqs is None:
            wp = _warp.warp()
            vec, mat = (wp.vec3d, wp.mat33d) if pos.dtype == torch.float64 else (wp.vec3f, wp.mat33f)
            positions, cells, periodic = _warp.view(pos, vec), _warp.view(cell, mat), _warp.view(pbc)
            g, a, m = layout.systems, layout.atoms, layout.matrix
            ns, na, r = layout.num_systems, layout.num_atoms, self.radius
            before = _warp.LaunchSequence(positions.device)
            before.add(k.mark_moved, na, [positions, g, a, wp.float64((self._skin / 2) ** 2)])
            before.add(k.begin_build, ns, [cells, periodic, g])
            before.add(k.fractional_coordinates, na, [positions, g, a])
            before.add(k.grid_layout, ns, [g, wp.float64(r)])
            before.add(k.count_into_bins, na, [g, a])
            after = _warp.LaunchSequence(positions.device)
            after.add(k.sort_into_bins, na, [g, a])
            after.add(k.search_neighbors, na, [positions, g, a, wp.float64(r * r), m.warp_index, m.warp_shift,
                                               m.warp_count, int(m.half)])
            seqs = layout.launches[key] = (before, after)
        stream = _warp.stream_for(pos.device)
        before, after = seqs
        before.run(stream)
        # Bin ends: the one step that needs every bin's count at once.
        nb = layout.num_bins
        torch.cumsum(layout.bin_count[:nb], 0, dtype=torch.int32, out=layout.bin_end[:nb])
        after.run(stream)

    # ------------------------------------------------------------------ checks
    def most_neighbors(self, batch: Batch) -> np.ndarray:
        """The most neighbours any atom of each system had at a build (reads back)."""
        return self._require(batch).system_tensors["most_neighbors"][: batch.num_graphs].cpu().numpy()

    def builds(self, batch: Batch) -> torch.Tensor:
        """``[B]`` how many times each system's list was built since its set of systems formed."""
        return self._require(batch).system_tensors["builds"][: batch.num_graphs]

    def verify(self, batch: Batch) -> None:
        """Raise what the device recorded since the lists were allocated (reads back).

        Raises:
            CapacityError: An atom had more neighbours than ``max_neighbors`` columns.
            InvalidDataError: A periodic cell lost its volume, or atoms sit hundreds of cells
                outside their cell.
        """
        layout = self._layout
        if layout is None or not self._built_for(batch) or layout.num_systems == 0:
            return
        n = layout.num_systems
        t = layout.system_tensors
        most = t["most_neighbors"][:n].cpu().numpy()
        bad = t["bad_cell"][:n].cpu().numpy()
        far = t["shift_out_of_range"][:n].cpu().numpy()
        ids = _system_ids(batch)
        if bad.any():
            raise InvalidDataError(
                f"systems {ids[np.nonzero(bad)[0]][:10].tolist()} have a periodic cell with (nearly) zero "
                "volume or non-finite entries; their neighbour lists are empty and their forces wrong"
            )
        over = np.nonzero(most > layout.columns)[0]
        if len(over):
            need = int(most.max())
            raise CapacityError(
                f"neighbour list overflow: atoms of systems {ids[over][:10].tolist()} had up to {need} "
                f"neighbours within cutoff + skin = {self.radius:g} Å, but max_neighbors is {layout.columns}, "
                "so pairs were dropped and these forces are wrong; pass max_neighbors="
                f"{int(math.ceil(need * HEADROOM))} (or None, to size it from the structures)"
            )
        if far.any():
            raise InvalidDataError(
                f"atoms of systems {ids[np.nonzero(far)[0]][:10].tolist()} lie more than 500 cells outside "
                "their periodic cell; wrap the positions into the cell (hook:wrap-periodic)"
            )

    def _built_for(self, batch: Batch) -> bool:
        return self._batch is not None and self._batch() is batch

    def _require(self, batch: Batch) -> _Layout:
        if self._layout is None or not self._built_for(batch):
            raise InvalidDataError("this neighbour list has not been built for this batch; call update(batch) first")
        return self._layout

    def memory_bytes(self) -> int:
        """Device bytes held by the current buffers."""
        return 0 if self._layout is None else self._layout.nbytes()


def _system_ids(batch: Batch) -> np.ndarray:
    if "system_id" in batch:
        return batch.system_id.detach().cpu().numpy()
    return np.arange(batch.num_graphs)


def check_cells(batch: Batch, who: str) -> None:
    """Reject periodic systems whose cell cannot define images (reads the cells back).

    A periodic axis needs a cell row; the periodic rows of a system must span a line, a plane or
    a volume (nonzero length, area or volume). Left-handed cells (negative determinant) are
    valid, as in ASE: volumes are taken as ``|det(cell)|``.

    Raises:
        InvalidDataError: Periodic axes without a cell, or a degenerate or non-finite periodic cell.
    """
    if "pbc" not in batch or batch.num_graphs == 0:
        return
    pbc = batch.pbc.detach().to("cpu", torch.bool).numpy()
    periodic = pbc.any(axis=1)
    if not periodic.any():
        return
    ids = _system_ids(batch)
    if "cell" not in batch:
        raise InvalidDataError(
            f"{who}: systems {ids[periodic][:10].tolist()} are periodic (pbc) but the batch has no cell; "
            "give every periodic structure a cell"
        )
    cells = batch.cell.detach().to("cpu", torch.float64).numpy()
    bad: list[int] = []
    for s in np.nonzero(periodic)[0]:
        rows = cells[s][pbc[s]]
        if not np.isfinite(rows).all():
            bad.append(s)
            continue
        lengths = np.linalg.norm(rows, axis=1)
        if len(rows) == 1:
            size, scale = lengths[0], 1.0
        elif len(rows) == 2:
            size, scale = np.linalg.norm(np.cross(rows[0], rows[1])), lengths.prod()
        else:
            size, scale = abs(np.linalg.det(rows)), lengths.prod()
        if not (size > 1e-10 * scale and size > 0):
            bad.append(s)
    if bad:
        detail = ", ".join(f"{ids[s]}: {cells[s].round(6).tolist()} (pbc {pbc[s].tolist()})" for s in bad[:3])
        raise InvalidDataError(
            f"{who}: systems {ids[bad][:10].tolist()} have a periodic cell with zero volume (the periodic "
            f"cell vectors are zero, parallel or coplanar), so periodic images are undefined: {detail}; "
            "fix the cell or set pbc False on axes that are not periodic"
        )
