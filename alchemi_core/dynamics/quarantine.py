"""Quarantine: a structure that goes bad leaves the run with a failure status and a reason,
instead of ending the run or poisoning its results.

At each check step (never inside a step) the engine computes, on the device, one failure code
per system: a bit for each of non-finite positions, velocities, forces and energy, and one for
atoms that flew apart (the system's bounding box grew past ``max_extent`` Å). Only these codes
are read back, one byte per system. A system with a nonzero code gets ``status = -code``: no
stage steps it any more, it is written to the sinks at the next refill like a graduated system
(or stays, frozen, in a returned batch), and the run records it in ``quarantined``. With
``strict=True`` the run raises instead, naming the systems and reasons.

Negative statuses are reserved for quarantine, so stage status codes are ``>= 0``.

Example:
    >>> from alchemi_core.dynamics.quarantine import failure_reasons, FAILED_FORCES, FAILED_POSITIONS
    >>> failure_reasons(-(FAILED_FORCES | FAILED_POSITIONS))
    ['positions are not finite', 'forces are not finite']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import torch

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

    @classmethod
    def of(cls, owner: Any) -> HealthCheck:
        """The check a stage asked for (its ``strict`` and ``max_extent`` attributes)."""
        return cls(getattr(owner, "max_extent", DEFAULT_MAX_EXTENT), getattr(owner, "strict", False))

    def codes(self, batch: Batch) -> torch.Tensor:
        """``[B]`` int64 failure code of every system (0: healthy), without reading back.

        A dozen kernels whatever the batch holds (this runs at every check): the per-atom
        vectors are tested in one pass and reduced per system in one scatter, and the bounding
        box takes one more scatter over ``[x, -x]``.
        """
        n, idx = batch.num_graphs, batch.batch_idx
        out = torch.zeros(n, dtype=torch.int64, device=batch.device)
        named = [(bit, name) for bit, name in _PER_ATOM if name in batch]
        if named and batch.num_nodes:
            rows = torch.cat([getattr(batch, name) for _, name in named], dim=1)
            bad = ~torch.isfinite(rows).view(rows.shape[0], len(named), 3).all(dim=-1)
            per_system = torch.zeros(n, len(named), dtype=torch.uint8, device=batch.device)
            per_system.scatter_reduce_(0, idx.unsqueeze(-1).expand_as(bad), bad.to(torch.uint8), reduce="amax")
            for j, (bit, _) in enumerate(named):
                out.add_(per_system[:, j].to(torch.int64), alpha=bit)
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
            # NaN compares false: such systems already carry the positions bit.
            out.add_((extent > self.max_extent).to(torch.int64), alpha=FAILED_EXTENT)
        return out

    def find(self, batch: Batch, active: torch.Tensor, step: int) -> list[Quarantined]:
        """Systems of ``active`` (``[B]`` bool) that went bad; their status becomes ``-code``.

        One read-back of one byte per system.

        Raises:
            InvalidDataError: Some went bad and ``strict`` is set (nothing is changed).
        """
        codes = torch.where(active, self.codes(batch), 0)
        host = codes.to(torch.uint8).cpu()
        if not bool(host.any()):
            return []
        rows = torch.nonzero(host).flatten()
        ids = batch.system_id.index_select(0, rows.to(batch.device)).tolist()
        found = [Quarantined(int(i), int(step), -int(host[r])) for i, r in zip(ids, rows.tolist(), strict=True)]
        if self.strict:
            listed = "; ".join(str(q) for q in found[:10])
            raise InvalidDataError(
                f"{len(found)} structures went bad ({listed}){'...' if len(found) > 10 else ''}; strict=True "
                "stops the run. Leave strict off to quarantine them and go on"
            )
        dev_rows = rows.to(batch.device)
        batch.status.index_copy_(0, dev_rows, -codes.index_select(0, dev_rows))
        return found
