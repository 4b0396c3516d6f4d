"""Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM (a scheduler, torchrun's agent).

While :meth:`StopRequest.installed` is active (in the main thread), the first SIGINT or SIGTERM
only records the request; the run asks :class:`StopRequest` between steps and ends after its next
check with what it finished saved. A second SIGINT stops at once (``KeyboardInterrupt``); more
SIGTERMs are taken as the first (launchers repeat them).

Example:
    >>> import os, signal
    >>> from alchemi_core.workflow.stopping import StopRequest
    >>> stop = StopRequest()
    >>> with stop.installed(quiet=True):
    ...     os.kill(os.getpid(), signal.SIGTERM)
    ...     stopped = stop()
    >>> stopped, stop.signal_name
    (True, 'SIGTERM')
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class StopRequest:
    """A callable that turns True once SIGINT or SIGTERM arrived (see the module docstring)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._quiet = False

    def __call__(self) -> bool:
        return self.signal is not None

    @property
    def signal_name(self) -> str | None:
        """``"SIGINT"`` or ``"SIGTERM"`` once one arrived, else None."""
        return None if self.signal is None else signal.Signals(self.signal).name

    @property
    def exit_code(self) -> int:
        """The exit status a shell gives a process stopped by the signal (130 for SIGINT)."""
        return 128 + (self.signal or 0)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        first = self.signal is None
        self.signal = signum if first else self.signal
        if first and not self._quiet:
            print(f"[alchemi] {signal.Signals(signum).name}: stopping after the next check and saving what is "
                  "finished (Ctrl-C again stops at once)", file=sys.stderr, flush=True)

    @contextmanager
    def installed(self, quiet: bool = False) -> Iterator[StopRequest]:
        """Handle SIGINT and SIGTERM as requests to stop while the block runs (a no-op outside
        the main thread, where Python cannot install handlers)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._quiet = quiet
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


__all__ = ["StopRequest"]
