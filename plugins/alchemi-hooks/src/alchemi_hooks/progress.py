"""``ProgressHook``: a live progress bar for a run.

Every ``frequency`` steps, and when the run ends, it shows the steps done, the systems done and
active, and the atom-steps per second over the last interval, with rich, else tqdm, else a plain
line (``backend``). Each update reads the status back once: keep ``frequency`` at tens of steps
or more on a GPU. The numbers are the whole run's, whichever stage the hook is given to.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_hooks.progress import ProgressHook
    >>> md = DemoDynamics(model=DemoModelWrapper(), n_steps=1000, dt=0.5, hooks=[ProgressHook(frequency=50)])
"""

from __future__ import annotations

import importlib.util
import sys
import time
from typing import IO, TYPE_CHECKING, Any

from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.errors import ConfigurationError, MissingDependencyError

if TYPE_CHECKING:
    from alchemi_core.data import Batch

BACKENDS = ("auto", "rich", "tqdm", "plain")


class PlainDisplay:
    """One line per update."""

    def __init__(self, file: IO[str], total: int | None, unit: str = "steps") -> None:
        self.file = file
        self.total = total
        self.unit = unit

    def update(self, step: int, info: str) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        what = "step" if self.unit == "steps" else self.unit
        print(f"alchemi: {what} {step}{of} | {info}", file=self.file, flush=True)

    def close(self) -> None:
        self.file.flush()


class TqdmDisplay:
    """A tqdm bar counting steps, the counts as its postfix."""

    def __init__(self, file: IO[str], total: int | None, unit: str = "steps") -> None:
        import tqdm

        self.bar = tqdm.tqdm(total=total, file=file, unit=unit.rstrip("s"), desc="alchemi", dynamic_ncols=True)

    def update(self, step: int, info: str) -> None:
        self.bar.set_postfix_str(info, refresh=False)
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.bar.close()


class RichDisplay:
    """A rich progress bar counting steps, the counts beside it."""

    def __init__(self, file: IO[str], total: int | None, unit: str = "steps") -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn(f"alchemi {unit}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=Console(file=file),
        )
        self.progress.start()
        self.task = self.progress.add_task("steps", total=total, info="")

    def update(self, step: int, info: str) -> None:
        self.progress.update(self.task, completed=step, info=info)

    def close(self) -> None:
        self.progress.refresh()
        self.progress.stop()


Display = PlainDisplay | TqdmDisplay | RichDisplay


def make_display(backend: str, file: IO[str], total: int | None, unit: str = "steps") -> Display:
    """The display for ``backend`` (``"auto"``: rich, else tqdm, else plain), counting ``unit``."""
    if backend == "auto":
        backend = next((b for b in ("rich", "tqdm") if importlib.util.find_spec(b) is not None), "plain")
    if backend in ("rich", "tqdm") and importlib.util.find_spec(backend) is None:
        raise MissingDependencyError(
            f"ProgressHook(backend={backend!r}) needs {backend}: pip install {backend} (or use backend='plain')"
        )
    if backend == "rich":
        return RichDisplay(file, total, unit)
    if backend == "tqdm":
        return TqdmDisplay(file, total, unit)
    return PlainDisplay(file, total, unit)


def run_counts(batch: Batch, dynamics: Any) -> tuple[int, int, int]:
    """``(systems done, systems active, atoms active)`` of the run ``dynamics`` belongs to (one
    read-back of the status)."""
    run = dynamics.context.run
    exit_status = run.exit_status if run is not None else None
    written = run.written_count if run is not None else 0
    if "status" not in batch or exit_status is None:
        return written, batch.num_graphs, batch.num_nodes
    finished = batch.status.cpu().numpy() >= exit_status
    atoms = batch.num_nodes_per_system
    return written + int(finished.sum()), int((~finished).sum()), int(atoms[~finished].sum())


class ProgressHook(Hook):
    """Show steps, systems done and active, and atom-steps/s (see the module docstring).

    Args:
        frequency: Update every N-th step.
        total: Steps the bar counts to (default: a plain run's ``n_steps``; unknown for runs that
            end when every system has graduated).
        structures: Count structures done out of this many instead of steps (a run over a
            dataset of known size: the bar then ends when every structure has finished).
        backend: ``"auto"``, ``"rich"``, ``"tqdm"`` or ``"plain"``.
        file: Where to draw (default ``sys.stderr``).

    Attributes:
        throughput: Atom-steps per second over the last interval.
    """

    stage = DynamicsStage.AFTER_STEP

    def __init__(
        self,
        frequency: int = 10,
        total: int | None = None,
        backend: str = "auto",
        file: IO[str] | None = None,
        structures: int | None = None,
    ) -> None:
        super().__init__(frequency=frequency)
        if structures is not None and int(structures) < 1:
            raise ConfigurationError(f"ProgressHook: structures must be >= 1, got {structures}")
        self.structures = None if structures is None else int(structures)
        if backend not in BACKENDS:
            raise ConfigurationError(f"ProgressHook: backend must be one of {BACKENDS}, got {backend!r}")
        self.total = None if total is None else int(total)
        self.backend = backend
        self.file = file
        self.throughput = 0.0
        self._display: Display | None = None
        self._last_time = 0.0
        self._last_step = 0

    def on_run_start(self, batch: Batch, dynamics: Any) -> None:
        self.close()
        total = self.total
        run = dynamics.context.run
        plain_run = run is not None and not run.ends_on_graduation
        if total is None and plain_run:
            total = int(getattr(dynamics, "n_steps", 0)) or None
        if self.structures is not None:
            total = self.structures
        unit = "structures" if self.structures else "steps"
        self._display = make_display(self.backend, self.file or sys.stderr, total, unit)
        self._last_time = time.perf_counter()
        self._last_step = 0

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        if self._display is None:
            self.on_run_start(batch, dynamics)
        # Called after step k's update, before the engine counts it: k + 1 steps are done.
        self._draw(batch, dynamics, int(dynamics.step_count) + 1)

    def _draw(self, batch: Batch, dynamics: Any, steps: int) -> None:
        assert self._display is not None
        done, active, atoms = run_counts(batch, dynamics)  # reads back, so the clock is honest
        now = time.perf_counter()
        elapsed = now - self._last_time
        if elapsed > 0 and steps > self._last_step:
            self.throughput = atoms * (steps - self._last_step) / elapsed
        self._last_time, self._last_step = now, steps
        if self.structures is not None:
            self._display.update(done, f"step {steps}, {active} active, {self.throughput:.3g} atom-steps/s")
        else:
            self._display.update(steps, f"{done} done, {active} active, {self.throughput:.3g} atom-steps/s")

    def on_run_end(self, batch: Batch, dynamics: Any) -> None:
        # The final state is drawn even when the run did not end on an update step.
        run = dynamics.context.run
        steps = run.steps_done if run is not None else dynamics.context.step + 1
        if self._display is not None and (steps > self._last_step or self.structures is not None):
            self._draw(batch, dynamics, steps)
        self.close()

    def close(self) -> None:
        """Finish the bar (runs call it at their end)."""
        display, self._display = self._display, None
        if display is not None:
            display.close()

    def __repr__(self) -> str:
        return f"ProgressHook(frequency={self.frequency}, backend={self.backend!r})"
