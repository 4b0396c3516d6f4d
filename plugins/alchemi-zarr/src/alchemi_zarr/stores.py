"""Turn what a user passes as ``store`` (a path, an fsspec URL, a dict, a zarr store) into a zarr
store, and serialise writers of one store.

Local paths and ``file://`` URLs become a ``zarr.storage.LocalStore``, whose writes replace each
file atomically (zarr >= 3.1.3); other URLs go through fsspec, whose object stores put whole
objects. Writers append under :func:`writer_lock`: an advisory ``flock`` on a local store's
directory (a killed process releases it) and an in-process lock for every store. Remote stores
have no cross-process lock: keep to one writing process per remote store.

Example:
    >>> store, where, lock_path = resolve_store("memory://doc-example", read_only=False)
    >>> type(store).__name__, where, lock_path
    ('FsspecStore', 'memory://doc-example', None)
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alchemi_core.errors import InvalidDataError, MissingDependencyError

_process_locks: dict[str, threading.Lock] = {}
_process_locks_guard = threading.Lock()


def resolve_store(
    store: Any, read_only: bool, storage_options: dict[str, Any] | None = None
) -> tuple[Any, str, Path | None]:
    """The zarr store for ``store``, a name for messages, and the lock path of a local store.

    Args:
        store: A local path (``str`` or ``Path``), an fsspec URL (``memory://``, ``file://``,
            ``s3://`` with ``alchemi-zarr[s3]``), a ``dict`` (in-memory), or a zarr store object.
        read_only: Open for reading only.
        storage_options: Passed to fsspec for URLs (credentials, endpoints).

    Raises:
        MissingDependencyError: The URL's protocol needs a package that is not installed.
        InvalidDataError: ``store`` is none of the above.
    """
    from zarr.abc.store import Store
    from zarr.storage import FsspecStore, LocalStore, MemoryStore

    if isinstance(store, Store):
        return store, repr(store), local_folder(store)
    if isinstance(store, dict):
        return MemoryStore(store, read_only=read_only), f"dict store {id(store):#x}", None
    if isinstance(store, os.PathLike):
        store = os.fspath(store)
    if not isinstance(store, str):
        raise InvalidDataError(
            f"store must be a path, an fsspec URL, a dict or a zarr store, got {type(store).__name__}"
        )
    if store.startswith("file://"):
        store = store[len("file://") :]
    if "://" not in store:
        path = Path(store).expanduser().absolute()
        if read_only and not path.exists():
            raise InvalidDataError(f"no store at {path}: the path does not exist")
        return LocalStore(path, read_only=read_only), str(path), path
    try:
        fs_store = FsspecStore.from_url(store, storage_options=storage_options, read_only=read_only)
    except ImportError as exc:
        protocol = store.split("://", 1)[0]
        extra = "alchemi-zarr[s3]" if protocol in ("s3", "s3a") else f"the fsspec backend for {protocol}://"
        raise MissingDependencyError(f"opening {store} needs a package that is missing ({exc}): pip install {extra}") from exc
    return fs_store, store, None


def local_folder(store: Any) -> Path | None:
    """The folder of a zarr ``LocalStore`` (its lock path, and where its chunk files lie), else None."""
    root = getattr(store, "root", None)
    return Path(root) if type(store).__name__ == "LocalStore" and root is not None else None


@contextlib.contextmanager
def writer_lock(key: str, lock_path: Path | None) -> Iterator[None]:
    """Hold the store's writer lock: the in-process lock for ``key`` and, for a local store, an
    exclusive ``flock`` on its directory ``lock_path`` (no lock file that zarr would not know)."""
    with _process_locks_guard:
        lock = _process_locks.setdefault(key, threading.Lock())
    with lock:
        if lock_path is None:
            yield
            return
        lock_path.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDONLY)
        try:
            _flock(fd)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock


def _flock(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the in-process lock is all there is
        return
    fcntl.flock(fd, fcntl.LOCK_EX)
