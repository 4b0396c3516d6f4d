"""``ExplodingModel``: a model that returns NaN forces for chosen structures, to test quarantine.

It wraps another model and, for the systems whose ``system_id`` is in ``explode`` (from step
``after`` of its own calls on), replaces their forces and energy with NaN, on the device and
without reading back (its cost is the same whether or not anything explodes).

Example:
    >>> import math
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_core.testing.exploding import ExplodingModel
    >>> out = ExplodingModel(DemoModelWrapper(), explode=[1])(make_batch([2, 3]))
    >>> math.isnan(out["energy"][1, 0].item()), math.isnan(out["energy"][0, 0].item())
    (True, False)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from alchemi_core.models.base import BaseModel, check_input, model_card


class ExplodingModel(BaseModel):
    """``inner``'s results, NaN for the systems of ``explode`` (see the module docstring).

    Args:
        inner: The model whose results are passed through.
        explode: ``system_id`` values whose forces and energy become NaN.
        after: Calls before the first NaN (0: from the first call).
    """

    def __init__(self, inner: Any, explode: Iterable[int], after: int = 0) -> None:
        super().__init__()
        self.inner = inner
        self.card = model_card(inner)
        self.after = int(after)
        self.calls = 0
        self._explode = torch.tensor(sorted({int(i) for i in explode}), dtype=torch.long)
        self._key: tuple[int, int] | None = None
        self._node_mask: torch.Tensor | None = None
        self._system_mask: torch.Tensor | None = None

    def _masks(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        key = (id(batch), batch.version)
        if key != self._key or self._node_mask is None or self._system_mask is None:
            chosen = torch.isin(batch.system_id.reshape(-1), self._explode.to(batch.device))
            self._system_mask = chosen.unsqueeze(-1)
            self._node_mask = chosen.index_select(0, batch.batch_idx).unsqueeze(-1)
            self._key = key
        return self._node_mask, self._system_mask

    def forward(self, batch: Any, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        out = dict(self.inner(batch, compute_stress=compute_stress) if compute_stress else self.inner(batch))
        self.calls += 1
        if self.calls > self.after:
            nodes, systems = self._masks(batch)
            out["forces"] = torch.where(nodes, torch.nan, out["forces"])
            out["energy"] = torch.where(systems, torch.nan, out["energy"])
        return out

    def check_batch(self, batch: Any) -> None:
        check_input(self.inner, batch)

    def verify(self, batch: Any) -> None:
        getattr(self.inner, "verify", lambda b: None)(batch)

    def error_flag(self, batch: Any) -> Any:
        return getattr(self.inner, "error_flag", lambda b: None)(batch)
