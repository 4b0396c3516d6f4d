"""Staging slots in memory shared with the writer process: snapshots are copied once, there.

A snapshot sent through a pipe is copied three more times. Here each staging slot is an
anonymous shared-memory file (``memfd``) that both processes map: the device-to-host copy lands
in it (page-locked with ``cudaHostRegister`` for a GPU source, so it stays non-blocking), only a
header goes through the pipe, and the slot is given back when the writer answers for the job.
The writer is handed the files at its start, so it can commit what it received after its parent
died. Linux only (``os.memfd_create``); elsewhere snapshots go through the pipe.

Example:
    >>> import torch
    >>> if shared_staging_available():
    ...     slot = SharedSlot(0)
    ...     slot.reserve(24, pinned=False)
    ...     x = slot.buffer("x", torch.zeros(2, 3)).copy_(torch.ones(2, 3))
    ...     print(slot.layout_of(x), slot.size >= 24)
    ...     slot.close()
    (0, 24) True
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np
import torch

from alchemi_core.data.staging import StagingSlot

_ALIGN = 64


def shared_staging_available() -> bool:
    return hasattr(os, "memfd_create")


class SharedSlot(StagingSlot):
    """One staging slot in a shared-memory file (see the module docstring)."""

    __slots__ = ("index", "fd", "size", "_map", "_region", "_registered", "_pin_tried", "_offset")

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        # Close-on-exec: only the writer process, which is handed it explicitly, inherits it.
        self.fd = os.memfd_create(f"alchemi-zarr-staging-{index}", os.MFD_CLOEXEC)
        self.size = 0
        self._map: mmap.mmap | None = None
        self._region: torch.Tensor | None = None
        self._registered = False
        self._pin_tried = False
        self._offset = 0

    def reserve(self, nbytes: int, pinned: bool) -> None:
        need = nbytes + _ALIGN * 64  # room for aligning every field
        if need > self.size:
            self._remap(max(need, self.size + self.size // 4), pinned)
        elif pinned and not self._pin_tried:
            self._remap(self.size, pinned)
        self._offset = 0

    def buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
        assert self._region is not None, "reserve() comes first"
        nbytes = like.numel() * like.element_size()
        start = -(-self._offset // _ALIGN) * _ALIGN
        if start + nbytes > self.size:
            raise RuntimeError(f"staging slot {self.index}: {name} does not fit; reserve() was given too few bytes")
        self._offset = start + nbytes
        return self._region[start : start + nbytes].view(like.dtype).view(like.shape)

    def layout_of(self, array: Any) -> tuple[int, int] | None:
        """``(offset, nbytes)`` of ``array`` (numpy or tensor) in this slot, or None when its
        memory lies elsewhere (e.g. indices shifted into a new array)."""
        if self._region is None:
            return None
        if isinstance(array, torch.Tensor):
            ptr, nbytes = array.data_ptr(), array.numel() * array.element_size()
            contiguous = array.is_contiguous()
        else:
            ptr, nbytes = array.__array_interface__["data"][0], array.nbytes
            contiguous = array.flags.c_contiguous
        base = self._region.data_ptr()
        if not contiguous or not base <= ptr or ptr + nbytes > base + self.size:
            return None
        return ptr - base, nbytes

    @property
    def nbytes(self) -> int:
        return self.size

    def _remap(self, size: int, pinned: bool) -> None:
        self._unmap()
        os.ftruncate(self.fd, size)
        self.size = size
        self._map = mmap.mmap(self.fd, size)
        self._region = torch.frombuffer(self._map, dtype=torch.uint8)
        self._pin_tried = pinned
        if pinned and torch.cuda.is_available():
            # Page-locked for asynchronous copies; if the driver refuses, copies are synchronous.
            code = torch.cuda.cudart().cudaHostRegister(self._region.data_ptr(), size, 0)
            self._registered = int(code) == 0

    def _unmap(self) -> None:
        if self._registered and self._region is not None:
            torch.cuda.cudart().cudaHostUnregister(self._region.data_ptr())
        self._registered = False
        self._region = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view still exists somewhere; the mapping goes with it
                pass
            self._map = None

    def close(self) -> None:
        self._unmap()
        try:
            os.close(self.fd)
        except OSError:
            pass


class SlotMaps:
    """The writer process's side: the slots' files mapped (again when they grew)."""

    def __init__(self, fds: list[int]) -> None:
        self._fds = fds
        self._maps: dict[int, mmap.mmap] = {}

    def array(self, slot: int, size: int, offset: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        m = self._maps.get(slot)
        if m is None or len(m) < size:
            m = self._maps[slot] = mmap.mmap(self._fds[slot], size)
        count = int(np.prod(shape)) if shape else 1
        return np.frombuffer(m, dtype=np.dtype(dtype), count=count, offset=offset).reshape(shape)
