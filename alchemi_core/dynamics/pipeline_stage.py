"""The seed's communication methods on a stage object, delegating to the rank that runs it.

The seed documents ``_prestep_sync_buffers``, ``_complete_pending_recv``,
``_poststep_sync_buffers``, the routing methods (``_recv_to_batch``, ``_buffer_to_batch``,
``_batch_to_buffer``, ``_overflow_to_sinks``, ``_drain_sinks_to_batch``) and ``send_buffer`` /
``recv_buffer`` as members of a stage. ``BaseDynamics`` and ``FusedStage`` declare each as an
:class:`OfRank`: reading it gives the member of the same name of the ``PipelineRank`` that runs
the stage (``stage.pipeline_rank``), which keeps the state.

Example (drive the phases by hand, every rank in this process)::

    ranks = pipeline.in_process_ranks(batch)
    while not all(r.ready_to_stop() for r in ranks):
        for rank in ranks:
            stage = rank.stage
            stage._prestep_sync_buffers()
            stage._complete_pending_recv()
            rank.step()
            stage._poststep_sync_buffers()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alchemi_core.errors import ConfigurationError

if TYPE_CHECKING:
    from alchemi_core.dynamics.pipeline_rank import PipelineRank

_RAISE = object()


def rank_of(stage: Any) -> PipelineRank:
    """The rank running ``stage`` (a stage's ``pipeline_rank``).

    Raises:
        ConfigurationError: The stage is not part of a prepared ``DistributedPipeline``.
    """
    rank = stage._pipeline_rank
    if rank is None:
        raise ConfigurationError(
            f"{type(stage).__name__} is not running in a DistributedPipeline; the communication "
            "methods exist once pipeline.run() (or pipeline.in_process_ranks()) has set it up"
        )
    return rank


class OfRank:
    """A stage member that is the stage's pipeline rank's member of the same name.

    Args:
        outside: What it reads as on a stage outside a pipeline (default: ``rank_of`` raises).
    """

    def __init__(self, outside: Any = _RAISE) -> None:
        self.outside = outside
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, stage: Any, owner: type | None = None) -> Any:
        if stage is None:
            return self
        if stage._pipeline_rank is None and self.outside is not _RAISE:
            return self.outside
        return getattr(rank_of(stage), self.name)
