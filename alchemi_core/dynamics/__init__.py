"""The dynamics engine: stages, hooks, convergence, fused stages, pipelines, samplers and sinks.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics, ConvergenceHook
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> dynamics = DemoDynamics(model=DemoModelWrapper(), n_steps=1000, dt=0.5,
    ...                         convergence_hook=ConvergenceHook.from_fmax(threshold=0.05))

Names that plugins provide (``GPUBuffer`` from ``alchemi-warp``, ``ZarrData`` from
``alchemi-zarr``) import from here too when the plugin is installed; without it, the import
error names the distribution to install.
"""

from __future__ import annotations

from typing import Any

from alchemi_core.dynamics import hooks
from alchemi_core.dynamics.base import BaseDynamics, BufferConfig
from alchemi_core.dynamics.context import StepContext
from alchemi_core.dynamics.convergence import ConvergenceHook, Criterion
from alchemi_core.dynamics.demo import DemoDynamics
from alchemi_core.dynamics.fused import FusedStage
from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.pipeline import DistributedPipeline
from alchemi_core.dynamics.sampler import SizeAwareSampler
from alchemi_core.dynamics.sinks import DataSink, HostMemory
from alchemi_core.dynamics.stage import DynamicsStage

__all__ = [
    "BaseDynamics",
    "BufferConfig",
    "ConvergenceHook",
    "Criterion",
    "DataSink",
    "DemoDynamics",
    "DistributedPipeline",
    "DynamicsStage",
    "FusedStage",
    "Hook",
    "HostMemory",
    "SizeAwareSampler",
    "StepContext",
    "hooks",
]


def __getattr__(name: str) -> Any:
    from alchemi_core.registry import resolve_export

    return resolve_export(__name__, name)
