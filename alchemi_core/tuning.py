"""The engine's measured per-device choices, as one frozen value (:class:`CoreTuning`).

A stage (an integrator, a :class:`~alchemi_core.dynamics.fused.FusedStage`) takes an optional
``tuning=``; without one its run uses :meth:`CoreTuning.for_device` of the batch's device. Every
choice gives the same results (a test runs the suites on a CPU with a GPU's choices); they differ
only in speed.

Example:
    >>> import attrs
    >>> from alchemi_core.tuning import CoreTuning
    >>> CoreTuning.for_device("cuda").run_ahead
    True
    >>> attrs.evolve(CoreTuning.for_device("cpu"), run_ahead=True).run_ahead
    True
"""

from __future__ import annotations

import ast
from typing import Any, TypeVar, cast

import attrs
import torch
from attrs import AttrsInstance

from alchemi_core.errors import ConfigurationError

T = TypeVar("T", bound=AttrsInstance)


@attrs.frozen
class CoreTuning:
    """How the engine runs a step and a check on one kind of device.

    Attributes:
        run_ahead: Checks queue the next step before their read-back where nothing the host does
            after them can change it. On for CUDA (W2 28.6 -> 25.4 ms, H100); off for CPUs.
        masks_in_step: A run's step rewrites the masks itself, at its start, on the device. On for
            CUDA with ``compile()`` (W2 25.4 -> 24.5 ms); off for CPUs.
        force_max_kernel: Each system's largest force norm at a check in a Warp kernel instead of
            torch's scatter. On for CPUs (W2 check 1.41 -> 1.27 ms) and CUDA (53 -> 20 us, H200).
    """

    run_ahead: bool
    masks_in_step: bool
    force_max_kernel: bool

    @classmethod
    def for_device(cls, device: str | torch.device) -> CoreTuning:
        """The measured choices for ``device`` (``"cuda"``, ``"cpu"``, a ``torch.device``); other
        device types get every choice off."""
        kind = cls.device_type(device)
        if kind == "cuda":
            return cls(run_ahead=True, masks_in_step=True, force_max_kernel=True)
        if kind == "cpu":
            return cls(run_ahead=False, masks_in_step=False, force_max_kernel=True)
        return cls(run_ahead=False, masks_in_step=False, force_max_kernel=False)

    @staticmethod
    def device_type(device: str | torch.device) -> str:
        """``"cuda"`` for ``"cuda:1"`` or ``torch.device("cuda", 1)``, and so on."""
        if isinstance(device, torch.device):
            return device.type
        if isinstance(device, str):
            try:
                return torch.device(device).type
            except RuntimeError as exc:
                raise ConfigurationError(f"a tuning's device must name a torch device, got {device!r}") from exc
        raise ConfigurationError(f"a tuning's device must be a str or torch.device, got {type(device).__name__}")


def check_tuning(name: str, tuning: object, kind: type) -> None:
    """Raise a ConfigurationError unless ``tuning`` is None or a ``kind`` (a component's
    ``tuning=`` argument)."""
    if tuning is not None and not isinstance(tuning, kind):
        raise ConfigurationError(
            f"{name} tuning must be a {kind.__name__} (e.g. {kind.__name__}.for_device('cuda')), "
            f"got {type(tuning).__name__}"
        )


def evolve_from_text(tuning: T, text: str) -> T:
    """``tuning`` with the settings of ``text``, ``"name=value,name=value"`` (values are Python
    literals: ``True``, ``4``, ``0.5``, ``'rows'``): what a benchmark's ``--tuning`` gives.

    Example:
        >>> evolve_from_text(CoreTuning.for_device("cpu"), "run_ahead=True, masks_in_step=True")
        CoreTuning(run_ahead=True, masks_in_step=True, force_max_kernel=True)

    Raises:
        ConfigurationError: A setting that is not ``name=value``, a name that is not a field of the
            tuning, a value that is not a literal or that the field rejects.
    """
    fields = [f.name for f in attrs.fields(type(tuning))]
    changes: dict[str, Any] = {}
    for setting in filter(None, (s.strip() for s in text.split(","))):
        name, eq, value = (part.strip() for part in setting.partition("="))
        if not eq or name not in fields:
            raise ConfigurationError(
                f"tuning setting {setting!r}: write name=value with a name among {', '.join(fields)}")
        try:
            changes[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise ConfigurationError(
                f"tuning setting {setting!r}: the value must be a Python literal (True, 4, 0.5, 'rows')") from None
    try:
        return cast(T, attrs.evolve(cast(Any, tuning), **changes))
    except (TypeError, ValueError) as exc:
        why = exc.args[0] if exc.args else exc
        raise ConfigurationError(f"tuning settings {text!r}: {why}") from None
