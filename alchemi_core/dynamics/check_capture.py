"""A check's device work, captured as a CUDA graph and replayed at the checks that follow.

Before its one read-back, a check measures on the device: the quarantine's failure codes (marked
into the statuses), ``fmax``, the convergence criteria, the budgets, and the flags the read-back
answers (:class:`Measurement`). Eagerly that is some forty small torch operations and three Warp
launches, whose host time dwarfs the device's; replayed, it is one graph launch.

A measurement is captured only where it holds no read-back and every address it reads stays put:

- the run asked for CUDA graphs (``compile()``) and its batch is on a GPU;
- the quarantine is not ``strict`` (a strict check reads its codes back at once);
- no stage has ``ON_CONVERGE`` hooks (they run, and may read back, between the measurement's
  operations) and no convergence criterion has a ``custom_op`` (user code);
- the key is the same: the set of systems (``batch.version``), which stages' criteria are due at
  this step, and the address and shape of every batch field and of the masks' status copy.

A key is captured the second time in a row that a check sees it, so a check right after a refill,
whose key is new and may be the last of its kind, pays no capture. Models' error flags stay out of
the graph (they belong to the models' own buffers): the engine writes them into the last flag
after the replay. A capture that fails (some operation read back after all) turns capture off for the run
with a ``RuntimeWarning`` that names the error, and the check is measured eagerly: the same results,
at the eager checks' host cost.

Example:
    >>> capture = CheckCapture()
    >>> capture.enabled, capture.captures
    (True, 0)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from typing import Any

import attrs
import torch

from alchemi_core.dynamics.capture import capture_graph, capture_stream, retire_graph


@attrs.define
class Measurement:
    """What a check measured on the device, before its read-back.

    Attributes:
        before: ``[B]`` statuses at the start of the check.
        moved: ``[B]`` bool, the systems whose status the check changed.
        codes: ``[B]`` failure codes of the systems quarantined here (0: healthy), or None where
            nothing was checked (no systems, or ``strict``, which raised or found nothing).
        flags: ``[6]`` bool: some status moved, some status differs from the masks', some system
            is active, every system graduated, some system went bad, a model has an error.
        model_flag: The last flag, a view: a captured measurement leaves it False and the engine
            writes the models' error flag into it after each replay.
    """

    before: torch.Tensor
    moved: torch.Tensor
    codes: torch.Tensor | None
    flags: torch.Tensor
    model_flag: torch.Tensor


class CheckCapture:
    """The captured measurement of a run's checks (see the module docstring)."""

    def __init__(self) -> None:
        self.enabled = True
        #: How many measurements were captured (a test and the phase timer read it).
        self.captures = 0
        self._graph: Any = None
        self._key: Hashable = None
        self._seen: Hashable = None
        self._out: Measurement | None = None
        #: A replaced graph, kept until the next capture takes over its memory pool.
        self._spent: Any = None
        #: The GPU the graphs were captured on.
        self._gpu = 0

    def release(self) -> None:
        """Drop the captured measurement (its memory pool serves the next captures on this GPU,
        ``capture.retire_graph``); the next check measures eagerly, and a repeat of its key
        captures again."""
        for graph in (self._graph, self._spent):
            if graph is not None:
                retire_graph(graph, self._gpu)
        self._graph = self._out = self._spent = None
        self._key = self._seen = None

    def measure(self, key: Hashable, measure: Callable[[], Measurement]) -> Measurement:
        """The measurement for ``key``: replayed, captured now (and replayed), or eager.

        ``measure`` must record the same device operations every time it is called with this key,
        and must not read back.
        """
        out = self._out
        if self._graph is not None and key == self._key and out is not None:
            self._graph.replay()
            return out
        old, self._graph, self._out = self._graph, None, None
        if key != self._seen:
            self._seen = key
            if old is not None:
                self._spent = old  # its memory pool serves the next capture
            return measure()
        old = old if old is not None else self._spent
        self._spent = None
        try:
            self._gpu = torch.cuda.current_device()
            graph, captured = capture_graph(measure, capture_stream(self._gpu), replaces=old)
        except Exception as exc:
            # Something read back inside the measurement (a model or a field this module cannot
            # see), or the measurement raises (then it raises again, eagerly): measure eagerly
            # from now on, and say so: the run stays right but its checks cost more host time.
            self.enabled = False
            self._seen = None
            warnings.warn(
                f"a check's device work could not be captured as a CUDA graph ({exc!r}); this run's "
                "checks are measured eagerly from now on (same results, more host time per check). "
                "An operation that reads values back to the host inside a convergence criterion, "
                "a model's check or a batch field's update is the usual cause.",
                RuntimeWarning,
                stacklevel=2,
            )
            return measure()
        self._graph, self._key, self._out = graph, key, captured
        self.captures += 1
        graph.replay()
        return captured


def field_addresses(batch: Any) -> tuple[tuple[str, int, tuple[int, ...]], ...]:
    """Name, address and shape of every field of ``batch`` (and of its system index)."""
    held = tuple((name, t.data_ptr(), tuple(t.shape)) for name, t in batch._store.items())
    idx = batch.batch_idx
    return (*held, ("batch_idx", idx.data_ptr(), tuple(idx.shape)))
