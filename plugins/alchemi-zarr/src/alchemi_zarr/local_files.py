"""A local store's encoded chunks written as files, one after another, by the appending thread.

Zarr's local store writes each chunk on a worker thread of its event loop (``asyncio.to_thread``)
through a temporary file renamed over the chunk. For an append of many whole chunks that costs
more than the bytes: on a 2-core machine, W5's 8.1 MB snapshot in 29 chunks took 17.0 ms through
zarr's store and 12.4 ms written here (``python -m benchmarks.store_append --via zarr,files``): the
threads' Python work (paths, a temporary name, the rename) contends for the interpreter lock
while each write is short.

Written here, a chunk that holds committed rows (the first chunk of an append, which it shares
with the records before it) still goes through a temporary file renamed over it, so a crash
leaves either its old or its new bytes. A chunk past the committed end holds no record yet: it is
written in place, and a crash that tears it leaves bytes no reader reads (the commit does not
cover them) and the next append overwrites.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> root = Path(tempfile.mkdtemp())
    >>> write_files(root, [ChunkFile("x/c/0", [b"abc", b"d"], in_place=False)])
    >>> (root / "x/c/0").read_bytes()
    b'abcd'
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

_names = itertools.count()


@attrs.frozen
class ChunkFile:
    """One encoded chunk to write.

    Attributes:
        key: The chunk's key in the store (``group/array/c/i/j``).
        parts: Its bytes, in pieces written one after another (the data, then a checksum).
        in_place: Write the file directly; otherwise through a temporary file renamed over it.
    """

    key: str
    parts: Sequence[Any]
    in_place: bool


def local_root(store: Any) -> Path | None:
    """The folder of a writable zarr ``LocalStore``, else None (its chunks go through zarr)."""
    from zarr.storage import LocalStore

    if isinstance(store, LocalStore) and not store.read_only:
        return Path(store.root)
    return None


def write_files(root: Path, files: Sequence[ChunkFile]) -> None:
    """Write ``files`` under ``root``, creating their folders, in order."""
    folders: set[str] = set()
    for chunk in files:
        path = os.path.join(root, chunk.key)
        folder = os.path.dirname(path)
        if folder not in folders:
            os.makedirs(folder, exist_ok=True)
            folders.add(folder)
        write_file(path, chunk.parts, chunk.in_place)


def write_file(path: str, parts: Sequence[Any], in_place: bool) -> None:
    """``parts`` to ``path``: directly, or through a temporary file beside it renamed over it."""
    target = path if in_place else f"{path}.{os.getpid()}-{next(_names)}.partial"
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for part in parts:
                view = memoryview(part).cast("B")
                while len(view):
                    view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        if not in_place:
            os.replace(target, path)
    except BaseException:
        if not in_place:
            with contextlib.suppress(OSError):
                os.unlink(target)
        raise
