"""``BatchedNeighborList``: Verlet neighbour lists for every system of a batch, built by a cell
list on the device and refreshed without asking the host.

Each system has its own cell (triclinic allowed) and periodicity per axis (``batch.pbc``; without
``pbc`` a batch is open and needs no ``cell``). Every atom keeps the atoms within ``cutoff + skin``
as packed int32 entries (:mod:`.entries`), from both ends or (half list) once. Cutoffs larger than
half the cell are fine. Every :meth:`BatchedNeighborList.update` launches the same kernels; a system
rebuilds when one of its atoms moved more than ``skin / 2`` or its cell or periodicity changed
beyond what the skin absorbs (:func:`~alchemi_potentials.neighbors.kernels.follow_cell`), so a step
can be captured in a CUDA graph. Errors found on the device are raised by
:meth:`BatchedNeighborList.verify`.

Example:
    >>> from ase.build import bulk
    >>> from alchemi_core.data import Batch
    >>> from alchemi_potentials.neighbors import BatchedNeighborList
    >>> batch = Batch.from_atoms([bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)])
    >>> nl = BatchedNeighborList(cutoff=8.5125, skin=0.5, half_list=False)
    >>> nbrs = nl.update(batch)
    >>> int(nbrs.count.max()), nl.builds(batch).tolist()   # FCC shells within 9.0125 Å
    (78, [1])
    >>> i, j, shifts = nl.pairs(batch)   # for inspection: atom indices and lattice shifts
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core import warp_runtime as _warp
from alchemi_core.data.cells import check_cells as core_check_cells
from alchemi_core.data.cells import system_ids
from alchemi_core.errors import CapacityError, ConfigurationError, InvalidDataError
from alchemi_core.tuning import check_tuning
from alchemi_potentials.neighbors.layout import (
    ERROR_FIELDS,
    Layout,
    NeighborMatrix,
    listed_threads,
)
from alchemi_potentials.tuning import PotentialsTuning

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Columns kept beyond the most neighbours seen when the list sizes itself.
HEADROOM = 1.2
#: |det| of a periodic binning frame below this times the product of its row lengths is no volume.
DEGENERATE_CELL = 1e-10


class BatchedNeighborList:
    """Verlet neighbour lists of all systems of a batch (see the module docstring).

    Args:
        cutoff: Interaction range in Å; pairs closer than this are always in the list.
        skin: Extra range in Å; a system rebuilds once one of its atoms moved more than
            ``skin / 2`` since its last build. Larger skins rebuild less often but hold more pairs.
            None (default): the tuning's (``PotentialsTuning.skin``).
        max_neighbors: Columns of the neighbour matrix. None sizes it from the structures when
            the set of systems changes (one read-back then); a number never reads back, for CUDA
            graphs, and :meth:`verify` raises if an atom ever has more neighbours.
        half_list: List each pair once (from one of its atoms) instead of from both ends.
            None (default): the tuning's (``PotentialsTuning.half_list``: half on a CPU).
        join_fraction: In ``(0, 1]``. When some system rebuilds, every system with an atom that
            moved more than ``join_fraction * skin / 2`` rebuilds with it (1: only when it must).
            None (default): the tuning's (``PotentialsTuning.join_fraction``).
        tuning: The per-device choices of the search (default: ``PotentialsTuning.for_device`` of
            the batch's device; see ``alchemi_potentials.tuning``).

    Raises:
        ConfigurationError: A non-positive cutoff or max_neighbors, a negative skin, or a
            join_fraction outside ``(0, 1]``.
    """

    def __init__(self, cutoff: float, skin: float | None = None, max_neighbors: int | None = None,
                 half_list: bool | None = None, join_fraction: float | None = None,
                 tuning: PotentialsTuning | None = None) -> None:
        if not (cutoff > 0 and math.isfinite(cutoff)):
            raise ConfigurationError(f"BatchedNeighborList needs a positive, finite cutoff in Å, got {cutoff!r}")
        if skin is not None and not (skin >= 0 and math.isfinite(skin)):
            raise ConfigurationError(f"BatchedNeighborList needs a skin >= 0 Å (or None: by device), got {skin!r}")
        if max_neighbors is not None and int(max_neighbors) < 1:
            raise ConfigurationError(f"max_neighbors must be a positive integer or None, got {max_neighbors!r}")
        if join_fraction is not None and not 0 < join_fraction <= 1:
            raise ConfigurationError(
                f"BatchedNeighborList needs a join_fraction in (0, 1] (1: no early rebuilds), got {join_fraction!r}")
        check_tuning("BatchedNeighborList", tuning, PotentialsTuning)
        self.tuning = tuning
        self._join_fraction = join_fraction
        self._cutoff = float(cutoff)
        self._skin = None if skin is None else float(skin)
        self._fixed_columns = None if max_neighbors is None else int(max_neighbors)
        self._columns = self._fixed_columns or 32
        self._half_list = half_list
        self._reset()

    def _reset(self) -> None:
        """Forget every device buffer (a new batch, or a copy of this list)."""
        self._layout: Layout | None = None
        self._key: tuple[Any, ...] | None = None
        # Weak: a new batch that reuses a freed batch's id must never inherit its layout.
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
    def skin(self) -> float | None:
        """The skin in Å given, or None: by device type (:meth:`skin_on`)."""
        return self._skin

    def tuning_on(self, device_type: str) -> PotentialsTuning:
        """The per-device choices in force on a device of this type: the list's ``tuning``, else
        those measured for the device type."""
        return self.tuning if self.tuning is not None else PotentialsTuning.for_device(device_type)

    def skin_on(self, device_type: str) -> float:
        """The skin in Å in force on a device of this type (``"cuda"``, ``"cpu"``).

        Example:
            >>> BatchedNeighborList(cutoff=5.0).skin_on("cpu"), BatchedNeighborList(5.0, 0.3).skin_on("cpu")
            (1.0, 0.3)
        """
        return self._skin if self._skin is not None else self.tuning_on(device_type).skin

    def radius_on(self, device_type: str) -> float:
        """``cutoff + skin`` on a device of this type: the range of the stored pairs there."""
        return self._cutoff + self.skin_on(device_type)

    def join_fraction_on(self, device_type: str) -> float:
        """The ``join_fraction`` in force on a device of this type (``"cuda"``, ``"cpu"``)."""
        return self._join_fraction if self._join_fraction is not None else self.tuning_on(device_type).join_fraction

    @property
    def radius(self) -> float:
        """``cutoff + skin``: the range of the stored pairs (with the skin by device: on the last
        build's device, else the tuning's, else the largest any device type uses)."""
        if self._skin is not None:
            return self._cutoff + self._skin
        if self._key is not None:
            return self.radius_on(self._key[3].type)
        if self.tuning is not None:
            return self._cutoff + self.tuning.skin
        return self._cutoff + max(PotentialsTuning.for_device(d).skin for d in ("cuda", "cpu"))

    @property
    def half_list(self) -> bool | None:
        """True: each pair listed once; False: from both ends; None: by device (half on a CPU)."""
        return self._half_list

    @property
    def max_neighbors(self) -> int:
        """Columns of the neighbour matrix now (fixed, or sized from the structures)."""
        return self._columns

    def __repr__(self) -> str:
        mode = "auto" if self._fixed_columns is None else "fixed"
        half = {None: "by device", True: "half", False: "full"}[self._half_list]
        skin = "by device" if self._skin is None else self._skin
        return (f"BatchedNeighborList(cutoff={self._cutoff}, skin={skin}, "
                f"max_neighbors={self._columns} ({mode}), list={half})")

    # ------------------------------------------------------------------ the step
    def update(self, batch: Batch) -> NeighborMatrix:
        """Bring every system's list up to date (rebuilding only where needed) and return it.

        No host synchronisation or allocation once buffers exist for this set of systems, except
        that with ``max_neighbors=None`` a new set's first build reads back its most neighbours.

        Raises:
            InvalidDataError: Positions that are not float32 or float64.
            CapacityError: A system larger than packed entries address (2^25 atoms).
        """
        positions = batch.positions
        if positions.dtype not in (torch.float32, torch.float64):
            raise InvalidDataError(
                f"BatchedNeighborList needs float32 or float64 positions, got {positions.dtype}"
            )
        key = (batch.version, batch.system_capacity, batch.node_capacity, positions.device, positions.dtype)
        fresh = key != self._key or self._layout is None or not self._built_for(batch)
        if fresh:
            _warp.require_device(positions.device, who="alchemi-potentials")
            tuning = self.tuning_on(positions.device.type)
            half = tuning.half_list if self._half_list is None else bool(self._half_list)
            # The old buffers go first, so that their memory serves the new ones.
            self._layout = None
            self._layout = Layout(batch, self._columns, half, self.join_fraction_on(batch.device.type), tuning)
            self._key = key
            self._batch = weakref.ref(batch)
        layout = self._layout
        assert layout is not None
        if layout.num_atoms == 0:
            return layout.matrix
        self._run(layout, batch)
        if fresh and self._fixed_columns is None:
            most = int(self._most_per_system(layout).max())
            if most > layout.columns:
                self._columns = max(self._columns, int(math.ceil(most * HEADROOM)) + 8)
                layout.allocate_columns(self._columns)
                self._run(layout, batch)
        return layout.matrix

    def _inputs(self, layout: Layout, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Positions, cell ``[B, 3, 3]`` in their dtype and pbc ``[B, 3]`` bool (allocated once)."""
        pos = batch.positions
        n, store = layout.num_systems, layout.inputs

        def held(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            buf = store.get(name)
            if buf is None or buf.dtype != dtype:
                buf = store[name] = torch.zeros(shape, dtype=dtype, device=pos.device)
            return buf

        pbc = batch.pbc if "pbc" in batch else held("no_pbc", (n, 3), torch.bool)
        if pbc.dtype != torch.bool:
            pbc = held("pbc_bool", tuple(pbc.shape), torch.bool).copy_(pbc)
        if "cell" not in batch:
            # Periodic axes without a cell: a zero-volume cell in verify() (check_batch rejects them).
            cell = held("no_cell", (n, 3, 3), pos.dtype)
        elif batch.cell.dtype != pos.dtype or not batch.cell.is_contiguous():
            cell = held("cell_cast", (n, 3, 3), pos.dtype).copy_(batch.cell)
        else:
            cell = batch.cell
        return pos, cell, pbc

    def _run(self, layout: Layout, batch: Batch) -> None:
        from alchemi_potentials.neighbors import kernels as k
        from alchemi_potentials.neighbors import search as searches

        pos, cell, pbc = self._inputs(layout, batch)
        self.last_cell = cell
        key = (pos.data_ptr(), cell.data_ptr(), pbc.data_ptr())
        seqs = layout.launches.get(key)
        if seqs is None:
            wp = _warp.warp()
            vec, mat = (wp.vec3d, wp.mat33d) if pos.dtype == torch.float64 else (wp.vec3f, wp.mat33f)
            positions, cells, periodic = _warp.view(pos, vec), _warp.view(cell, mat), _warp.view(pbc)
            g, a, m = layout.systems, layout.atoms, layout.matrix
            ref, wrapped = layout.warp_reference, layout.warp_wrapped
            skin = self.skin_on(pos.device.type)
            ns, na, r = layout.num_systems, layout.num_atoms, self._cutoff + skin
            before = _warp.LaunchSequence(positions.device, who="alchemi-potentials")
            before.add(k.follow_cell, ns, [cells, periodic, g, wp.float64(self._cutoff), wp.float64(skin),
                                           layout.warp_image_cell])
            join = layout.join_fraction
            before.add(k.check_moved, na, [positions, ref, wrapped, g, a, wp.float64(join * join)])
            before.add(k.begin_build, ns, [cells, periodic, g, wp.float64(r), wp.float64(DEGENERATE_CELL),
                                           layout.warp_image_cell])
            before.add(k.bin_atoms, na, [positions, g, a])
            after = _warp.LaunchSequence(positions.device, who="alchemi-potentials")
            after.add(k.sort_into_bins, na, [positions, ref, wrapped, g, a])
            parts = layout.search_parts
            search = [wrapped, g, a, wp.float64(r * r), m.pair_list.entries, m.pair_list.count,
                      _warp.view(layout.found_in_part), int(m.half)]
            passes = (0, 1) if parts > 1 else (1,)  # in parts: count, then write at the counted offsets
            search_kernel = searches.search_kernel(layout.tuning.search_trim)
            work_slot = _warp.view(layout.work_slot)
            if layout.listed:
                after.add(k.list_work, na, [g, a, work_slot])
                threads = listed_threads(pos.device, parts * na)
                for write in passes:  # each thread striding the list
                    after.add(search_kernel, threads, [*search, write, na, work_slot, ns - 1, threads])
            elif parts > 1:
                for write in passes:
                    after.add(search_kernel, parts * na, [*search, write, na, work_slot, ns - 1, 0])
            else:
                after.add(search_kernel, na, [*search, 1, na, work_slot, ns - 1, 0])
            seqs = layout.launches[key] = (before, after)
        stream = _warp.stream_for(pos.device)
        before, after = seqs
        before.run(stream)
        # Bin ends (and a listed search's offsets of each system's rebuilding slots).
        nb = layout.num_bins
        torch.cumsum(layout.bin_count[:nb], 0, dtype=torch.int32, out=layout.bin_end[:nb])
        if layout.listed:
            s = layout.system_tensors
            torch.cumsum(s["work"][:layout.num_systems], 0, dtype=torch.int32, out=s["work_end"][:layout.num_systems])
        after.run(stream)

    # ------------------------------------------------------------------ inspection and checks
    def _most_per_system(self, layout: Layout) -> np.ndarray:
        """The most neighbours of one atom of each system at its last build (reads back)."""
        n = layout.num_systems
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        counts = layout.matrix.count.cpu().numpy()
        starts = layout.first_atom
        most = np.zeros(n, dtype=np.int64)
        filled = layout.atoms_per_system > 0
        most[filled] = np.maximum.reduceat(counts, starts[filled]) if len(counts) else 0
        overflow = layout.system_tensors["overflow"][:n].cpu().numpy()
        return np.maximum(most, overflow)

    def most_neighbors(self, batch: Batch) -> np.ndarray:
        """The most neighbours any atom of each system had at its last build (reads back)."""
        return self._most_per_system(self._require(batch))

    def builds(self, batch: Batch) -> torch.Tensor:
        """``[B]`` how many times each system's list was built since its set of systems formed."""
        return self._require(batch).system_tensors["builds"][: batch.num_graphs]

    def pairs(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The listed pairs as atom indices ``i, j`` and integer lattice shifts ``S [n, 3]``, such
        that ``positions[j] - positions[i] + S @ cell`` is within ``radius`` (ASE's convention).
        Reads everything back: for tests and inspection, not per step.

        Example:
            >>> from ase.build import bulk
            >>> from alchemi_core.data import Batch
            >>> batch = Batch.from_atoms([bulk("Ar", "fcc", a=5.26, cubic=True)])
            >>> nl = BatchedNeighborList(cutoff=4.0, skin=0.0, half_list=False)
            >>> _ = nl.update(batch)
            >>> i, j, shifts = nl.pairs(batch)
            >>> len(i) // batch.num_nodes  # each atom of FCC argon has 12 neighbours within 4 Å
            12
        """
        from alchemi_potentials.neighbors import entries

        layout = self._require(batch)
        m = layout.matrix
        count = m.count.cpu().numpy()
        columns = np.arange(m.entries.shape[0])[:, None]
        valid = columns < count[None, :]
        k, t = np.nonzero(valid)
        codes = m.entries.cpu().numpy()[k, t]
        system = layout.atom_tensors["system"][: layout.num_atoms].cpu().numpy()
        local, image = entries.decode(codes, layout.index_bits[system[t]])
        u = layout.first_atom[system[t]] + local
        order = m.order.cpu().numpy()
        wrap = layout.atom_tensors["wrap"][: layout.num_atoms].cpu().numpy()
        return order[t], order[u], image + wrap[t] - wrap[u]

    def verify(self, batch: Batch) -> None:
        """Raise what the device recorded since the lists were allocated (reads back).

        Raises:
            CapacityError: An atom had more neighbours than ``max_neighbors`` columns.
            InvalidDataError: A periodic cell lost its volume, a cell is too thin for the periodic
                images an entry holds, or atoms lie absurdly far outside their cell (or are NaN).
        """
        layout = self._layout
        if layout is None or not self._built_for(batch) or layout.num_systems == 0:
            return
        n = layout.num_systems
        # One read-back for all four records; ids and statuses only for an error message.
        table = layout.errors[:, :n].cpu().numpy()
        if not table.any():
            return
        flags = dict(zip(ERROR_FIELDS, table, strict=True))
        ids = system_ids(batch)
        if "status" in batch and batch.num_graphs == n:
            # Quarantined structures (negative status) went bad already and are leaving the run.
            keep = batch.status.detach().reshape(-1).cpu().numpy() >= 0
            flags = {name: np.where(keep, f, 0) for name, f in flags.items()}

        def which(name: str) -> list[int]:
            return ids[np.nonzero(flags[name])[0]][:10].tolist()

        if flags["bad_cell"].any():
            raise InvalidDataError(
                f"systems {which('bad_cell')} have a periodic cell with (nearly) zero volume or non-finite "
                "entries; their neighbour lists are empty and their forces wrong"
            )
        if flags["overflow"].any():
            need = max(int(flags["overflow"].max()), self._exact_need(batch))
            raise CapacityError(
                f"neighbour list overflow: atoms of systems {which('overflow')} had up to {need} "
                f"neighbours within cutoff + skin = {self.radius_on(batch.device.type):g} Å, but max_neighbors is {layout.columns}, "
                "so pairs were dropped and these forces are wrong; pass max_neighbors="
                f"{int(math.ceil(need * HEADROOM))} (or None, to size it from the structures)"
            )
        if flags["image_out_of_range"].any():
            raise InvalidDataError(
                f"systems {which('image_out_of_range')} need periodic images further away than their "
                "neighbour entries hold (a periodic axis much thinner than the cutoff in a very large "
                "system), so pairs were dropped; repeat the cell along its thin axes"
            )
        if flags["far_atoms"].any():
            raise InvalidDataError(
                f"atoms of systems {which('far_atoms')} lie more than a million cells outside their "
                "periodic cell, or have non-finite positions; wrap the positions into the cell "
                "(hook:wrap-periodic) and check for NaN"
            )

    def error_flag(self, batch: Batch) -> torch.Tensor | None:
        """A 0-d device tensor, True when :meth:`verify` may raise (no read-back); None before the
        first build for ``batch``."""
        layout = self._layout
        if layout is None or not self._built_for(batch) or layout.num_systems == 0:
            return None
        return layout.errors[:, : layout.num_systems].any()

    def _exact_need(self, batch: Batch) -> int:
        """The most neighbours of any atom, from a list that sizes itself (the error path only)."""
        sized = BatchedNeighborList(self._cutoff, self._skin, half_list=self._half_list, tuning=self.tuning)
        sized.update(batch)
        return int(sized.most_neighbors(batch).max())

    def _built_for(self, batch: Batch) -> bool:
        return self._batch is not None and self._batch() is batch

    def _require(self, batch: Batch) -> Layout:
        if self._layout is None or not self._built_for(batch):
            raise InvalidDataError("this neighbour list has not been built for this batch; call update(batch) first")
        return self._layout

    def memory_bytes(self) -> int:
        """Device bytes held by the current buffers."""
        return 0 if self._layout is None else self._layout.nbytes()


def check_cells(batch: Batch, who: str, radius: float | None = None) -> None:
    """Reject periodic systems whose cell cannot define images (reads the cells back once):
    :func:`alchemi_core.data.cells.check_cells`, and with ``radius`` (cutoff + skin, Å) also
    periodic axes too thin for the images a neighbour entry holds.

    Raises:
        InvalidDataError: Periodic axes without a cell, a degenerate or non-finite periodic
            cell, or a cell too thin across a periodic axis.
    """
    measured = core_check_cells(batch, who)
    if radius is not None and measured is not None:
        _check_thickness(batch, who, radius, *measured)


#: Periodic images a search may walk either side along one axis (the bins' reach on the device).
MAX_REACH = 512


def _check_thickness(
    batch: Batch, who: str, radius: float, pbc: np.ndarray, widths: np.ndarray
) -> None:
    """Reject periodic axes so thin (Å across the cell) that the radius needs more periodic images
    than a neighbour entry holds."""
    from alchemi_potentials.neighbors import entries

    atoms = np.asarray(batch.num_nodes_list, dtype=np.int64)
    limits = np.minimum((1 << (entries.image_bits(entries.index_bits(atoms)) - 1)) - 1, MAX_REACH)
    with np.errstate(divide="ignore"):
        need = np.ceil(radius / widths)  # inf across a zero width; 0 across a non-periodic axis
    over = np.argwhere(pbc & (need > limits[:, None]))
    if len(over):
        s, axis = (int(v) for v in over[0])
        raise InvalidDataError(
            f"{who}: system {system_ids(batch)[s]} is periodic along cell vector {axis} but the cell is only "
            f"{widths[s, axis]:.4g} Å thick across it, against a cutoff + skin of {radius:g} Å: that needs "
            f"{need[s, axis]:.0f} periodic images each side, more than the {int(limits[s])} a neighbour list of "
            f"{int(atoms[s])} atoms holds, so pairs would be dropped. Check that the cell is in Å, "
            "or repeat the cell along that vector"
        )
