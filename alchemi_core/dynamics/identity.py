"""Every structure a run takes in has its own ``system_id``: two with one id could not be told
apart in the sinks, so a resumed run or an analysis would lose or merge them.

The check runs where structures enter (the first batch, each refill, a dataset when a sampler is
built on it); those are check steps, where reading ids back from the device is allowed.

Example:
    >>> from alchemi_core.dynamics.identity import SystemIds
    >>> ids = SystemIds()
    >>> ids.admit([0, 1, 2], "the first batch")
    >>> try:
    ...     ids.admit([3, 1], "a refill")
    ... except ValueError as exc:
    ...     print(str(exc).split(";")[0])
    a refill brings system_id [1] that the run already holds or wrote
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np

from alchemi_core.errors import InvalidDataError

_FIX = (
    "every structure needs its own system_id: give the dataset unique ids, or leave system_id out to "
    "number structures by their index"
)


class SystemIds:
    """The ids a run has taken in so far."""

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def admit(self, ids: Iterable[int], where: str) -> None:
        """Record ``ids``; raise when one repeats (within them or an earlier one).

        Raises:
            InvalidDataError: A repeated id (the message lists up to ten).
        """
        ids = [int(i) for i in ids]
        counts = Counter(ids)
        repeated = sorted({i for i, c in counts.items() if c > 1} | (counts.keys() & self._seen))
        if repeated:
            raise InvalidDataError(
                f"{where} brings system_id {repeated[:10]}{'...' if len(repeated) > 10 else ''} that the run "
                f"already holds or wrote; {_FIX}"
            )
        self._seen.update(ids)

    def reset(self, ids: Iterable[int]) -> None:
        """Start over from ``ids`` (a resumed run: the systems of its restored batch)."""
        self._seen = {int(i) for i in ids}


def check_dataset_ids(ids: np.ndarray, what: str) -> None:
    """Raise when a dataset's ids (one per structure, by index) repeat.

    Raises:
        InvalidDataError: Names the repeated ids and the indices holding them.
    """
    if len(ids) == 0:
        return
    values, first, counts = np.unique(ids, return_index=True, return_counts=True)
    if (counts > 1).any():
        dup = values[counts > 1][:5]
        where = "; ".join(f"{int(v)} at structures {np.nonzero(ids == v)[0][:4].tolist()}" for v in dup)
        raise InvalidDataError(f"{what} holds repeated system_id values ({where}); {_FIX}")
