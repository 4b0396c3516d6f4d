"""A hook that records per-system quantities during a run, for the physics tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from alchemi_core.dynamics import Hook


class Record(Hook):
    """Every ``frequency`` steps, store ``measure(batch, dynamics)`` (a ``[B]`` tensor), on the host."""

    def __init__(self, measure: Callable[[Any, Any], torch.Tensor], frequency: int = 1) -> None:
        super().__init__(frequency=frequency)
        self.measure = measure
        self.rows: list[torch.Tensor] = []

    def __call__(self, batch: Any, dynamics: Any) -> None:
        self.rows.append(self.measure(batch, dynamics).detach().double().cpu().clone())

    def array(self) -> np.ndarray:
        """``[samples, B]`` float64."""
        return torch.stack(self.rows).numpy()


def integrated_autocorrelation_time(series: np.ndarray, window: int = 500) -> float:
    """Integrated autocorrelation time (in samples) of a 1-D series, summing the normalised
    autocorrelation up to its first negative value (a standard, slightly conservative cut)."""
    x = series - series.mean()
    n = len(x)
    spectrum = np.fft.rfft(x, 2 * n)
    acf = np.fft.irfft(spectrum * np.conj(spectrum))[:n]
    acf /= acf[0]
    tau = 1.0
    for lag in range(1, min(window, n)):
        if acf[lag] < 0:
            break
        tau += 2.0 * acf[lag]
    return tau
