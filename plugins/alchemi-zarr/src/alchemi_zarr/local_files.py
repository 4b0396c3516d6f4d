"""A local store's encoded chunks written as files by a few threads of this module.

Zarr's local store writes each chunk on a worker thread of its event loop (``asyncio.to_thread``,
one task per chunk) through a temporary file renamed over the chunk. For an append of many whole
chunks that costs more than the bytes: the tasks' Python work (paths, a temporary name, the
rename, the loop's bookkeeping) contends for the interpreter lock while each write is short.
W5's 8.1 MB snapshot in 29 chunks on a 2-core machine (``python -m benchmarks.store_append
--chunk-kib 512 --via zarr,files --file-threads 1,2,4 --rounds 4``, medians of four rounds): in
``/dev/shm`` 18.4 ms through zarr's store, 11.0 written here by one thread, 9.0 by two and 9.7 by
four; on its disk 21.9, 17.8, 14.4 and 14.7 ms. A write into the page cache is short, but under
writeback it blocks, and threads overlap that: four is the default, for machines with more cores.

A chunk that holds committed rows (the first chunk of an append, which it shares with the
records before it) goes through a temporary file renamed over it, so a crash leaves either its
old or its new bytes. A chunk past the committed end holds no record yet: it is written in
place, and a crash that tears it leaves bytes no reader reads (the commit does not cover them)
and the next append overwrites.

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

#: Threads that write an append's chunk files (the appending thread is one of them). A write
#: into the page cache is short, but on a disk under writeback it blocks; threads overlap that.
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
    """This process's file writers, at least ``workers`` of them (a forked child makes its own:
    threads do not fork). Made again only to grow, so appends of few chunks do not churn it."""
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
