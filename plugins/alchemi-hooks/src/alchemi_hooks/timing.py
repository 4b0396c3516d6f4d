"""``StageTimingHook``: where the time of a step goes.

The hook puts a mark at each of the eight points of a step (``BEFORE_STEP`` ...
``AFTER_STEP``) and adds the time between consecutive marks to a phase:

* ``pre_update``: ``BEFORE_PRE_UPDATE`` -> ``AFTER_PRE_UPDATE`` (the integrator's first half),
* ``compute``: ``BEFORE_COMPUTE`` -> ``AFTER_COMPUTE`` (the model forward),
* ``post_update``: ``BEFORE_POST_UPDATE`` -> ``AFTER_POST_UPDATE`` (the integrator's second half),
* ``checks``: ``AFTER_STEP`` -> the next ``BEFORE_STEP`` (convergence, graduation, refill),
* ``hooks``: every other interval (other hooks and the engine's bookkeeping between points).

List this hook first or last to include or exclude the other hooks' time. On a GPU the marks
are CUDA events (device time, read once completed), on a CPU ``time.perf_counter()``.
``summary()`` returns the totals; a table is printed at run end unless ``report=False``.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_hooks.timing import StageTimingHook
    >>> timing = StageTimingHook(report=False)
    >>> md = DemoDynamics(model=DemoModelWrapper(), n_steps=100, dt=0.5, hooks=[timing])
"""

from __future__ import annotations

import sys
import time
import weakref
from collections import deque
from typing import IO, TYPE_CHECKING, Any

import torch

from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_hooks.parts import HookPart

if TYPE_CHECKING:
    from alchemi_core.data import Batch

_P = DynamicsStage
#: Points marked, in step order (ON_CONVERGE happens inside the checks).
MARKED = tuple(p for p in DynamicsStage if p is not DynamicsStage.ON_CONVERGE)
PHASES = ("pre_update", "compute", "post_update", "checks", "hooks")
_NAMED = {
    (_P.BEFORE_PRE_UPDATE, _P.AFTER_PRE_UPDATE): "pre_update",
    (_P.BEFORE_COMPUTE, _P.AFTER_COMPUTE): "compute",
    (_P.BEFORE_POST_UPDATE, _P.AFTER_POST_UPDATE): "post_update",
    (_P.AFTER_STEP, _P.BEFORE_STEP): "checks",
}


def phase_of(start: DynamicsStage, end: DynamicsStage) -> str:
    """The phase the interval between marks at ``start`` and ``end`` belongs to."""
    return _NAMED.get((start, end), "hooks")


class StageTimingHook(Hook):
    """Time each phase of the step (see the module docstring).

    Args:
        frequency: Time every N-th step (``checks`` needs consecutive steps: keep 1 for it).
        report: Print the summary table when the run ends.
        file: Where to print it (default ``sys.stderr``).
    """

    stage = DynamicsStage.BEFORE_STEP

    def __init__(self, frequency: int = 1, report: bool = True, file: IO[str] | None = None) -> None:
        super().__init__(frequency=frequency)
        self.report = bool(report)
        self.file = file
        self.parts = tuple(HookPart(p, self._marker(p), frequency=self.frequency) for p in MARKED)
        self._reset()

    def _reset(self) -> None:
        self._seconds = dict.fromkeys(PHASES, 0.0)
        self._count = dict.fromkeys(PHASES, 0)
        self._steps: set[int] = set()
        self._cuda = False
        # (point, step, perf_counter time or CUDA event), oldest first, not yet added up.
        self._marks: deque[tuple[DynamicsStage, int, Any]] = deque()
        self._spare: list[Any] = []  # CUDA events to record again
        self._wall = 0.0
        self._run_started = 0.0

    def on_run_start(self, batch: Batch, dynamics: Any) -> None:
        self._reset()
        self._cuda = batch.device.type == "cuda"
        self._run_started = time.perf_counter()

    def on_run_end(self, batch: Batch, dynamics: Any) -> None:
        self._drain(wait=True)
        self._wall += time.perf_counter() - self._run_started
        if self.report and self._steps:
            print(self.table(), file=self.file or sys.stderr, flush=True)

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        """A mark at ``BEFORE_STEP`` (the engine calls the parts; this is for calling by hand)."""
        self._mark(_P.BEFORE_STEP, dynamics)

    def _marker(self, point: DynamicsStage) -> Any:
        hook = weakref.ref(self)  # the hook holds its parts: a strong reference would be a cycle

        def mark(batch: Batch, dynamics: Any) -> None:
            timing = hook()
            if timing is not None:
                timing._mark(point, dynamics)

        mark.__qualname__ = f"StageTimingHook.mark[{point.name}]"
        return mark

    def _mark(self, point: DynamicsStage, dynamics: Any) -> None:
        step = int(getattr(dynamics, "step_count", 0))
        self._steps.add(step)
        self._marks.append((point, step, self._stamp()))
        # On a GPU, read what has completed once per step; on a CPU every interval at once.
        if not self._cuda or point is _P.AFTER_STEP:
            self._drain(wait=False)

    def _stamp(self) -> Any:
        if not self._cuda:
            return time.perf_counter()
        event = self._spare.pop() if self._spare else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _drain(self, wait: bool) -> None:
        """Add the intervals between marks that have completed (all of them when ``wait``)."""
        marks = self._marks
        if wait and self._cuda and marks:
            marks[-1][2].synchronize()
        while len(marks) >= 2 and (wait or not self._cuda or marks[1][2].query()):
            start, start_step, t0 = marks.popleft()
            end, end_step, t1 = marks[0]
            # Marks of one step, or AFTER_STEP then the next step's BEFORE_STEP; skipped steps
            # (frequency > 1) leave gaps that are no phase.
            next_step = start is _P.AFTER_STEP and end is _P.BEFORE_STEP and end_step == start_step + 1
            if start_step == end_step or next_step:
                phase = phase_of(start, end)
                self._seconds[phase] += t0.elapsed_time(t1) / 1000.0 if self._cuda else t1 - t0
                self._count[phase] += 1
            if self._cuda:
                self._spare.append(t0)
        if wait and marks:
            _, _, last = marks.popleft()
            if self._cuda:
                self._spare.append(last)

    def summary(self) -> dict[str, Any]:
        """Totals per phase: ``{"steps": n, "wall_s": s, "phases": {phase: {"total_s", "per_step_ms",
        "share", "intervals"}}}``, shares of the time between the marks."""
        steps = max(1, len(self._steps))
        timed = sum(self._seconds.values()) or 1.0
        phases = {
            p: {
                "total_s": self._seconds[p],
                "per_step_ms": 1000.0 * self._seconds[p] / steps,
                "share": self._seconds[p] / timed,
                "intervals": self._count[p],
            }
            for p in PHASES
        }
        device = "cuda" if self._cuda else "cpu"
        return {"steps": len(self._steps), "wall_s": self._wall, "device": device, "phases": phases}

    def table(self) -> str:
        """The summary as a text table."""
        s = self.summary()
        lines = [
            f"StageTimingHook: {s['steps']} steps timed ({s['device']} clock), run wall time {s['wall_s']:.3f} s",
            f"{'phase':<12} {'total (s)':>10} {'ms/step':>10} {'share':>7}",
        ]
        for name, p in s["phases"].items():
            lines.append(f"{name:<12} {p['total_s']:>10.4f} {p['per_step_ms']:>10.4f} {100 * p['share']:>6.1f}%")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"StageTimingHook(frequency={self.frequency})"
