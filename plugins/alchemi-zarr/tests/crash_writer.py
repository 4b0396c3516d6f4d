"""A writer process for the crash tests (run as a script, not collected by pytest).

    python crash_writer.py STORE BATCH FIRST forever
    python crash_writer.py STORE BATCH FIRST kill-at KEY_PART NTH

It appends batches of ``BATCH`` systems with consecutive ids from ``FIRST`` (content derived from
each id, see ``zarr_test_helpers.structure_for``) to the store with ``ZarrData`` and prints the
committed count after each write. ``forever`` writes until killed from outside; ``kill-at`` sends
itself SIGKILL just before the NTH store write whose key contains KEY_PART, i.e. in the middle of
an append, after some of that record's objects were written.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import zarr.storage  # noqa: E402
from zarr_test_helpers import batch_for  # noqa: E402

from alchemi_zarr import ZarrData  # noqa: E402


def kill_at(key_part: str, nth: int) -> None:
    original = zarr.storage.LocalStore.set
    seen = 0

    async def set_then_maybe_die(self, key, value):  # type: ignore[no-untyped-def]
        nonlocal seen
        if key_part in key:
            seen += 1
            if seen == nth:
                print(f"killing before writing {key}", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        return await original(self, key, value)

    zarr.storage.LocalStore.set = set_then_maybe_die


def main() -> None:
    store, size, first, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if mode == "kill-at":
        kill_at(sys.argv[5], int(sys.argv[6]))
    sink = ZarrData(store)
    next_id = first
    while True:
        sink.write(batch_for(list(range(next_id, next_id + size))))
        next_id += size
        print(len(sink), flush=True)


if __name__ == "__main__":
    main()
