"""Interrupt a run, save the integrator's ``state_dict()``, resume it in a fresh integrator."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import torch


def resumed_run(fresh: Callable[[], Any], batch: Any) -> tuple[Any, Any]:
    """Run ``fresh()`` on ``batch`` twice in a row (the uninterrupted run, in place), and from the
    batch as it was after the first run: once in a fresh integrator given the first one's
    ``state_dict()`` (saved and loaded as a checkpoint would be), once in one without it.

    Returns ``(resumed, unrestored)``: the two batches that ran from the saved point.
    """
    first = fresh()
    first.run(batch)
    saved, unrestored = batch.clone(), batch.clone()
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    first.run(batch)
    buffer.seek(0)
    resumed = fresh()
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    resumed.run(saved)
    fresh().run(unrestored)
    return saved, unrestored
