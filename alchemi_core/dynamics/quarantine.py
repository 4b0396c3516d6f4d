"""Quarantine: a structure that goes bad leaves the run with a failure status and a reason,
instead of ending the run or poisoning its results.

At each check step the engine computes, on the device, one failure code per system: a bit for
each of non-finite positions, velocities, forces and energy, and one for atoms that flew apart
(bounding box past ``max_extent`` Å). A system with a nonzero code gets ``status = -code``; no
stage steps it any more, it is written out like a graduated system and recorded in the stage's
``quarantined``; the run ends with one :class:`QuarantineWarning`. ``strict=True`` raises
instead. A run without checks looks every ``HEALTH_INTERVAL`` steps and reads what it found at
the next look (:class:`PendingCodes`). Stage status codes are therefore ``>= 0``.

Example:
    >>> from alchemi_core.dynamics.quarantine import failure_reasons, FAILED_FORCES, FAILED_POSITIONS
    >>> failure_reasons(-(FAILED_FORCES | FAILED_POSITIONS))
    ['positions are not finite', 'forces are not finite']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import torch

from alchemi_core.dynamics.readback import FlagReadBack
from alchemi_core.errors import InvalidDataError

if TYPE_CHECKING:
    from alchemi_core.data import Batch

FAILED_POSITIONS = 1
FAILED_VELOCITIES = 2
FAILED_FORCES = 4
FAILED_ENERGY = 8
FAILED_EXTENT = 16
_REASONS = (
    (FAILED_POSITIONS, "positions are not finite"),
    (FAILED_VELOCITIES, "velocities are not finite"),
    (FAILED_FORCES, "forces are not finite"),
    (FAILED_ENERGY, "energy is not finite"),
    (FAILED_EXTENT, "atoms flew apart"),
)
#: The per-atom vectors tested for non-finite entries, with their bits.
_PER_ATOM = ((FAILED_POSITIONS, "positions"), (FAILED_VELOCITIES, "velocities"), (FAILED_FORCES, "forces"))
#: How far apart (Å, the largest side of a system's bounding box) atoms may drift by default.
DEFAULT_MAX_EXTENT = 1.0e4
#: Steps between health checks of a run that has no other checks (plain MD without sinks).
HEALTH_INTERVAL = 100


def failure_reasons(status: int) -> list[str]:
    """The reasons a quarantined system's (negative) status stands for; [] for other statuses."""
    code = -int(status)
    return [text for bit, text in _REASONS if code > 0 and code & bit]


@attrs.frozen
class Quarantined:
    """One structure taken out of a run.

    Attributes:
        system_id: Its ``system_id``.
        step: The check step at which it was found.
        status: Its failure status (negative: ``-code``).
    """

    system_id: int
    step: int
    status: int

    @property
    def reason(self) -> str:
        return "; ".join(failure_reasons(self.status))

    def __str__(self) -> str:
        return f"system_id {self.system_id} at step {self.step}: {self.reason}"


class QuarantineWarning(UserWarning):
    """A run quarantined structures: one warning per run, with their count and reasons."""


def describe_quarantined(records: list[Quarantined], ids_shown: int = 10) -> str:
    """``records`` in one line: how many, each reason with its count, and their ``system_id`` values.

    Example:
        >>> from alchemi_core.dynamics.quarantine import FAILED_FORCES, Quarantined, describe_quarantined
        >>> describe_quarantined([Quarantined(4, 20, -FAILED_FORCES), Quarantined(9, 40, -FAILED_FORCES)])
        '2 structures quarantined (2: forces are not finite): system_id 4, 9'
    """
    counts: dict[str, int] = {}
    for q in records:
        reason = ", ".join(failure_reasons(q.status))
        counts[reason] = counts.get(reason, 0) + 1
    reasons = "; ".join(f"{n}: {reason}" for reason, n in counts.items())
    ids = ", ".join(str(q.system_id) for q in records[:ids_shown])
    more = f", ... ({len(records) - ids_shown} more)" if len(records) > ids_shown else ""
    noun = "structure" if len(records) == 1 else "structures"
    return f"{len(records)} {noun} quarantined ({reasons}): system_id {ids}{more}"


