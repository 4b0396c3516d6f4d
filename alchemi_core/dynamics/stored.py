"""Which structures a sink holds results of: the ``system_id``s a resumed or rerun run checks.

Example:
    >>> from alchemi_core.dynamics import HostMemory
    >>> from alchemi_core.dynamics.stored import stored_results
    >>> from alchemi_core.testing import make_batch
    >>> sink = HostMemory(capacity=None)
    >>> sink.write(make_batch([2, 3]))
    >>> stored_results(sink).tolist()
    [0, 1]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


def stored_results(sink: Any, frame_statuses: Iterable[int] = ()) -> np.ndarray | None:
    """The ``system_id`` of every result ``sink`` holds (an id twice if it was written twice):
    its records less those whose ``status`` is one of ``frame_statuses`` (trajectory frames).
    None when the sink cannot tell (it keeps no ``system_id``, or no ``status`` where frames are
    to be left out, or cannot be read back).

    A sink with a ``store`` that reads columns (``ZarrData``) is read two columns at a time;
    any other through ``read()``. Pending asynchronous writes are waited for first.
    """
    flush = getattr(sink, "flush", None)
    if callable(flush):
        flush()
    frames = np.asarray(sorted(int(s) for s in frame_statuses), dtype=np.int64)
    store = getattr(sink, "store", None)
    if store is not None and callable(getattr(store, "read_rows", None)):
        store.refresh()
        n = int(store.num_systems)
        header = getattr(store, "header", None)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        if header is None or "system_id" not in header.fields:
            return None
        ids = np.asarray(store.read_rows("system_id", 0, n), dtype=np.int64).reshape(-1)
        status = np.asarray(store.read_rows("status", 0, n), dtype=np.int64).reshape(-1) \
            if "status" in header.fields else None
    else:
        if len(sink) == 0:
            return np.zeros(0, dtype=np.int64)
        read = getattr(sink, "read", None)
        if not callable(read):
            return None
        batch = read()
        if "system_id" not in batch:
            return None
        ids = batch.system_id.reshape(-1).cpu().numpy().astype(np.int64)
        status = batch.status.reshape(-1).cpu().numpy().astype(np.int64) if "status" in batch else None
    if not len(frames):
        return ids
    if status is None:  # frames cannot be told from results
        return None
    return ids[~np.isin(status, frames)]
