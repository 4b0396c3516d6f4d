"""``ConvergenceHook``: decide per system, on the device, whether it has converged.

Criteria are AND-ed. Each names a batch field (``key``), a ``threshold`` and how to reduce the
field to one number per system:

* atom-level fields (``forces``) are first reduced over ``reduce_dims`` for each atom with
  ``reduce_op`` (``"norm"`` is the vector norm), then over the atoms of each system (``max`` for
  ``norm``/``max``, ``min``, ``mean`` or ``sum`` otherwise);
* system-level fields (``fmax``, ``energy_change``, ``energy``) are reduced over their trailing
  dimensions, if any.

A system converges when every reduced value is ``<= threshold`` (NaN never converges). A
``custom_op(value)`` replaces the reduction: it returns a per-system value to compare, or a bool
verdict. The engine keeps ``fmax`` (largest atomic force norm, eV/Å) and ``energy_change``
(|E - E of the previous step|, eV) on the batch whenever a criterion names them.

Example:
    >>> from alchemi_core.dynamics import ConvergenceHook
    >>> hook = ConvergenceHook(criteria=[{"key": "fmax", "threshold": 0.05, "reduce_op": "max"},
    ...                                  {"key": "energy_change", "threshold": 1e-6}])
    >>> sorted(hook.keys)
    ['energy_change', 'fmax']
    >>> ConvergenceHook.from_fmax(0.05).criteria[0].threshold
    0.05
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from alchemi_core.data.fields import Level
from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_core.validation import finite_number

if TYPE_CHECKING:
    from alchemi_core.data import Batch

REDUCE_OPS = ("min", "max", "norm", "mean", "sum")
#: Fields the engine computes when a criterion names them.
ENGINE_KEYS = frozenset({"fmax", "energy_change"})


@attrs.frozen
class Criterion:
    """One convergence test: ``reduce(batch[key]) <= threshold`` per system."""

    key: str
    threshold: float
    reduce_op: str | None = None
    reduce_dims: int | tuple[int, ...] | None = -1
    custom_op: Callable[[torch.Tensor], torch.Tensor] | None = None

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | Criterion) -> Criterion:
        if isinstance(spec, Criterion):
            return spec
        unknown = set(spec) - {"key", "threshold", "reduce_op", "reduce_dims", "custom_op"}
        if unknown or "key" not in spec or "threshold" not in spec:
            raise ConfigurationError(
                f"a convergence criterion needs 'key' and 'threshold' (optional 'reduce_op', "
                f"'reduce_dims', 'custom_op'); got {dict(spec)}"
            )
        op = spec.get("reduce_op")
        if op is not None and op not in REDUCE_OPS:
            raise ConfigurationError(f"reduce_op {op!r} is not one of {REDUCE_OPS}")
        dims = spec.get("reduce_dims", -1)
        dims = tuple(dims) if isinstance(dims, (list, tuple)) else dims
        parts = dims if isinstance(dims, tuple) else (dims,)
        if dims is not None and not all(isinstance(d, int) and not isinstance(d, bool) for d in parts):
            raise ConfigurationError(
                f"convergence criterion {spec.get('key')!r}: reduce_dims must be an int, a list of ints or None, "
                f"got {dims!r}"
            )
        custom = spec.get("custom_op")
        if custom is not None and not callable(custom):
            raise ConfigurationError("custom_op must be callable")
        key = str(spec["key"])
        # fmax, energy_change and norms are never negative: a negative threshold can never pass.
        floor = 0.0 if key in ENGINE_KEYS or op == "norm" else None
        threshold = finite_number(f"convergence criterion {key!r} threshold", spec["threshold"], minimum=floor)
        return cls(key, threshold, op, dims, custom)


def _reduce_rows(value: torch.Tensor, op: str, dims: int | tuple[int, ...] | None) -> torch.Tensor:
    """Reduce every dimension but the first (those named by ``dims``) with ``op``."""
    if value.dim() == 1:
        return value
    if dims is None:
        dims = tuple(range(1, value.dim()))
    if op == "norm":
        out = torch.linalg.vector_norm(value, dim=dims)
    else:  # amax, amin, mean, sum
        out = getattr(value, {"max": "amax", "min": "amin"}.get(op, op))(dim=dims)
    return out.reshape(out.shape[0], -1).amax(dim=1) if out.dim() > 1 else out


def _checked_dims(c: Criterion, value: torch.Tensor, rows: str) -> int | tuple[int, ...] | None:
    """``c.reduce_dims`` once they name dimensions of ``value`` after the first (None for a
    field with one dimension, which has nothing to reduce per row).

    Raises:
        ConfigurationError: A dimension out of range, or the first one (which runs over ``rows``).
    """
    dims, ndim = c.reduce_dims, value.dim()
    if ndim == 1 or dims is None:
        return None
    for d in dims if isinstance(dims, tuple) else (dims,):
        if not -ndim < d < ndim or d % ndim == 0:
            raise ConfigurationError(
                f"convergence criterion {c.key!r}: reduce_dims {dims!r} is out of range for {c.key} of shape "
                f"{list(value.shape)}; name dimensions 1 to {ndim - 1} (or -1 to -{ndim - 1}): dimension 0 runs "
                f"over the {rows}"
            )
    return dims


def _segment(per_atom: torch.Tensor, batch: Batch, op: str) -> torch.Tensor:
    """One value per system from one value per atom."""
    n = batch.num_graphs
    idx = batch.batch_idx
    if op == "sum":
        return torch.zeros(n, dtype=per_atom.dtype, device=per_atom.device).index_add_(0, idx, per_atom)
    reduce = {"max": "amax", "norm": "amax", "min": "amin", "mean": "mean"}[op]
    return torch.zeros(n, dtype=per_atom.dtype, device=per_atom.device).scatter_reduce_(
        0, idx, per_atom, reduce=reduce, include_self=False
    )


class ConvergenceHook(Hook):
    """Per-system convergence from criteria on batch fields; moves converged systems' status.

    Args:
        criteria: Dicts (or :class:`Criterion`) with ``key``, ``threshold`` and optional
            ``reduce_op``, ``reduce_dims``, ``custom_op``; all must pass.
        source_status: Only systems with this status are checked (default: the stage's own).
        target_status: Status converged systems move to (default: the next stage, or graduation).
        frequency: Check every N steps; each check is a device computation, and the engine reads
            back from the GPU only at checks.
    """

    stage = DynamicsStage.ON_CONVERGE

    def __init__(
        self,
        criteria: Sequence[Mapping[str, Any] | Criterion] | None = None,
        source_status: int | None = None,
        target_status: int | None = None,
        frequency: int = 1,
    ) -> None:
        super().__init__(frequency=frequency)
        if not criteria:
            raise ConfigurationError("ConvergenceHook needs at least one criterion")
        self.criteria: tuple[Criterion, ...] = tuple(Criterion.from_spec(c) for c in criteria)
        self.source_status = None if source_status is None else int(source_status)
        self.target_status = None if target_status is None else int(target_status)

    @classmethod
    def from_fmax(
        cls,
        threshold: float,
        source_status: int | None = None,
        target_status: int | None = None,
        frequency: int = 1,
    ) -> ConvergenceHook:
        """Converged when the largest atomic force norm is at most ``threshold`` eV/Å."""
        return cls(
            criteria=[{"key": "fmax", "threshold": threshold, "reduce_op": "max"}],
            source_status=source_status,
            target_status=target_status,
            frequency=frequency,
        )

    @property
    def keys(self) -> set[str]:
        return {c.key for c in self.criteria}

    def evaluate(self, batch: Batch) -> torch.Tensor:
        """``[B]`` bool: True where every criterion passes (status is not looked at here)."""
        result: torch.Tensor | None = None
        for c in self.criteria:
            if c.key not in batch:
                raise InvalidDataError(
                    f"convergence criterion names {c.key!r}, but the batch has no such field; "
                    f"it has {sorted(batch.keys())}"
                )
            value = getattr(batch, c.key)
            level = batch.level_of(c.key)
            if c.custom_op is not None:
                value = c.custom_op(value)
                per_atom = level is Level.NODE and value.shape[0] == batch.num_nodes
                if value.dtype == torch.bool:
                    # A verdict per atom passes for a system when it passes for all its atoms.
                    failed = (~value).reshape(value.shape[0], -1).any(dim=1).to(torch.int32)
                    ok = (_segment(failed, batch, "max") == 0) if per_atom else ~failed.bool()
                else:
                    if per_atom:
                        value = _segment(_reduce_rows(value, "max", None), batch, "max")
                    ok = value.reshape(batch.num_graphs, -1).amax(dim=1) <= c.threshold
            elif level is Level.NODE:
                op = c.reduce_op or ("norm" if value.dim() > 1 else "max")
                per_atom = _reduce_rows(value, op, _checked_dims(c, value, "atoms"))
                ok = _segment(per_atom, batch, op) <= c.threshold
            elif level is Level.SYSTEM:
                op = c.reduce_op or "max"
                ok = _reduce_rows(value, op, _checked_dims(c, value, "systems")) <= c.threshold
            else:
                raise ConfigurationError(f"convergence criteria cannot use edge field {c.key!r}")
            result = ok if result is None else result & ok
        assert result is not None
        return result

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        """Run by itself (outside the engine): mark converged systems of ``source_status``."""
        conv = self.evaluate(batch)
        src = self.source_status if self.source_status is not None else 0
        tgt = self.target_status if self.target_status is not None else src + 1
        move = conv & (batch.status == src)
        batch.status.masked_fill_(move, tgt)

    def __repr__(self) -> str:
        crit = ", ".join(f"{c.key}<={c.threshold}" for c in self.criteria)
        return (
            f"ConvergenceHook([{crit}], source_status={self.source_status}, "
            f"target_status={self.target_status}, frequency={self.frequency})"
        )
