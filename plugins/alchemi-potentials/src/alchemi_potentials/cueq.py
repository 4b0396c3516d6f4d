"""cuEquivariance, NVIDIA's fused kernels for e3nn-style networks: is it here, is a network on it,
and when to convert (:class:`KernelChoice`), for alchemi-mace and alchemi-sevennet.

Example:
    >>> import torch
    >>> runs_on_cueq(torch.nn.Linear(2, 2))
    False
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from alchemi_core.errors import MissingDependencyError


def missing_cueq(who: str) -> MissingDependencyError | None:
    """The error for ``enable_cueq=True`` when cuequivariance-torch is not installed, else None.

    Example:
        >>> error = missing_cueq("model:mace")   # None where cuequivariance-torch is installed
    """
    if importlib.util.find_spec("cuequivariance_torch") is not None:
        return None
    return MissingDependencyError(
        f"{who}: enable_cueq=True needs cuequivariance: pip install cuequivariance-torch "
        "cuequivariance-ops-torch-cu12 (or -cu13, matching your CUDA)"
    )


@functools.cache
def cueq_kernels_installed() -> bool:
    """Whether cuequivariance-torch and its CUDA kernels (cuequivariance-ops-torch) import."""
    if any(importlib.util.find_spec(m) is None for m in ("cuequivariance_torch", "cuequivariance_ops_torch")):
        return False
    try:
        import cuequivariance_ops_torch  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means no kernels
        return False
    return True


def runs_on_cueq(network: torch.nn.Module) -> bool:
    """Whether any layer of ``network`` is one of cuequivariance-torch's."""
    return any(type(m).__module__.startswith("cuequivariance_torch") for m in network.modules())


class KernelChoice:
    """Whether a model's network runs on cuEquivariance's kernels, settled at its first call.

    Args:
        asked: The model's ``enable_cueq``. True: convert on any device. False: never. None: on
            a GPU where the CUDA kernels import.

    Example:
        >>> choice = KernelChoice(None)
        >>> choice.settle(torch.device("cpu"))
        False
        >>> choice.decided, choice.converted
        (True, False)
    """

    def __init__(self, asked: bool | None) -> None:
        self.asked = asked
        self.decided = False
        #: Whether the network did convert; the model sets it after its converter ran.
        self.converted = False

    def expected(self) -> bool:
        """Whether the network runs, or will run, on the kernels."""
        if self.decided:
            return self.converted
        if self.asked is None:
            return torch.cuda.is_available() and cueq_kernels_installed()
        return self.asked

    def settle(self, device: torch.device) -> bool:
        """At a call on ``device``: whether to convert now (True at most once, at the first call)."""
        if self.decided:
            return False
        self.decided = True
        if self.asked is None:
            return device.type == "cuda" and cueq_kernels_installed()
        return self.asked
