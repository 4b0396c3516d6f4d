"""Per-system columns given as ``[B, 1]``, the shape nvalchemi uses for ``status`` and ``fmax``.

The engine works on ``[B]`` columns (``status``, ``fmax``, ``energy_change``, ``stage_steps``).
A batch that brings them as ``[B, 1]`` is flattened when a run starts and given back in its own
shape when the run ends, so code written for either shape works unchanged.

Example:
    >>> import torch
    >>> from alchemi_core.testing import make_batch
    >>> batch = make_batch([2, 3])
    >>> batch.set_field("status", torch.zeros(2, 1, dtype=torch.long), "system")
    >>> shapes = flatten_system_columns(batch)
    >>> shapes, list(batch.status.shape)
    ({'status': 2}, [2])
    >>> restore_system_columns(batch, shapes); list(batch.status.shape)
    [2, 1]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from alchemi_core.errors import InvalidDataError

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: The engine's one-value-per-system columns, with the dtype each must have.
COLUMNS = {"status": torch.long, "stage_steps": torch.long, "fmax": None, "energy_change": None}


def flatten_system_columns(batch: Batch) -> dict[str, int]:
    """Make each column of :data:`COLUMNS` in ``batch`` one-dimensional; returns the names that
    were ``[B, 1]`` (name -> 2) for :func:`restore_system_columns`.

    Raises:
        InvalidDataError: A column with more than one value per system.
    """
    shapes: dict[str, int] = {}
    for name, dtype in COLUMNS.items():
        if name not in batch:
            continue
        t = getattr(batch, name)
        if t.dim() == 1 and (dtype is None or t.dtype == dtype):
            continue
        if t.dim() > 2 or (t.dim() == 2 and t.shape[1] != 1):
            raise InvalidDataError(
                f"{name} must hold one value per system, shape [B] or [B, 1]; got {list(t.shape)}"
            )
        if dtype is not None and (t.dtype.is_floating_point or t.dtype == torch.bool):
            raise InvalidDataError(f"{name} must be an integer tensor, got dtype {t.dtype}")
        if t.dim() == 2:
            shapes[name] = 2
        batch.set_field(name, t.reshape(-1).to(dtype or t.dtype), "system")
    return shapes


def restore_system_columns(batch: Batch, shapes: dict[str, int]) -> None:
    """Give the columns :func:`flatten_system_columns` flattened their ``[B, 1]`` shape back."""
    for name in shapes:
        if name in batch and getattr(batch, name).dim() == 1:
            batch.set_field(name, getattr(batch, name).reshape(-1, 1), "system")