def warn_quarantined(records: list[Quarantined], stacklevel: int = 2) -> None:
    """One :class:`QuarantineWarning` for a run's quarantined ``records`` (none when empty)."""
    if not records:
        return
    import warnings

    warnings.warn(
        f"{describe_quarantined(records)}; each is written out with its failure status (negative) and "
        "listed with its reason in the stage's quarantined; strict=True raises instead",
        QuarantineWarning,
        stacklevel=stacklevel + 1,
    )


class HealthCheck:
    """Failure codes of a batch, computed on the device (see the module docstring).

    Args:
        max_extent: Largest bounding-box side (Å) before atoms count as flown apart.
        strict: Raise at the first failure instead of quarantining.
    """

    def __init__(self, max_extent: float = DEFAULT_MAX_EXTENT, strict: bool = False) -> None:
        from alchemi_core.validation import finite_number

        self.max_extent = finite_number("max_extent", max_extent, above=0.0, unit=" Å")
        self.strict = bool(strict)
        self._warp = WarpHealthCodes()
        #: The pinned buffer a look's codes travel in (one look is pending at a time).
        self._copies = FlagReadBack()

    @classmethod
    def of(cls, owner: Any) -> HealthCheck:
        """The check a stage asked for (its ``strict`` and ``max_extent`` attributes)."""
        return cls(getattr(owner, "max_extent", DEFAULT_MAX_EXTENT), getattr(owner, "strict", False))

    def codes(self, batch: Batch, backend: str = "auto") -> torch.Tensor:
        """``[B]`` int64 failure code of every system (0: healthy), without reading back.

        Args:
            backend: ``"warp"`` (:mod:`~alchemi_core.dynamics.check_kernels`), ``"torch"``, or
                ``"auto"``: Warp when warp-lang is installed, torch otherwise (the same codes).
        """
        out = self._device_codes(batch, backend)
        # The Warp path answers in a buffer that the next check overwrites: callers get a copy.
        held = self._warp._out
        return held.clone() if held is not None and out is held else out

    def _device_codes(self, batch: Batch, backend: str = "auto") -> torch.Tensor:
        """:meth:`codes`, the Warp path's in this check's own buffer (valid until the next call)."""
        if backend in ("warp", "auto"):
            out = self._warp(batch, self.max_extent)
            if out is not None:
                return out
        return self._torch_codes(batch)

    def _torch_codes(self, batch: Batch) -> torch.Tensor:
        n, idx = batch.num_graphs, batch.batch_idx
        out = torch.zeros(n, dtype=torch.int64, device=batch.device)
        named = [(bit, name) for bit, name in _PER_ATOM if name in batch]
        positions_ok = torch.ones(n, dtype=torch.bool, device=batch.device)
        if named and batch.num_nodes:
            rows = torch.cat([getattr(batch, name) for _, name in named], dim=1)
            bad = ~torch.isfinite(rows).view(rows.shape[0], len(named), 3).all(dim=-1)
            per_system = torch.zeros(n, len(named), dtype=torch.uint8, device=batch.device)
            per_system.scatter_reduce_(0, idx.unsqueeze(-1).expand_as(bad), bad.to(torch.uint8), reduce="amax")
            for j, (bit, _) in enumerate(named):
                out.add_(per_system[:, j].to(torch.int64), alpha=bit)
            positions_ok = per_system[:, 0] == 0  # positions come first in _PER_ATOM
        if "energy" in batch:
            energy = batch.energy.reshape(n, -1)
            out.add_((~torch.isfinite(energy).all(dim=1)).to(torch.int64), alpha=FAILED_ENERGY)
        pos = batch.positions
        if pos.shape[0]:
            # amax over [x, -x] gives the box's upper corner and minus its lower one at once.
            both = torch.cat([pos, -pos], dim=1)
            corners = torch.full((n, 6), -torch.inf, dtype=pos.dtype, device=pos.device)
            corners.scatter_reduce_(0, idx.unsqueeze(-1).expand_as(both), both, reduce="amax")
            extent = (corners[:, :3] + corners[:, 3:]).amax(dim=1)
            # Systems whose positions are not all finite have the positions bit instead.
            out.add_(((extent > self.max_extent) & positions_ok).to(torch.int64), alpha=FAILED_EXTENT)
        return out

    def find(self, batch: Batch, active: torch.Tensor, step: int) -> list[Quarantined]:
        """Systems of ``active`` (``[B]`` bool) that went bad; their status becomes ``-code``.

        One read-back of one byte per system.

        Raises:
            InvalidDataError: Some went bad and ``strict`` is set (nothing is changed).
        """
        codes = torch.where(active, self._device_codes(batch), 0)
        host = codes.to(torch.uint8).cpu()
        if not bool(host.any()):
            return []
        found = self._records(batch, host, step)
        if self.strict:
            raise self._strict_error(found)
        rows = torch.nonzero(host).flatten().to(batch.device)
        batch.status.index_copy_(0, rows, -codes.index_select(0, rows))
        return found

    def mark(self, batch: Batch, active: torch.Tensor) -> torch.Tensor:
        """Give the systems of ``active`` that went bad their status ``-code`` on the device,
        without reading back; the ``[B]`` codes (0 for the others) go to :meth:`collect` once a
        read-back the caller makes anyway says some are nonzero. Not for ``strict`` checks
        (they raise before anything changes: :meth:`find`)."""
        codes = torch.where(active, self._device_codes(batch), 0)
        batch.status.copy_(torch.where(codes != 0, -codes, batch.status))
        return codes

    def start(self, batch: Batch, active: torch.Tensor, step: int) -> PendingCodes:
        """The codes of the systems of ``active``, on their way to the host without blocking; the
        statuses stay as they are until :meth:`settle` reads them (for runs without checks, whose
        step queue should not drain for a health check: :class:`PendingCodes`). One look is
        pending at a time: the next one reuses its host buffer."""
        codes = torch.where(active, self._device_codes(batch), 0)
        rows = torch.stack([codes, batch.system_id.to(torch.int64)])
        if rows.device.type != "cuda":
            return PendingCodes(rows.cpu(), int(step))
        host, event = self._copies.start(rows)
        return PendingCodes(host, int(step), event)

    def settle(self, batch: Batch, pending: PendingCodes) -> list[Quarantined]:
        """The systems :meth:`start` found bad, now given their status ``-code``; [] when none.

        Waits for the copy (long done when the next health check comes). Systems are found by
        ``system_id``, so a batch whose systems moved in between is marked right; one that left
        the batch since, or was quarantined since, is not recorded again.
        """
        host = pending.wait()
        bad = host[0] != 0
        if not bool(bad.any()):
            return []
        codes_of = dict(zip(host[1][bad].tolist(), host[0][bad].tolist(), strict=True))
        # Where they are now, and their statuses (read only when some went bad): systems
        # quarantined since (or before: already negative) keep their status and record.
        ids, current = batch.system_id.tolist(), batch.status.tolist()
        rows = [r for r, i in enumerate(ids) if i in codes_of and current[r] >= 0]
        if not rows:
            return []
        index = torch.tensor(rows, dtype=torch.long, device=batch.device)
        codes = torch.tensor([codes_of[ids[r]] for r in rows], dtype=batch.status.dtype, device=batch.device)
        batch.status.index_copy_(0, index, -codes)
        return [Quarantined(int(ids[r]), pending.step, -int(codes_of[ids[r]])) for r in rows]

    def collect(self, batch: Batch, codes: torch.Tensor, step: int) -> list[Quarantined]:
        """The records of the systems :meth:`mark` quarantined (reads the codes back)."""
        return self._records(batch, codes.to(torch.uint8).cpu(), step)

    @staticmethod
    def _records(batch: Batch, host: torch.Tensor, step: int) -> list[Quarantined]:
        rows = torch.nonzero(host).flatten()
        ids = batch.system_id.index_select(0, rows.to(batch.device)).tolist()
        return [Quarantined(int(i), int(step), -int(host[r])) for i, r in zip(ids, rows.tolist(), strict=True)]

    @staticmethod
    def _strict_error(found: list[Quarantined]) -> InvalidDataError:
        listed = "; ".join(str(q) for q in found[:10])
        return InvalidDataError(
            f"{len(found)} structures went bad ({listed}){'...' if len(found) > 10 else ''}; strict=True "
            "stops the run. Leave strict off to quarantine them and go on"
        )


