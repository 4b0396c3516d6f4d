"""A writer process for the crash tests (run as a script, not collected by pytest).

    python crash_writer.py STORE BATCH FIRST forever
    python crash_writer.py STORE BATCH FIRST kill-at KEY_PART NTH [torn]

It appends batches of ``BATCH`` systems with consecutive ids from ``FIRST`` (content derived from
each id, see ``zarr_test_helpers.structure_for``) to the store with ``ZarrData`` and prints the
committed count after each write. ``forever`` writes until killed from outside; ``kill-at`` sends
itself SIGKILL just before the NTH store write whose key contains KEY_PART, i.e. in the middle of
an append, after some of that record's objects were written; with ``torn``, after writing half of
that chunk file's bytes (to the chunk itself when it is written in place, else to its temporary
file). Chunks go through zarr's store or, for a local store's whole chunks, through
``alchemi_zarr.local_files.write_file``: both are watched.
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


def kill_at(key_part: str, nth: int, torn: bool) -> None:
    from alchemi_zarr import local_files

    original_set, original_file = zarr.storage.LocalStore.set, local_files.write_file
    seen = 0

    def is_the_one(key: str) -> bool:
        nonlocal seen
        if key_part in key:
            seen += 1
            return seen == nth
        return False

    def die(key: str) -> None:
        print(f"killing before writing {key}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    async def set_then_maybe_die(self, key, value):  # type: ignore[no-untyped-def]
        if is_the_one(key):
            die(key)
        return await original_set(self, key, value)

    def write_file_then_maybe_die(path, parts, in_place):  # type: ignore[no-untyped-def]
        if is_the_one(path):
            if torn:
                data = b"".join(bytes(p) for p in parts)
                target = path if in_place else f"{path}.torn.partial"
                with open(target, "wb") as f:
                    f.write(data[: len(data) // 2])
            die(path[path.index(key_part):])
        return original_file(path, parts, in_place)

    zarr.storage.LocalStore.set = set_then_maybe_die
    local_files.write_file = write_file_then_maybe_die


def main() -> None:
    store, size, first, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if mode == "kill-at":
        kill_at(sys.argv[5], int(sys.argv[6]), torn=sys.argv[7:8] == ["torn"])
    sink = ZarrData(store)
    next_id = first
    while True:
        sink.write(batch_for(list(range(next_id, next_id + size))))
        next_id += size
        print(len(sink), flush=True)


if __name__ == "__main__":
    main()
