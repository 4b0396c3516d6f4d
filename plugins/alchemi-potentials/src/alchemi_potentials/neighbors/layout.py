"""Device buffers of a neighbour list for one set of systems (allocated when ``batch.version``
changes, reused by every step), and the view models read.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

from alchemi_core import warp_runtime as _warp
from alchemi_core.errors import CapacityError
from alchemi_potentials.tuning import PotentialsTuning

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Atoms per bin of bin storage: a system gets ceil(atoms / ATOMS_PER_BIN) bins at most (keeps a
#: sparse system's memory and bin scan O(atoms)).
ATOMS_PER_BIN = 2
#: Columns of the neighbour matrix come in multiples of this (the pair kernels' unroll).
COLUMNS_MULTIPLE_OF = 4
#: The search runs in parts only in a batch of at most this many atoms, none of whose systems holds
#: more than PARTS_LARGEST_SHARE of them; elsewhere enough slots rebuild to fill the GPU.
PARTS_MAX_ATOMS = 300_000
PARTS_LARGEST_SHARE = 1 / 16
#: Threads of a listed search per streaming multiprocessor (what one holds at once).
LISTED_THREADS_PER_SM = 2048
#: Threads of a listed search on a CPU, each walking the list in strides.
LISTED_THREADS_CPU = 64


def search_parts(tuning: PotentialsTuning, atoms_per_system: np.ndarray, join_fraction: float = 1.0) -> int:
    """Threads per slot of the neighbour search for a batch of these system sizes: parts pay only
    where systems rebuild one at a time (``join_fraction`` 1.0), not in cohorts.

    Example:
        >>> gpu = PotentialsTuning.for_device("cuda")
        >>> search_parts(gpu, np.full(1024, 256)), search_parts(gpu, np.full(4096, 256))
        (9, 1)
        >>> search_parts(gpu, np.full(1024, 256), join_fraction=0.8)
        1
    """
    if tuning.force_search_parts is not None:
        return tuning.force_search_parts
    if join_fraction < 1.0:
        return 1
    parts = tuning.search_parts
    total = int(atoms_per_system.sum()) if len(atoms_per_system) else 0
    if parts == 1 or not total:
        return parts
    if total <= PARTS_MAX_ATOMS and int(atoms_per_system.max()) <= PARTS_LARGEST_SHARE * total:
        return parts
    return 1


def listed_threads(device: torch.device, work: int) -> int:
    """Threads of a listed search on ``device`` for at most ``work`` slots and parts.

    Example:
        >>> listed_threads(torch.device("cpu"), 1000), listed_threads(torch.device("cpu"), 3)
        (64, 3)
    """
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        most = sms * LISTED_THREADS_PER_SM
    else:
        most = LISTED_THREADS_CPU
    return max(1, min(work, most))


@attrs.frozen
class NeighborMatrix:
    """The neighbours of every atom, as the pair kernels read them (valid until the next update).

    Slot ``t`` holds atom ``order[t]`` at wrapped position ``wrapped[t]``; its neighbour ``k`` is
    the packed entry ``entries[k, t]`` (:mod:`~alchemi_potentials.neighbors.entries`): slot ``u``
    (from the system's first slot) and image ``m``, at ``wrapped[u] - wrapped[t] + m @ cell``.
    :meth:`BatchedNeighborList.pairs` reads the pairs as atom indices and lattice shifts.

    Attributes:
        entries: ``[columns, atoms]`` int32 packed neighbours.
        count: ``[atoms]`` int32, valid entries of each slot.
        order: ``[atoms]`` int32, the atom in each slot.
        wrapped: ``[atoms, 3]`` wrapped positions by slot, in the positions' dtype.
        image_cell: ``[systems, 3, 3]`` the periodic rows of each system's cell at its last build
            (open rows zero), in the positions' dtype: image ``m`` is at ``m @ image_cell``.
        half: True when each pair is listed once (by one of its atoms), False when from both ends.
        pair_list: The Warp struct the pair kernels take (``kernels.PairList``).
        warp_wrapped, warp_image_cell: ``wrapped`` and ``image_cell`` as Warp arrays.
    """

    entries: torch.Tensor
    count: torch.Tensor
    order: torch.Tensor
    wrapped: torch.Tensor
    image_cell: torch.Tensor
    half: bool
    pair_list: Any
    warp_wrapped: Any
    warp_image_cell: Any


# Buffers of the kernels' SystemState and AtomState structs: name -> (trailing shape, dtype,
# Warp element type name or None, initial value).
_SYSTEM_FIELDS: dict[str, tuple[tuple[int, ...], torch.dtype, str | None, float]] = {
    "moved": ((), torch.int32, None, 1),  # 1: everything builds the first time
    "near": ((), torch.int32, None, 0),
    "rebuild": ((), torch.int32, None, 0),
    "builds": ((), torch.int64, None, 0),
    "cell": ((3, 3), torch.float64, "mat33d", math.nan),
    "lattice": ((3, 3), torch.float64, "mat33d", 0),
    "pbc": ((3,), torch.int32, "vec3i", -1),
    "basis_inv": ((3, 3), torch.float64, "mat33d", 0),
    "dims": ((3,), torch.int32, "vec3i", 1),
    "reach": ((3,), torch.int32, "vec3i", 0),
    "inv_width": ((3,), torch.float64, "vec3d", 0),
    "bin_capacity": ((), torch.int32, None, 1),
    "bin_start": ((), torch.int32, None, 0),
    "first_atom": ((), torch.int32, None, 0),
    "num_atoms": ((), torch.int32, None, 0),
    "work": ((), torch.int32, None, 0),
    "work_end": ((), torch.int32, None, 0),
    "index_bits": ((), torch.int32, None, 1),
    "deform": ((3, 3), torch.float64, "mat33d", 0),
    "allowed_sq": ((), torch.float64, None, 0),
    "followed": ((), torch.int32, None, 0),
}
#: The int32 records of what :meth:`BatchedNeighborList.verify` raises (for "overflow" the most
#: neighbours an atom needed), rows of one table.
ERROR_FIELDS = ("bad_cell", "overflow", "image_out_of_range", "far_atoms")
_ATOM_FIELDS: dict[str, tuple[tuple[int, ...], torch.dtype, str | None, float]] = {
    "system": ((), torch.int32, None, 0),
    "order": ((), torch.int32, None, 0),
    "wrap": ((3,), torch.int32, "vec3i", 0),
    "slot_bin": ((), torch.int32, None, 0),
    "slot_number": ((), torch.int32, None, 0),
    "atomic_number": ((), torch.int32, None, 0),
}
#: int32 values per atom of a build's scratch (bin, place in the bin, wrap), which the search in
#: parts then reuses for its int16 counts (up to SCRATCH_PARTS parts).
BUILD_SCRATCH = 5
SCRATCH_PARTS = 2 * BUILD_SCRATCH


def _allocate(
    fields: dict[str, tuple[tuple[int, ...], torch.dtype, str | None, float]], rows: int, device: torch.device,
    struct: Any, known: dict[str, np.ndarray] | None = None,
) -> dict[str, torch.Tensor]:
    """The buffers of ``fields`` (``rows`` each), set as Warp views on ``struct``: one allocation
    per dtype and initial value, and one host copy for the int32 fields in ``known`` (their first
    rows)."""
    wp = _warp.warp()
    known = known or {}
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, (_shape, dtype, _wtype, init) in fields.items():
        groups.setdefault(("known",) if name in known else (dtype, init), []).append(name)
    out: dict[str, torch.Tensor] = {}
    for key, names in groups.items():
        sizes = [rows * math.prod(fields[name][0]) for name in names]
        if key == ("known",):
            host = np.concatenate([np.full(size, fields[name][3], dtype=np.int32) for name, size in zip(names, sizes)])
            at = 0
            for name, size in zip(names, sizes):
                host[at:at + len(known[name])] = known[name]
                at += size
            block = torch.from_numpy(host).to(device)
        else:
            block = torch.full((sum(sizes),), key[1], dtype=key[0], device=device)
        at = 0
        for name, size in zip(names, sizes):
            shape, _dtype, wtype, _init = fields[name]
            out[name] = block[at:at + size].view(rows, *shape)
            setattr(struct, name, _warp.view(out[name], getattr(wp, wtype) if wtype else None))
            at += size
    return out


class Layout:
    """Device buffers for one set of systems (one ``batch.version``), reused while it lasts.

    Raises:
        CapacityError: A system has more atoms than packed entries can address (2^25).
    """

    def __init__(self, batch: Batch, columns: int, half: bool, join_fraction: float, tuning: PotentialsTuning) -> None:
        from alchemi_potentials.neighbors import entries, kernels

        wp = _warp.warp()
        dev = batch.device
        dtype = batch.positions.dtype
        self.device, self.dtype, self.half, self.tuning = dev, dtype, half, tuning
        self.num_systems = n = batch.num_graphs
        self.num_atoms = v = batch.num_nodes
        s_cap, v_cap = max(1, batch.system_capacity), max(1, batch.node_capacity)
        counts = np.asarray(batch.num_nodes_per_system, dtype=np.int64)
        self.atoms_per_system = counts
        self.first_atom = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        bits = entries.index_bits(counts)
        if len(bits) and bits.max() > entries.MAX_INDEX_BITS:
            raise CapacityError(
                f"BatchedNeighborList: a system of {int(counts.max())} atoms is larger than the "
                f"{2 ** entries.MAX_INDEX_BITS} atoms its packed neighbour entries address; split it"
            )
        self.index_bits = bits
        # Bin storage: each system's share, fixed while its atoms stay the same.
        caps = np.maximum(1, -(-counts // ATOMS_PER_BIN))
        starts = np.concatenate(([0], np.cumsum(caps)[:-1]))
        self.num_bins = int(caps.sum()) if len(caps) else 0

        self.systems = kernels.SystemState()
        self.atoms = kernels.AtomState()
        # What each system's atoms and bins are, for its first rows; the rest keep their defaults.
        known = {"bin_capacity": caps, "bin_start": starts, "first_atom": self.first_atom, "num_atoms": counts,
                 "index_bits": bits} if n else {}
        self.system_tensors = _allocate(_SYSTEM_FIELDS, s_cap, dev, self.systems, known)
        self.batch_moved = torch.zeros(1, dtype=torch.int32, device=dev)
        self.systems.batch_moved = _warp.view(self.batch_moved)
        # The error records, rows of one table: a check reads them in one operation.
        self.errors = torch.zeros((len(ERROR_FIELDS), s_cap), dtype=torch.int32, device=dev)
        for row, name in enumerate(ERROR_FIELDS):
            self.system_tensors[name] = self.errors[row]
            setattr(self.systems, name, _warp.view(self.errors[row]))
        self.atom_tensors = _allocate(_ATOM_FIELDS, v_cap, dev, self.atoms)
        self.build_scratch = torch.zeros(BUILD_SCRATCH * v_cap, dtype=torch.int32, device=dev)
        scratch = self.build_scratch
        self.atoms.atom_bin, self.atoms.atom_place = _warp.view(scratch[:v_cap]), _warp.view(scratch[v_cap:2 * v_cap])
        self.atoms.atom_wrap = _warp.view(scratch[2 * v_cap:].view(v_cap, 3), wp.vec3i)
        bins = max(1, self.num_bins)
        self.bin_count = torch.zeros(bins, dtype=torch.int32, device=dev)
        self.bin_end = torch.zeros(bins, dtype=torch.int32, device=dev)
        self.atoms.bin_count, self.atoms.bin_end = _warp.view(self.bin_count), _warp.view(self.bin_end)
        vec, mat = (wp.vec3d, wp.mat33d) if dtype == torch.float64 else (wp.vec3f, wp.mat33f)
        self.reference = torch.zeros((v_cap, 3), dtype=dtype, device=dev)
        self.wrapped = torch.zeros((v_cap, 3), dtype=dtype, device=dev)
        self.image_cell = torch.zeros((s_cap, 3, 3), dtype=dtype, device=dev)
        self.warp_reference, self.warp_wrapped = _warp.view(self.reference, vec), _warp.view(self.wrapped, vec)
        self.warp_image_cell = _warp.view(self.image_cell, mat)
        a = self.atom_tensors
        if n:
            a["system"][:v] = batch.batch_idx.to(torch.int32)
            a["order"][:v] = torch.arange(v, dtype=torch.int32, device=dev)
            a["atomic_number"][:v] = batch.atomic_numbers.to(torch.int32)
        self.join_fraction = join_fraction
        self.search_parts = search_parts(tuning, counts, join_fraction)
        parts, width = self.search_parts, max(1, v) if self.search_parts > 1 else 1
        if parts * width <= SCRATCH_PARTS * v_cap:  # in the build's scratch (see BUILD_SCRATCH)
            self.found_in_part = scratch.view(torch.int16)[: parts * width].view(parts, width)
        else:
            self.found_in_part = torch.zeros((parts, width), dtype=torch.int16, device=dev)
        self.listed = tuning.search_listed
        self.work_slot = torch.zeros(v_cap if self.listed else 1, dtype=torch.int32, device=dev)
        self.inputs: dict[str, torch.Tensor] = {}  # cell/pbc stand-ins, see BatchedNeighborList._inputs
        self.allocate_columns(columns)

    def allocate_columns(self, columns: int) -> None:
        """(Re)allocate the neighbour matrix with ``columns`` rows and force a full rebuild."""
        from alchemi_potentials.neighbors import kernels

        columns = -(-columns // COLUMNS_MULTIPLE_OF) * COLUMNS_MULTIPLE_OF
        v_cap = self.atom_tensors["system"].shape[0]
        # Indexed [k, t]; "rows" memory through a transposed view. Zeros are valid entries: the
        # pair kernels may load a few past a slot's count.
        by_columns = self.tuning.matrix_order == "columns"
        m = torch.zeros((columns, v_cap) if by_columns else (v_cap, columns), dtype=torch.int32, device=self.device)
        m = m if by_columns else m.t()
        count = torch.zeros(v_cap, dtype=torch.int32, device=self.device)
        self.matrix_tensors = (m, count)
        s = self.system_tensors
        s["moved"].fill_(1)
        s["overflow"].zero_()
        s["builds"].zero_()
        self.columns = columns
        a = self.atoms
        pair_list = kernels.PairList()
        pair_list.entries, pair_list.count = _warp.view(m), _warp.view(count)
        pair_list.order, pair_list.system, pair_list.slot_number = a.order, a.system, a.slot_number
        pair_list.first_atom, pair_list.index_bits = self.systems.first_atom, self.systems.index_bits
        v = self.num_atoms
        self.matrix = NeighborMatrix(
            entries=m[:, :v], count=count[:v], order=self.atom_tensors["order"][:v], wrapped=self.wrapped[:v],
            image_cell=self.image_cell[: self.num_systems], half=self.half, pair_list=pair_list,
            warp_wrapped=self.warp_wrapped, warp_image_cell=self.warp_image_cell,
        )
        self.launches: dict[tuple[int, ...], tuple[_warp.LaunchSequence, _warp.LaunchSequence]] = {}

    def nbytes(self) -> int:
        # (The error records are in system_tensors as rows of self.errors: counted once.)
        held = [*self.system_tensors.values(), *self.atom_tensors.values(), *self.inputs.values(),
                *self.matrix_tensors, self.bin_count, self.bin_end, self.reference, self.wrapped, self.image_cell,
                self.build_scratch, self.work_slot, self.batch_moved]
        if self.found_in_part.untyped_storage().data_ptr() != self.build_scratch.untyped_storage().data_ptr():
            held.append(self.found_in_part)
        return sum(t.numel() * t.element_size() for t in held)