@attrs.define
class PendingCodes:
    """A health check's ``[2, B]`` codes and system ids, copied to the host without blocking.

    Reading the codes back at once would drain the GPU's queue of steps; the copy goes to pinned
    memory instead and is read at the next look (or when the run ends, a checkpoint is written,
    or ``quarantined`` is asked for). On a CPU the copy is made at once.

    Attributes:
        host: ``[2, B]`` int64 host tensor: failure codes (0: healthy), then system ids.
        step: The step the codes describe.
        event: Recorded after the copy on a GPU; None on a CPU.
    """

    host: torch.Tensor
    step: int
    event: Any = None

    def wait(self) -> torch.Tensor:
        """The host rows, once the copy has arrived."""
        if self.event is not None:
            self.event.synchronize()
        return self.host


def warp_codes(batch: Batch, max_extent: float) -> torch.Tensor | None:
    """``[B]`` int64 failure codes from the kernels of :mod:`~alchemi_core.dynamics.check_kernels`,
    or None where that path does not apply (no warp-lang, a CPU batch and a Warp build that cannot
    compile CPU kernels, or fields of other dtypes or shapes) and torch must do it."""
    return WarpHealthCodes()(batch, max_extent)


class WarpHealthCodes:
    """The three health kernels, launched at every check with buffers kept between checks, so
    that unchanged arguments are not set again (:func:`~alchemi_core.warp_runtime.launch_args`).
    The codes come back in a buffer of this object, valid until its next call."""

    def __init__(self) -> None:
        self._out: torch.Tensor | None = None
        self._buffers: tuple[torch.Tensor, ...] = ()
        self._dummy_energy: torch.Tensor | None = None

    def __call__(self, batch: Batch, max_extent: float) -> torch.Tensor | None:
        pos = batch.positions
        n, atoms_n = batch.num_graphs, batch.num_nodes
        if pos.dtype not in (torch.float32, torch.float64) or n == 0 or atoms_n == 0:
            return None
        vectors = [getattr(batch, name) if name in batch else None for name in ("velocities", "forces")]
        if any(v is not None and (v.dtype != pos.dtype or tuple(v.shape) != tuple(pos.shape)) for v in vectors):
            return None
        energy = batch.energy if "energy" in batch else None
        if energy is not None and (energy.dtype != pos.dtype or energy.numel() != n):
            return None
        from alchemi_core.dynamics.check_kernels import kernels, warp_for
        from alchemi_core.warp_runtime import Typed, launch_args

        wp = warp_for(pos.device)
        if wp is None:
            return None
        reset, atoms, systems = kernels()
        vec = wp.vec3d if pos.dtype == torch.float64 else wp.vec3f
        dev = pos.device
        bad, lo, hi, out = self._accumulators(n, dev)
        p, v, f = (Typed(t.contiguous(), vec) if t is not None else None for t in (pos, *vectors))
        assert p is not None
        e = energy.reshape(-1).contiguous() if energy is not None else self._no_energy(pos)
        idx = batch.batch_idx
        if idx.dtype != torch.int64:
            idx = idx.to(torch.int64)
        launch_args(reset, n, (bad, lo, hi, wp.float64(float("inf"))), dev)
        launch_args(atoms, atoms_n, (p, v if v is not None else p, f if f is not None else p, int(v is not None),
                                     int(f is not None), idx.contiguous(), bad, lo, hi), dev)
        launch_args(systems, n, (bad, lo, hi, e, int(energy is not None), wp.float64(max_extent), out), dev)
        self._out = out
        return out

    def _accumulators(self, n: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        held = self._buffers
        if not held or held[3].shape[0] != n or held[3].device != device:
            held = self._buffers = (
                torch.empty((n, 3), dtype=torch.int32, device=device),
                torch.empty((n, 3), dtype=torch.float64, device=device),
                torch.empty((n, 3), dtype=torch.float64, device=device),
                torch.empty(n, dtype=torch.int64, device=device),
            )
        return held

    def _no_energy(self, pos: torch.Tensor) -> torch.Tensor:
        held = self._dummy_energy
        if held is None or held.dtype != pos.dtype or held.device != pos.device:
            held = self._dummy_energy = pos.new_zeros(1)
        return held
