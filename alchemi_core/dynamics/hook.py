"""Hooks: plain callables the engine runs at a point of every N-th step.

A hook has a ``stage`` (a :class:`DynamicsStage`), a ``frequency`` (run when the step index is a
multiple of it) and is called as ``hook(batch, dynamics)``; ``dynamics`` is the stage the hook
belongs to, whose ``system_mask`` says which systems that stage integrates (None: all). Optional
``on_run_start(batch, dynamics)`` and ``on_run_end(batch, dynamics)`` run once per run (open and
close files there, not per step). A hook that acts at several points (freeze atoms before the
integrator and after the forward; time every phase of a step) lists them in ``parts``: hooks with
their own ``stage`` and ``frequency`` that the engine schedules in its place, while the lifecycle
methods stay on the outer hook.

Each run builds, once, per point, a tuple of ``(frequency, hook, stage)`` entries
(:func:`build_hook_table`; the stage held weakly, see ``alchemi_core.dynamics.weak``), so an
empty point costs nothing; :func:`dispatch` is the one place that calls hooks.

Example:
    >>> from alchemi_core.dynamics import Hook, DynamicsStage
    >>> class CountSteps(Hook):
    ...     stage = DynamicsStage.AFTER_STEP
    ...     def __init__(self):
    ...         super().__init__(frequency=1)
    ...         self.count = 0
    ...     def __call__(self, batch, dynamics):
    ...         self.count += 1
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.dynamics.weak import alive, ref_to
from alchemi_core.errors import ConfigurationError

if TYPE_CHECKING:
    from alchemi_core.data import Batch


class Hook:
    """Base class for hooks: set ``stage`` (class attribute or argument) and implement ``__call__``.

    Args:
        frequency: Run at steps whose index is a multiple of this (1 = every step).
        stage: Override the class's hook point.
    """

    stage: DynamicsStage = DynamicsStage.AFTER_STEP
    #: The hook reads ``batch.stress``: a run holding it asks the model for stress, as it does
    #: for a stage that needs it (NPT, cell filters).
    needs_stress: bool = False

    def __init__(self, frequency: int = 1, stage: DynamicsStage | None = None) -> None:
        from alchemi_core.validation import whole_number

        self.frequency = whole_number(f"{type(self).__name__} frequency", frequency, minimum=1)
        if stage is not None:
            self.stage = DynamicsStage(stage)

    def __call__(self, batch: Batch, dynamics: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(batch, dynamics)")

    def on_run_start(self, batch: Batch, dynamics: Any) -> None:
        """Called once when a run starts."""

    def on_run_end(self, batch: Batch, dynamics: Any) -> None:
        """Called once when a run ends (also after an error)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(stage={self.stage.name}, frequency={self.frequency})"


def hook_parts(hook: Any) -> tuple[Any, ...]:
    """What the engine schedules for ``hook``: its ``parts`` when it has any, else the hook itself."""
    parts = getattr(hook, "parts", None)
    return tuple(parts) if parts else (hook,)


def check_hook(hook: Any) -> None:
    """Reject an object that cannot serve as a hook (or a part of one), saying what it lacks."""
    parts = getattr(hook, "parts", None)
    if parts:
        for part in parts:
            check_hook(part)
        return
    missing = [a for a in ("stage", "frequency") if not hasattr(hook, a)]
    if missing or not callable(hook):
        what = ", ".join(missing) if missing else "__call__(batch, dynamics)"
        raise ConfigurationError(
            f"{hook!r} is not a hook: it lacks {what}. Subclass alchemi_core.dynamics.Hook"
        )
    try:
        DynamicsStage(hook.stage)
    except ValueError:
        raise ConfigurationError(f"{hook!r} has stage {hook.stage!r}, not a DynamicsStage") from None
    if int(hook.frequency) < 1:
        raise ConfigurationError(f"{hook!r} has frequency {hook.frequency}; it must be >= 1")


#: One hook point's entries: ``(frequency, hook, reference to the stage the hook belongs to)``;
#: calling the reference gives the stage.
HookEntries = tuple[tuple[int, Any, Callable[[], Any]], ...]
#: Per hook point (indexed by ``DynamicsStage`` members), its entries.
HookTable = tuple[HookEntries, ...]


def build_hook_table(owners: Iterable[tuple[Any, Iterable[Any]]]) -> HookTable:
    """Per hook point, the ``(frequency, hook, stage reference)`` entries, in registration order."""
    points: list[list[tuple[int, Any, Callable[[], Any]]]] = [[] for _ in DynamicsStage]
    for stage, hooks in owners:
        ref = ref_to(stage)
        for hook in hooks:
            for part in hook_parts(hook):
                points[int(part.stage)].append((int(part.frequency), part, ref))
    return tuple(tuple(p) for p in points)


def dispatch(entries: HookEntries, batch: Batch | None, step: int) -> None:
    """Call every hook of ``entries`` whose frequency divides ``step``, in order.

    Example:
        >>> calls = []
        >>> class Note(Hook):
        ...     def __call__(self, batch, dynamics):
        ...         calls.append(dynamics)
        >>> table = build_hook_table([("md", [Note(frequency=2)])])
        >>> for k in range(4):
        ...     dispatch(table[DynamicsStage.AFTER_STEP], None, k)
        >>> calls
        ['md', 'md']
    """
    for freq, hook, stage in entries:
        if step % freq == 0:
            hook(batch, alive(stage, "stage"))
