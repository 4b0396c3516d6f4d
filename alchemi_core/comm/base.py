"""The communication-backend interface ``DistributedPipeline`` uses between ranks.

A backend moves contiguous tensors point to point (``isend_tensor``/``irecv_tensor``, matched in
order per pair of ranks), reduces small integers over all ranks, and carries failure signals
(:meth:`CommBackend.notify_failure`, :meth:`CommBackend.peer_failure`), so a waiting rank stops
with the failed rank's message rather than a timeout. Implementations: ``comm:inprocess`` here,
``comm:gloo`` and ``comm:nccl`` in ``alchemi-nccl``.

Example (two ranks as threads of one process)::

    from alchemi_core.comm.inprocess import InProcessBackend
    rank0, rank1 = InProcessBackend.group(world_size=2)
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from alchemi_core.errors import PipelineError


class PeerError(PipelineError):
    """This rank stops because another rank failed or went away.

    Attributes:
        peer: The rank that failed or was lost, when known.
    """

    def __init__(self, message: str, peer: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer


class Work(ABC):
    """A pending transfer."""

    @abstractmethod
    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the transfer completed.

        Args:
            timeout_s: Give up after this long (default: the backend's timeout). A transfer
                that timed out leaves the link unusable; only failure handling passes one.

        Raises:
            PeerError: The peer failed or went away, or the timeout passed.
        """

    def done(self) -> bool:
        """Whether ``wait()`` would return at once (never blocks; a failed transfer counts as
        done, and ``wait()`` then raises). The default knows nothing and says False."""
        return False


class DoneWork(Work):
    """A transfer that already completed."""

    def wait(self, timeout_s: float | None = None) -> None:
        return None

    def done(self) -> bool:
        return True


class CommBackend(ABC):
    """Point-to-point transport between the ranks of a pipeline, plus flag reductions and
    failure signalling.

    Subclasses implement the abstract members; the failure and lifecycle methods have working
    defaults for transports without an out-of-band channel.
    """

    name = "base"

    @property
    @abstractmethod
    def rank(self) -> int:
        """This process's rank, 0..world_size-1."""

    @property
    @abstractmethod
    def world_size(self) -> int:
        """Number of ranks."""

    @property
    def device(self) -> torch.device:
        """The device tensors must be on for this backend."""
        return torch.device("cpu")

    def init(self) -> None:
        """Join the group (idempotent)."""

    def shutdown(self) -> None:
        """Leave the group after a normal end."""

    def abort(self) -> None:
        """Leave the group after a failure, without waiting on peers (default: ``shutdown``)."""
        self.shutdown()

    @abstractmethod
    def isend_tensor(self, tensor: torch.Tensor, dst: int) -> Work:
        """Start sending a contiguous tensor to ``dst``; the tensor must not change until the
        returned work completed."""

    @abstractmethod
    def irecv_tensor(self, tensor: torch.Tensor, src: int) -> Work:
        """Start receiving into a contiguous tensor (same dtype and size as sent) from ``src``."""

    @abstractmethod
    def all_reduce_max(self, value: int) -> int:
        """The largest ``value`` over all ranks (blocks until every rank calls it)."""

    def all_reduce_sum(self, value: int) -> int:
        """The sum of ``value`` over all ranks (blocks until every rank calls it)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement all_reduce_sum")

    @abstractmethod
    def barrier(self) -> None:
        """Wait for every rank."""

    # ------------------------------------------------------------------ failure signalling
    def notify_failure(self, message: str, rank: int | None = None) -> None:
        """Tell every rank that ``rank`` (default: this one) failed with ``message``, unless a
        failure is already recorded (best effort, never raises). A rank that stops because it
        lost a peer passes the peer, so the others learn which rank is gone."""

    def peer_failure(self) -> str | None:
        """The message of a rank that reported a failure, or None (cheap; never raises)."""
        return None

    def heartbeat(self) -> None:
        """Say this rank is alive (called between iterations; must be cheap)."""

    def check_peers(self) -> None:
        """Raise when another rank recorded a failure or its process is gone. Called often by
        ranks that never wait on a peer (data parallel: each rank runs on its own), so it must
        be cheap; implementations look at most about once per heartbeat period.

        Raises:
            PeerError: A peer failed (its message) or stopped answering (the lost rank).
        """
        self.heartbeat()
        message = self.peer_failure()
        if message is not None:
            raise PeerError(message)

    def finish(self) -> None:
        """Called once by a rank that ended normally: return when every rank has finished, so
        no rank tears down a connection a peer still uses.

        Raises:
            PipelineError: A peer failed or stopped answering meanwhile.
        """
