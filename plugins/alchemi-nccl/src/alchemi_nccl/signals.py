"""Out-of-band signals between pipeline ranks through the c10d rendezvous store.

The data links cannot say *why* a peer stopped, and NCCL does not notice a dead peer until its
timeout. The rendezvous store every rank is connected to carries:

- a failure record (``{"rank": r, "message": ...}`` as JSON: data, never code) that a failing
  rank writes once and waiting ranks poll;
- per-rank heartbeat counters, bumped every ``beat_s`` by a background thread, so a killed
  process is noticed within ``stale_s``;
- per-run *finished* marks, so a rank that ends early waits before tearing down a connection
  (or the store it hosts) that a peer still uses.

Every store operation is best effort: a lost store never fails a healthy run by itself.

Example::

    signals = StoreSignals(store, rank=0, world_size=2, timeout_s=60)
    signals.start()              # heartbeats in the background
    signals.beat()               # between iterations: raises if another rank failed
    signals.failure()            # None, or (rank, message)
    signals.stop()
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from alchemi_core.comm.base import PeerError

FAILURE_KEY = "alchemi/pipeline/failure"
_ALIVE = "alchemi/pipeline/alive/{rank}"
_FINISHED = "alchemi/pipeline/run{run}/finished/{rank}"
_SEEN = "alchemi/pipeline/run{run}/seen/{rank}"
#: How long the store-hosting rank lingers for the others to read the final marks, in seconds.
LINGER_S = 30.0


class StoreSignals:
    """Failure record, heartbeats and finish marks of one rank (see the module docstring).

    Args:
        store: A ``torch.distributed.Store`` shared by all ranks (None: every signal is a no-op).
        rank: This rank.
        world_size: Number of ranks.
        timeout_s: The pipeline's timeout (bounds ``stale_s``).
        beat_s: Time between two heartbeats, and between two failure checks from ``beat``.
        hosts_store: This rank hosts the store, so it leaves last.

    Attributes:
        stale_s: A peer whose heartbeat has not moved for this long is considered gone.
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        timeout_s: float,
        beat_s: float = 1.0,
        hosts_store: bool = False,
    ) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = float(timeout_s)
        self.beat_s = float(beat_s)
        self.hosts_store = hosts_store
        self.stale_s = min(self.timeout_s, max(10.0, 10 * self.beat_s))
        self._next_check = 0.0
        self._next_watch = 0.0
        self._store_lost_since: float | None = None
        self._runs = 0
        self._origin: tuple[int, str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_beat: dict[int, tuple[int, float]] = {}

    def start(self) -> None:
        """Start beating in a daemon thread (idempotent; nothing without a store)."""
        if self.store is None or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat_forever, name=f"alchemi-heartbeat-{self.rank}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.beat_s + 1.0)
        self._thread = None

    def _beat_forever(self) -> None:
        key = _ALIVE.format(rank=self.rank)
        while not self._stop.is_set():
            try:
                self.store.add(key, 1)
            except Exception:  # the store went away: nothing left to tell
                return
            self._stop.wait(self.beat_s)

    def notify(self, message: str, rank: int | None = None) -> None:
        """Record the failure of ``rank`` (default: this one; the first record wins; never raises)."""
        if self.store is None:
            return
        record = json.dumps({"rank": self.rank if rank is None else int(rank), "message": str(message)})
        try:
            if not self.store.check([FAILURE_KEY]):
                self.store.set(FAILURE_KEY, record)
        except Exception:
            pass

    def failure(self) -> tuple[int, str] | None:
        """``(rank, message)`` of a recorded failure, or None (one store round trip)."""
        if self._origin is not None:
            return self._origin
        if self.store is None:
            return None
        try:
            if not self.store.check([FAILURE_KEY]):
                return None
            record = json.loads(self.store.get(FAILURE_KEY).decode())
            self._origin = (int(record["rank"]), str(record["message"]))
        except Exception:
            return None
        return self._origin

    def raise_if_failed(self) -> None:
        """Raise a ``PeerError`` carrying a recorded failure of another rank."""
        origin = self.failure()
        if origin is not None and origin[0] != self.rank:
            raise PeerError(origin[1], origin[0])

    def beat(self) -> None:
        """Check for a recorded failure, at most once per ``beat_s`` (called between iterations).

        Raises:
            PeerError: Another rank recorded a failure.
        """
        if self.store is None:
            return
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self.beat_s
        self.raise_if_failed()

    def watch_all(self) -> None:
        """Raise if a failure is recorded or any other rank's heartbeat is stale, at most once
        per ``beat_s`` (a store lost for ``stale_s`` counts as a failure).

        Raises:
            PeerError: As ``raise_if_failed`` and ``check_alive``.
        """
        if self.store is None:
            return
        now = time.monotonic()
        if now < self._next_watch:
            return
        self._next_watch = now + self.beat_s
        self.raise_if_failed()
        try:
            for rank in range(self.world_size):
                if rank != self.rank:
                    self.check_alive(rank)
        except PeerError:
            raise
        except Exception as exc:  # the store is unreachable: its host (rank 0 or the agent) is gone?
            if self._store_lost_since is None:
                self._store_lost_since = now
            elif now - self._store_lost_since > self.stale_s:
                raise PeerError(f"lost the rendezvous store for {self.stale_s:g} s ({exc}); the process "
                                "hosting it (rank 0, or torchrun's agent) is gone") from None
        else:
            self._store_lost_since = None

    def check_alive(self, rank: int) -> None:
        """Raise when ``rank``'s heartbeat has not moved for ``stale_s`` (the first call only
        starts the clock).

        Raises:
            PeerError: The rank's process is gone.
        """
        if self.store is None:
            return
        count = int(self.store.add(_ALIVE.format(rank=rank), 0))
        now = time.monotonic()
        seen = self._last_beat.get(rank)
        if seen is None or seen[0] != count:
            self._last_beat[rank] = (count, now)
        elif now - seen[1] > self.stale_s:
            raise PeerError(
                f"rank {rank} stopped answering: no heartbeat for {self.stale_s:g} s (its process is gone; see its log)",
                rank,
            )

    def watch(self, peer: int | None) -> None:
        """While waiting on ``peer``: raise if a failure is recorded or the peer's heartbeat is
        stale (store errors are ignored: timeouts remain the rule).

        Raises:
            PeerError: As ``raise_if_failed`` and ``check_alive``.
        """
        self.raise_if_failed()
        if peer is None:
            return
        try:
            self.check_alive(peer)
        except PeerError:
            raise
        except Exception:
            pass

    def finish(self) -> None:
        """Mark this run finished here and return when every rank has.

        Raises:
            PeerError: A peer recorded a failure, or its heartbeat stopped for ``stale_s``.
        """
        if self.store is None:
            return
        self._runs += 1
        run = self._runs
        try:
            self.store.set(_FINISHED.format(run=run, rank=self.rank), "1")
        except Exception:
            return
        pending = set(range(self.world_size)) - {self.rank}
        delay = 0.01
        while pending:
            try:
                pending = {r for r in pending if not self.store.check([_FINISHED.format(run=run, rank=r)])}
                if not pending:
                    break
                self.raise_if_failed()
                for r in pending:
                    self.check_alive(r)
            except PeerError:
                raise
            except Exception as exc:  # the store went away: nobody can be waited for
                raise PeerError(f"lost the rendezvous store while waiting for the other ranks ({exc})") from None
            time.sleep(delay)
            delay = min(0.5, delay * 2)
        self._linger(run)

    def _linger(self, run: int) -> None:
        """Let the store's host leave last, once every rank has read the finish marks."""
        try:
            self.store.set(_SEEN.format(run=run, rank=self.rank), "1")
            if not self.hosts_store:
                return
            keys = [_SEEN.format(run=run, rank=r) for r in range(self.world_size)]
            deadline = time.monotonic() + LINGER_S
            while time.monotonic() < deadline and not self.store.check(keys):
                time.sleep(0.01)
        except Exception:
            pass
