"""``PairPotential``: what Lennard-Jones and Morse share: parameter tables, the cutoff treatment,
the batched neighbour list, and one Warp kernel that sums pairs into energies, forces and stress.

A forward makes no host synchronisation and, once buffers exist, allocates nothing; it writes
into ``batch.forces``, ``batch.energy`` (``batch.stress``) when they have the positions' dtype and
returns them, else fresh tensors. Cutoff treatments (at most one): none (energy jumps at the
cutoff); ``shift="energy"`` (pair energies shifted to zero there, as ASE's ``LennardJones``);
``shift="force"`` (``U(r) - U(r_c) - (r - r_c) U'(r_c)``: energies and forces go to zero there);
``switch_onset=r_on`` (a quintic smoothstep from 1 at ``r_on`` to 0 at the cutoff, as ASE's
``MorsePotential``). ``tail_correction=True`` adds the analytic energy and pressure of the pairs
beyond the cutoff (models with a :meth:`PairPotential._tail_integrals`; periodic systems only).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import numpy as np
import torch

from alchemi_core import warp_runtime as _warp
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_core.models.base import BaseModel, ModelCard
from alchemi_core.tuning import check_tuning
from alchemi_potentials import pair_lanes
from alchemi_potentials.neighbors import BatchedNeighborList, NeighborMatrix, check_cells
from alchemi_potentials.pair_forces import PairOptions, pair_kernel
from alchemi_potentials.parameters import PairTable
from alchemi_potentials.tuning import PotentialsTuning

if TYPE_CHECKING:
    from alchemi_core.data import Batch

_PERIODIC_HINT = ("the tail of a homogeneous fluid or solid fills space: give every system a cell with "
                  "pbc=True, or leave tail_correction off")
#: The ``shift`` options of the pair potentials.
SHIFTS = ("none", "energy", "force")
#: Systems larger than this (atoms) sum energies and virials per slot, then chunk by chunk
#: (``fold_totals``), instead of one atomic add per atom into the system's total.
DIRECT_TOTALS_UP_TO = 1024
#: Slots per chunk of that fold.
FOLD_CHUNK = 64


@attrs.define(eq=False)
class _Outputs:
    """Targets and recorded launches of one forward configuration (replayed while it lasts);
    ``owned`` targets are the model's scratch buffers, returned as copies."""

    key: tuple[Any, ...]
    forces: torch.Tensor
    energy: torch.Tensor
    stress: torch.Tensor | None
    owned: set[str]
    launches: _warp.LaunchSequence
    matrix: NeighborMatrix  # held so that its identity stays a valid part of the key
    held: list[torch.Tensor]  # buffers (beyond the scratch ones) the recorded launches point into

    def result(self) -> dict[str, torch.Tensor]:
        out = {"energy": self.energy, "forces": self.forces}
        if self.stress is not None:
            out["stress"] = self.stress
        return {k: v.clone() if k in self.owned else v for k, v in out.items()}


