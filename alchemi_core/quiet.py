"""Keep Warp quiet unless asked: no banner, no CUDA-driver warning on CPU machines, no line per
kernel module loaded.

As soon as any code imports ``warp``, :func:`install` (called by ``import alchemi_core``; it
imports nothing) lowers Warp's log level to warnings and initialises it with the driver notices
filtered out of stderr. ``ALCHEMI_VERBOSE=1`` (or ``alchemi -v``) leaves Warp as it is.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

#: Native messages of Warp's CUDA probe that say only "no GPU here", or (Warp 1.5 under a CUDA 13
#: driver) that an entry point the newer driver no longer exports was not found: Warp runs on.
DRIVER_NOTICES = (
    "Could not find or load the NVIDIA CUDA driver",
    "Unable to determine CUDA driver version",
    "cuDeviceGetUuid",
    "API call is not supported in the installed CUDA driver (in function cuda_init",
)


def verbose() -> bool:
    """Whether the user asked to see everything (``ALCHEMI_VERBOSE`` set and not ``0``)."""
    return os.environ.get("ALCHEMI_VERBOSE", "") not in ("", "0")


@contextlib.contextmanager
def filtered_stderr(drop: Sequence[str]) -> Iterator[None]:
    """Capture file descriptor 2 (native code writes there too) and pass on every line that does
    not contain one of ``drop``."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (embedded interpreters): nothing to filter
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode("utf-8", "replace").splitlines(True)
                    if not any(d in ln for d in drop)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def configure(warp: Any) -> None:
    """Lower ``warp``'s log level (or set ``quiet`` on releases before 1.10) and initialise it
    without the driver notice (``warp.init()`` does nothing once Warp is initialised). Does
    nothing when verbose."""
    if verbose():
        return
    config = warp.config
    if hasattr(warp, "LOG_WARNING") and hasattr(config, "log_level"):
        if config.log_level < warp.LOG_WARNING:
            config.log_level = warp.LOG_WARNING
    else:
        config.quiet = True
    with filtered_stderr(DRIVER_NOTICES):
        warp.init()


class _WarpLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        with contextlib.suppress(Exception):  # never break an import over a log setting
            configure(module)


class _WarpFinder(importlib.abc.MetaPathFinder):
    """Finds ``warp`` through the other finders and wraps its loader (see :func:`install`)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "warp":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _WarpLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Configure Warp when it is imported (now, if it already is)."""
    if verbose():
        return
    if "warp" in sys.modules:
        with contextlib.suppress(Exception):
            configure(sys.modules["warp"])
        return
    if not any(isinstance(f, _WarpFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _WarpFinder())
