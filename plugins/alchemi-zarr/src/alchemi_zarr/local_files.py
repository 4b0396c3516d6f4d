"""A local store's encoded chunks written as files by a few threads of this module.

Zarr's local store spends an asyncio task and its Python work per chunk, contending for the
interpreter lock; here plain writes on a few threads overlap (``python -m tools.store_append
--via zarr,files`` compares both). A chunk that holds committed rows goes through a temporary
file renamed over it, so a crash leaves its old or its new bytes; a chunk past the committed
end holds no record yet and is written in place (a torn one is never read, and overwritten).

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
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from alchemi_zarr.stores import local_folder

#: Threads that write an append's chunk files (the appending thread is one of them).
FILE_THREADS = 4
_names = itertools.count()
_executor: ThreadPoolExecutor | None = None
_executor_key = (-1, 0)
_executor_lock = threading.Lock()


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
        return local_folder(store)
    return None


def write_files(root: Path, files: Sequence[ChunkFile], threads: int | None = None) -> None:
    """Write ``files`` under ``root``, creating their folders first; on ``threads`` threads
    (default :data:`FILE_THREADS`), each taking every ``threads``-th file, all finished (or the
    first error raised) before it returns."""
    folders: set[str] = set()
    paths = []
    for chunk in files:
        path = os.path.join(root, chunk.key)
        folder = os.path.dirname(path)
        if folder not in folders:
            os.makedirs(folder, exist_ok=True)
            folders.add(folder)
        paths.append(path)
    threads = min(FILE_THREADS if threads is None else threads, len(files))

    def write_share(first: int) -> None:
        for i in range(first, len(files), max(threads, 1)):
            write_file(paths[i], files[i].parts, files[i].in_place)

    if threads <= 1:
        write_share(0)
        return
    futures = [_pool(threads - 1).submit(write_share, k) for k in range(1, threads)]
    try:
        write_share(0)
    finally:
        for future in futures:  # every share finishes before any error is raised
            future.exception()
    for future in futures:
        future.result()


def _pool(workers: int) -> ThreadPoolExecutor:
    """This process's file writers, at least ``workers`` of them (a forked child makes its own)."""
    global _executor, _executor_key
    with _executor_lock:
        pid, size = _executor_key
        if _executor is None or pid != os.getpid() or size < workers:
            _executor = ThreadPoolExecutor(workers, thread_name_prefix="alchemi-zarr-files")
            _executor_key = (os.getpid(), workers)
        return _executor


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