class PairPotential(BaseModel):
    """Base class of the pair potentials (see the module docstring).

    Subclasses set ``kind`` and ``name`` and give, in float64 numpy, the kernel's ``a, b, c`` per
    pair of types (:meth:`_coefficients`), the pair energy and its derivative
    (:meth:`_pair_energy`, :meth:`_pair_slope`, for shifts) and, for tail corrections,
    :meth:`_tail_integrals`.

    Args:
        table: Parameters per pair of species.
        cutoff: Interaction range in Å.
        shift_energy: Shift each pair energy to zero at the cutoff (``shift="energy"``).
        switch_onset: Start (Å) of the smooth switch to zero at the cutoff; None for no switch.
        shift: ``"none"``, ``"energy"`` or ``"force"`` (None: from ``shift_energy``).
        tail_correction: Add the analytic tail energy and pressure (periodic systems only).
        skin: Verlet skin in Å of the model's own neighbour list (default: the tuning's).
        max_neighbors: Columns of the model's own neighbour list (None: sized from the
            structures; a number: no read-back ever, for CUDA graphs).
        neighbor_list: A :class:`BatchedNeighborList` to use (e.g. shared with another model);
            its cutoff must be at least ``cutoff``. Give skin and max_neighbors to it, not here.
        tuning: Per-device choices of the pair kernel and the model's own neighbour list
            (default: ``PotentialsTuning.for_device`` of the batch's device).

    Raises:
        ConfigurationError: A bad cutoff, shift or switch onset, two cutoff treatments at once, a
            tail correction the model has no formula for, or a neighbour list built for a shorter
            cutoff.
    """

    kind: ClassVar[int]
    name: ClassVar[str]
    species_hint: ClassVar[str] = "add them to the model's per-element tables"

    def __init__(
        self,
        table: PairTable,
        *,
        cutoff: float,
        shift_energy: bool = False,
        switch_onset: float | None = None,
        shift: str | None = None,
        tail_correction: bool = False,
        skin: float | None = None,
        max_neighbors: int | None = None,
        neighbor_list: BatchedNeighborList | None = None,
        tuning: PotentialsTuning | None = None,
    ) -> None:
        super().__init__()
        check_tuning(self.name, tuning, PotentialsTuning)
        try:
            cutoff = float(cutoff)
        except (TypeError, ValueError):
            raise ConfigurationError(f"{self.name}: cutoff must be a number in Å, got {cutoff!r}") from None
        if not (cutoff > 0 and math.isfinite(cutoff)):
            raise ConfigurationError(f"{self.name}: cutoff must be positive and finite (Å), got {cutoff!r}")
        if shift is None:
            shift = "energy" if shift_energy else "none"
        elif shift not in SHIFTS:
            raise ConfigurationError(f"{self.name}: shift must be one of {', '.join(map(repr, SHIFTS))}, got {shift!r}")
        elif shift_energy and shift != "energy":
            raise ConfigurationError(f"{self.name}: shift_energy=True contradicts shift={shift!r}; give only shift")
        if switch_onset is not None:
            if shift != "none":
                raise ConfigurationError(
                    f"{self.name}: choose one cutoff treatment: shift={shift!r} or switch_onset=..., not both"
                )
            switch_onset = float(switch_onset)
            if not 0 <= switch_onset < cutoff:
                raise ConfigurationError(
                    f"{self.name}: switch_onset must lie in [0, cutoff) = [0, {cutoff}), got {switch_onset}"
                )
        if neighbor_list is None:
            neighbor_list = BatchedNeighborList(cutoff, skin, max_neighbors, tuning=tuning)
        elif skin is not None or max_neighbors is not None:
            raise ConfigurationError(
                f"{self.name}: skin and max_neighbors belong to the neighbour list you passed; "
                "set them there (BatchedNeighborList(cutoff, skin, max_neighbors))"
            )
        self._cutoff = cutoff
        self.tuning = tuning
        self.shift = shift
        self.shift_energy = shift == "energy"
        self.switch_onset = switch_onset
        self.table = table
        # Per pair of types (padded by zeros for the unknown type), the tail's energy and pressure
        # integrals, flattened for the kernel (asked here so that a model without them fails now).
        self._tail = self._tail_integrals() if tail_correction else None
        if self._tail is not None:
            padded = [np.zeros((table.num_types + 1,) * 2) for _ in self._tail]
            for pad, values in zip(padded, self._tail, strict=True):
                pad[:-1, :-1] = values
            self._tail_energy, self._tail_pressure = (pad.reshape(-1) for pad in padded)
        self.neighbor_list = neighbor_list
        self._check_list_cutoff()
        self.card = ModelCard(name=self.name, cutoff=cutoff, periodic=True, stress=True, species=table.species)
        self._rows = self._parameter_rows()
        self._types = table.type_lookup()
        self._reset_device_state()

    def _reset_device_state(self) -> None:
        """Forget device tables, buffers and recorded launches (rebuilt on the next forward)."""
        self._device_arrays: dict[tuple[Any, ...], tuple[torch.Tensor, Any]] = {}
        self._outputs: _Outputs | None = None
        self._scratch_buffers: dict[str, torch.Tensor] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Recorded Warp launches hold raw pointers: a copy (or a pickle) starts without them.
        state = super().__getstate__()
        state.update(_device_arrays={}, _outputs=None, _scratch_buffers={})
        return state

    # ------------------------------------------------------------------ parameters
    @property
    def cutoff(self) -> float:
        """Interaction range in Å."""
        return self._cutoff

    def _coefficients(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _pair_energy(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, r: float) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def _pair_slope(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, r: float) -> np.ndarray:
        """``U'(r)`` per pair of types (for ``shift="force"``)."""
        raise ConfigurationError(f"{self.name}: shift='force' is not available for this model; use 'energy' or 'none'")

    def _tail_integrals(self) -> tuple[np.ndarray, np.ndarray]:
        """Per pair of types ``(2 pi int_rc^inf r^2 U dr, -(2 pi / 3) int_rc^inf r^3 U' dr)``: the
        tail energy of a system is ``sum_ij N_i N_j e_ij / V``, its pressure ``sum_ij N_i N_j p_ij / V^2``."""
        raise ConfigurationError(f"{self.name}: this model has no analytic tail correction; leave tail_correction off")

    def _parameter_rows(self) -> np.ndarray:
        """``[(T + 1)^2, 5]`` float64 rows ``(a, b, c, shift, slope)``; type T (elements without
        parameters) has NaN rows, so such atoms give NaN rather than plausible numbers."""
        a, b, c = self._coefficients()
        shift, slope = np.zeros_like(a), np.zeros_like(a)
        if self.shift != "none":
            shift = self._pair_energy(a, b, c, self._cutoff)
        if self.shift == "force":
            slope = self._pair_slope(a, b, c, self._cutoff)
            shift = shift - self._cutoff * slope  # the constant part of -(r - r_c) U'(r_c)
        n = a.shape[0]
        rows = np.full((n + 1, n + 1, 5), np.nan)
        rows[:n, :n] = np.stack([a, b, c, shift, slope], axis=-1)
        return rows.reshape(-1, 5)

    def _device_array(self, name: str, dtype: torch.dtype, device: torch.device) -> Any:
        """``_rows`` (parameters), ``_types`` (the type of every atomic number) or a tail table on
        ``device``."""
        key = (name, dtype, device)
        entry = self._device_arrays.get(key)
        if entry is None:
            t = torch.as_tensor(getattr(self, name), dtype=dtype, device=device).contiguous()
            entry = self._device_arrays[key] = (t, _warp.view(t))
        return entry[1]

    # ------------------------------------------------------------------ the forward
    def forward(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        """Energies ``[B, 1]``, forces ``[V, 3]`` and, when asked, stress ``[B, 3, 3]`` (eV/Å³,
        positive under tension; NaN for systems whose cell has no volume).

        Raises:
            ConfigurationError: The neighbour list was built for a shorter cutoff.
            InvalidDataError: Positions that are not float32 or float64, or systems without a
                cell under ``tail_correction``.
        """
        self._check_list_cutoff()
        matrix = self.neighbor_list.update(batch)
        out = self._outputs_for(batch, matrix, compute_stress)
        out.launches.run(_warp.stream_for(batch.positions.device))
        return out.result()

    def _outputs_for(self, batch: Batch, matrix: NeighborMatrix, compute_stress: bool) -> _Outputs:
        pos = batch.positions
        cell = self.neighbor_list.last_cell
        targets = {
            "forces": _usable(batch, "forces", pos, tuple(pos.shape)),
            "energy": _usable(batch, "energy", pos, (batch.num_graphs, 1)),
            "stress": _usable(batch, "stress", pos, (batch.num_graphs, 3, 3)) if compute_stress else None,
        }
        key = (pos.data_ptr(), pos.dtype, -1 if cell is None else cell.data_ptr(), compute_stress,
               *(None if t is None else t.data_ptr() for t in targets.values()))
        out = self._outputs
        if out is not None and out.key == key and out.matrix is matrix:
            return out
        self._outputs = self._configure(batch, matrix, compute_stress, key, targets, cell)
        return self._outputs

    def _scratch(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A model-owned buffer, kept while its shape, dtype and device stay the same."""
        t = self._scratch_buffers.get(name)
        if t is None or tuple(t.shape) != shape or t.dtype != like.dtype or t.device != like.device:
            t = self._scratch_buffers[name] = torch.zeros(shape, dtype=like.dtype, device=like.device)
        return t

    def _configure(self, batch: Batch, matrix: NeighborMatrix, compute_stress: bool, key: tuple[Any, ...],
                   targets: dict[str, torch.Tensor | None], cell: torch.Tensor | None) -> _Outputs:
        from alchemi_potentials import pair_kernels as k

        pos = batch.positions
        wp = _warp.warp()
        n_sys, n_atoms = batch.num_graphs, batch.num_nodes
        shapes = {"forces": tuple(pos.shape), "energy": (n_sys, 1), "stress": (n_sys, 3, 3)}
        owned = {name for name, t in targets.items() if t is None and (name != "stress" or compute_stress)}
        for name in owned:
            targets[name] = self._scratch(name, shapes[name], pos)
        forces, energy, stress = targets["forces"], targets["energy"], targets["stress"]
        assert forces is not None and energy is not None
        virial = self._scratch("virial", (n_sys, 3, 3), pos)
        if cell is None:
            cell = self._scratch("cell", (n_sys, 3, 3), pos)
        f64 = pos.dtype == torch.float64
        scalar, vec, mat = (wp.float64, wp.vec3d, wp.mat33d) if f64 else (wp.float32, wp.vec3f, wp.mat33f)
        C, E, W = _warp.view(cell, mat), _warp.view(energy.view(-1), scalar), _warp.view(virial, mat)
        F = _warp.view(forces, vec)
        chunks = _fold_chunks(batch.num_nodes_per_system, pos.device)
        per_slot = chunks is not None
        slots = n_atoms if per_slot else 1
        slot_energy = self._scratch("slot_energy", (slots,), pos)
        slot_virial = self._scratch("slot_virial", (slots if per_slot and compute_stress else 1, 3, 3), pos)
        SE, SW = _warp.view(slot_energy, scalar), _warp.view(slot_virial, mat)
        seq = _warp.LaunchSequence(F.device, who="alchemi-potentials")
        seq.add(k.zero_totals, n_sys, [E, W])
        if matrix.half:
            seq.add(k.zero_forces, n_atoms, [F])  # atoms also receive forces from their partners
        n_types = self.table.num_types
        onset = self.switch_onset if self.switch_onset is not None else 0.0
        tuning = self.tuning if self.tuning is not None else PotentialsTuning.for_device(pos.device)
        options = PairOptions(
            kind=self.kind, force_shift=self.shift == "force", switching=self.switch_onset is not None,
            virial=compute_stress, half=matrix.half,
            one_type=n_types == 1, per_slot=per_slot, unroll=tuning.unroll, masked=tuning.masked,
            fast_math=tuning.fast_math, min_blocks=tuning.min_blocks_large if per_slot else 0,
            lane_width=tuning.lane_width, wide_lane_width=tuning.wide_lane_width,
        )
        if tuning.lanes and pair_lanes.covers(options):
            options = attrs.evolve(options, lanes=True)
        seq.add(pair_kernel(options), n_atoms, [
            matrix.warp_wrapped, matrix.warp_image_cell, matrix.pair_list, self._device_array("_types", torch.int32, pos.device),
            n_types, n_types + 1,
            self._device_array("_rows", pos.dtype, pos.device), scalar(self._cutoff**2), scalar(onset), scalar(self._cutoff),
            F, E, W, SE, SW,
        ])
        held = []
        if chunks is not None:
            seq.add(k.fold_totals, chunks.shape[0], [_warp.view(chunks), SE, SW, int(compute_stress), E, W])
            held.append(chunks)
        if stress is not None:
            seq.add(k.virial_to_stress, n_sys, [C, W, _warp.view(stress, mat)])
        if self._tail is not None:
            if self.neighbor_list.last_cell is None:
                raise InvalidDataError(f"{self.name}: tail_correction needs periodic systems; {_PERIODIC_HINT}")
            counts = self._scratch("type_counts", (n_sys * (n_types + 1),), pos)
            lists = matrix.pair_list
            seq.add(k.count_types, n_atoms, [lists.system, lists.slot_number,
                                             self._device_array("_types", torch.int32, pos.device), n_types,
                                             _warp.view(counts, scalar)])
            seq.add(k.add_tail, n_sys, [C, _warp.view(counts, scalar), n_types + 1,
                                        self._device_array("_tail_energy", pos.dtype, pos.device),
                                        self._device_array("_tail_pressure", pos.dtype, pos.device),
                                        int(stress is not None), E, W if stress is None else _warp.view(stress, mat)])
        return _Outputs(key, forces, energy, stress, owned, seq, matrix, held)

    # ------------------------------------------------------------------ checks
    def _check_list_cutoff(self) -> None:
        if self.neighbor_list.cutoff < self._cutoff:
            raise ConfigurationError(
                f"{self.name}: cutoff {self._cutoff} Å is larger than the {self.neighbor_list.cutoff} Å its "
                "neighbour list was built for, so pairs in between would be missed; build the list with "
                f"BatchedNeighborList(cutoff={self._cutoff}, ...)"
            )

    def check_batch(self, batch: Batch) -> None:
        """Reject what this model cannot evaluate correctly (reads back; not per step). Atoms with
        more neighbours than a fixed ``max_neighbors`` are raised by :meth:`verify`.

        Raises:
            InvalidDataError: Elements without parameters, positions that are not float32 or
                float64, a periodic cell with zero volume, or (with the tail correction) a system
                that is not periodic along all three axes.
            ConfigurationError: A neighbour list built for a shorter cutoff.
        """
        self._check_list_cutoff()
        if batch.positions.dtype not in (torch.float32, torch.float64):
            raise InvalidDataError(
                f"{self.name}: positions must be float32 or float64, got {batch.positions.dtype}"
            )
        super().check_batch(batch)  # species, cells
        if self._tail is not None and ("pbc" not in batch or not bool(batch.pbc.all())):
            raise InvalidDataError(f"{self.name}: tail_correction needs systems periodic along all three axes; "
                                   + _PERIODIC_HINT)

    def check_cells(self, batch: Batch) -> None:
        """The base class's check, and periodic axes too thin for the neighbour list's images."""
        check_cells(batch, self.name, radius=self.neighbor_list.radius_on(batch.device.type))

    def memory_bytes(self) -> int:
        """Device bytes this model holds: neighbour list, scratch outputs, tables and atom types."""
        held = [*self._scratch_buffers.values(), *(t for t, _ in self._device_arrays.values())]
        if self._outputs is not None:
            held += self._outputs.held
        return self.neighbor_list.memory_bytes() + sum(t.numel() * t.element_size() for t in held)

    def verify(self, batch: Batch) -> None:
        """Raise what the neighbour list recorded on the device (see
        :meth:`BatchedNeighborList.verify`); called by the engine at check steps."""
        self.neighbor_list.verify(batch)

    def error_flag(self, batch: Batch) -> torch.Tensor | None:
        """True on the device when :meth:`verify` may raise (read with a check's other flags)."""
        return self.neighbor_list.error_flag(batch)

    def extra_repr(self) -> str:
        treatment = "truncated"
        if self.shift != "none":
            treatment = f"{self.shift}-shifted"
        elif self.switch_onset is not None:
            treatment = f"switched from {self.switch_onset}"
        if self._tail is not None:
            treatment += ", tail-corrected"
        return f"cutoff={self._cutoff}, {treatment}, species={self.table.species}, {self.neighbor_list!r}"


def _fold_chunks(atoms_per_system: np.ndarray, device: torch.device) -> torch.Tensor | None:
    """``[chunks, 3]`` int32 (first slot, end slot, system) of the per-slot fold, or None when
    every system is small enough for direct atomic adds."""
    counts = np.asarray(atoms_per_system, dtype=np.int64)
    if len(counts) == 0 or counts.max() <= DIRECT_TOTALS_UP_TO:
        return None
    per_system = -(-counts // FOLD_CHUNK)
    system = np.repeat(np.arange(len(counts)), per_system)
    index = np.arange(len(system)) - np.repeat(np.cumsum(per_system) - per_system, per_system)
    first = np.repeat(np.cumsum(counts) - counts, per_system) + index * FOLD_CHUNK
    end = np.minimum(first + FOLD_CHUNK, np.repeat(np.cumsum(counts), per_system))
    return torch.as_tensor(np.stack([first, end, system], axis=1), dtype=torch.int32, device=device)


def _field(batch: Batch, name: str) -> torch.Tensor | None:
    return getattr(batch, name) if name in batch else None


def _usable(batch: Batch, name: str, positions: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    """The batch's own ``name`` field when the kernel can write into it directly."""
    t = _field(batch, name)
    if t is None or t.dtype != positions.dtype or tuple(t.shape) != shape or not t.is_contiguous():
        return None
    return t
