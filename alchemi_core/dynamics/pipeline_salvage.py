"""What a surviving pipeline rank saves, and reports, when another rank fails or dies.

A killed rank takes what it held with it; the survivors keep what *they* hold and say which
structures went with it. Each rank keeps two ledgers of ``system_id``\\ s, filled on the device
where frames move anyway and read back only after a failure: those it sent to the next rank and
those it received from the previous one. On a ``PeerError`` the rank writes its active batch and
its staged systems to its sinks, each with its status, and raises :class:`RankLostError` (see
``docs/pipelines.md``, "When a rank dies").

Example:
    >>> import torch
    >>> from alchemi_core.dynamics.pipeline_salvage import IdLedger
    >>> ledger = IdLedger(torch.device("cpu"))
    >>> ledger.record(torch.tensor([4, 7, 9]), 2)
    >>> ledger.record(torch.tensor([1]), 1)
    >>> ledger.ids()
    [4, 7, 1]
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from alchemi_core.comm.base import PeerError
from alchemi_core.dynamics.sinks import HostMemory

if TYPE_CHECKING:
    from alchemi_core.data import Batch
    from alchemi_core.dynamics.pipeline_rank import PipelineRank


class IdLedger:
    """A growing record of ``system_id``\\ s kept on the device (amortised: it doubles when full).

    Args:
        device: Where the ids live (the frames' device, so recording never reads back).
        capacity: Initial number of slots.
    """

    def __init__(self, device: torch.device, capacity: int = 256) -> None:
        self._ids = torch.empty(max(1, int(capacity)), dtype=torch.long, device=device)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def record(self, ids: torch.Tensor, n: int) -> None:
        """Append the first ``n`` entries of ``ids`` (``n`` is a host count the caller has)."""
        if n <= 0:
            return
        if self._n + n > self._ids.numel():
            grown = torch.empty(max(2 * self._ids.numel(), self._n + n), dtype=torch.long, device=self._ids.device)
            grown[: self._n] = self._ids[: self._n]
            self._ids = grown
        self._ids[self._n : self._n + n] = ids[:n].to(self._ids.device, torch.long)
        self._n += n

    def ids(self) -> list[int]:
        """Every recorded id, in order (reads back from the device: only after a failure)."""
        return [int(i) for i in self._ids[: self._n].tolist()]


def batch_ids(batch: Batch | None) -> list[int]:
    """The ``system_id``\\ s of ``batch`` (empty for None or an empty batch)."""
    if batch is None or not batch.num_graphs:
        return []
    return [int(i) for i in batch.system_id.tolist()]


class RankLostError(PeerError):
    """A surviving rank stops because rank ``peer`` failed or died; it saved what it held.

    Attributes:
        peer: The rank that failed or was lost (None when the backend could not tell).
        rank: This (surviving) rank.
        saved: ``system_id``\\ s this rank wrote to its sinks after the failure, with the status
            each had (none of them had finished the pipeline).
        held: The same systems as a ``Batch`` (None when there were none): the copy to keep
            when the rank has no sinks of its own.
        lost: On the rank just upstream of ``peer``: the systems it had sent to ``peer``, which
            went with it unless ``peer`` had passed them on or written them to a persistent sink.
            Empty on other ranks, which sent nothing to ``peer``.
        received_from_peer: On the rank just downstream of ``peer``: what it had received from
            ``peer`` (those are not lost; subtract them from the upstream rank's ``lost`` to
            narrow it down).
    """

    def __init__(
        self,
        cause: PeerError,
        rank: int,
        saved: list[int],
        held: Batch | None,
        lost: list[int],
        received_from_peer: list[int],
        where: str,
    ) -> None:
        peer = cause.peer
        who = f"rank {peer}" if peer is not None else "another rank"
        parts = [f"rank {rank} stopped because {who} failed or went away ({cause})"]
        if saved:
            parts.append(
                f"rank {rank} saved {len(saved)} unfinished structures {where}, each with its stage "
                f"status: system_id {saved}"
            )
        else:
            parts.append(f"rank {rank} held no unfinished structures")
        if peer is not None and peer == rank + 1:
            parts.append(
                f"{len(lost)} structures it had sent to rank {peer} went with it unless rank {peer} had "
                f"passed them on or written them to a persistent sink: system_id {lost}"
            )
        if peer is not None and peer == rank - 1:
            held_by_peer = (
                "what rank 0 held (its batch, its sampler's structures) is not known to the survivors"
                if peer == 0 else
                f"what rank {peer} held is known only to rank {peer - 1} (the structures it sent there, less these)"
            )
            parts.append(f"it had received system_id {received_from_peer} from rank {peer}; {held_by_peer}")
        super().__init__("; ".join(parts), peer)
        self.rank = rank
        self.saved = saved
        self.held = held
        self.lost = lost
        self.received_from_peer = received_from_peer


def salvage(rank: PipelineRank, cause: PeerError) -> RankLostError | None:
    """``save_held`` that never raises: None (and a warning) when saving failed, so the peer's
    failure is not hidden behind this one."""
    try:
        return save_held(rank, cause)
    except Exception as exc:
        warnings.warn(f"rank {rank.rank} could not save what it held: {exc!r}", stacklevel=2)
        return None


def save_held(rank: PipelineRank, cause: PeerError) -> RankLostError:
    """Write what ``rank`` holds (its active batch, systems staged in its overflow sinks)
    to its sinks, with the status each has, and say what was saved and what was lost.

    The last rank writes to its stage's sinks (or, without any, keeps them with the finished
    results in ``held``); other ranks write to their stage's sinks, which already hold their
    staged systems, or, without any, keep everything in ``held``.
    """
    engine = rank.engine
    keep = HostMemory(capacity=None)
    batch = engine.state.batch
    if batch is not None and batch.num_graphs:
        keep.write(batch)
    own = rank.overflow.own
    if own is not None and len(own):
        keep.write(own.drain())
    unfinished = batch_ids(keep.read()) if len(keep) else []
    staged = [i for s in rank.overflow.sinks if len(s) for i in batch_ids(s.read())]
    sinks = list(rank.stage.sinks)
    targets = engine.admission.sink_list() if rank.last else sinks
    leftover = keep.read() if len(keep) else None
    for sink in targets:
        if leftover is None or not leftover.num_graphs or sink.free <= 0:
            continue
        room = min(sink.free, leftover.num_graphs)
        mask = torch.zeros(leftover.num_graphs, dtype=torch.bool)
        mask[:room] = True
        sink.write(leftover, mask.to(leftover.device))
        rest = leftover.num_graphs - room
        leftover = leftover.index_select(torch.arange(room, room + rest)) if rest else None
    for sink in targets:  # a sink that buffers (files, a device) makes its records durable now
        for method in ("flush", "close"):
            if callable(getattr(sink, method, None)):
                getattr(sink, method)()
    if sinks:
        held = keep.read() if len(keep) else None
        where = "to its sinks" if leftover is None else "to its sinks as far as they had room (all in `held`)"
    else:
        held = engine.state.host_results.read() if rank.last and engine.state.host_results is not None else leftover
        where = "in the error's `held` batch (its stage has no sinks)"
    peer = cause.peer
    return RankLostError(
        cause, rank.rank, unfinished + staged, held,
        lost=rank.sent_ids.ids() if peer is not None and peer == rank.rank + 1 else [],
        received_from_peer=rank.received_ids.ids() if peer is not None and peer == rank.rank - 1 else [],
        where=where,
    )


__all__ = ["IdLedger", "RankLostError", "batch_ids", "salvage", "save_held"]
