"""The seed's communication methods on a stage object, delegating to the rank that runs it.

The seed documents ``_prestep_sync_buffers``, ``_complete_pending_recv``,
``_poststep_sync_buffers`` and the routing methods (``_recv_to_batch``, ``_buffer_to_batch``,
``_batch_to_buffer``, ``_overflow_to_sinks``, ``_drain_sinks_to_batch``) as methods of a stage.
``BaseDynamics`` and ``FusedStage`` inherit them from :class:`PipelineStageMixin`; each call goes
to the ``PipelineRank`` that runs the stage (``stage.pipeline_rank``), which keeps the state.

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

from collections.abc import Sequence
from typing import TYPE_CHECKING

from alchemi_core.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from alchemi_core.data import Batch
    from alchemi_core.dynamics.pipeline_rank import PipelineRank


class PipelineStageMixin:
    """Pipeline communication methods of a stage (see the module docstring)."""

    _pipeline_rank: PipelineRank | None = None

    @property
    def pipeline_rank(self) -> PipelineRank:
        """The rank running this stage.

        Raises:
            ConfigurationError: The stage is not part of a prepared ``DistributedPipeline``.
        """
        rank = self._pipeline_rank
        if rank is None:
            raise ConfigurationError(
                f"{type(self).__name__} is not running in a DistributedPipeline; the communication "
                "methods exist once pipeline.run() (or pipeline.in_process_ranks()) has set it up"
            )
        return rank

    @property
    def send_buffer(self) -> Batch | None:
        """The send frame's batch (None before setup or on the last rank)."""
        return self._pipeline_rank.send_buffer if self._pipeline_rank is not None else None

    @property
    def recv_buffer(self) -> Batch | None:
        """The receive frame's batch (None before setup or on the first rank)."""
        return self._pipeline_rank.recv_buffer if self._pipeline_rank is not None else None

    def _prestep_sync_buffers(self) -> None:
        self.pipeline_rank._prestep_sync_buffers()

    def _complete_pending_recv(self) -> None:
        self.pipeline_rank._complete_pending_recv()

    def _poststep_sync_buffers(self, converged_indices: torch.Tensor | Sequence[int] | None = None) -> None:
        self.pipeline_rank._poststep_sync_buffers(converged_indices)

    def _recv_to_batch(self, incoming: Batch) -> None:
        self.pipeline_rank._recv_to_batch(incoming)

    def _buffer_to_batch(self, incoming: Batch) -> None:
        self.pipeline_rank._buffer_to_batch(incoming)

    def _batch_to_buffer(self, mask: torch.Tensor) -> int:
        return self.pipeline_rank._batch_to_buffer(mask)

    def _overflow_to_sinks(self, batch: Batch, mask: torch.Tensor | None = None) -> None:
        self.pipeline_rank._overflow_to_sinks(batch, mask)

    def _drain_sinks_to_batch(self) -> None:
        self.pipeline_rank._drain_sinks_to_batch()
