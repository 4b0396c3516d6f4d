"""Tensors seen as rows of the widest integer words that fit, so one copy kernel serves every
dtype, bit-identical.

Example:
    >>> import torch
    >>> from alchemi_warp.words import as_words, word_bytes_for
    >>> t = torch.zeros(4, 3, dtype=torch.float64)
    >>> word_bytes_for(t)
    8
    >>> as_words(t, 8).shape, as_words(t, 8).dtype
    (torch.Size([4, 3]), torch.int64)
    >>> as_words(torch.zeros(5, 3, dtype=torch.bool), 1).shape
    torch.Size([5, 3])
"""

from __future__ import annotations

import math

import torch

#: Integer dtypes used as words, by size in bytes. All are accepted by ``wp.from_torch``.
WORD_DTYPES: dict[int, torch.dtype] = {
    8: torch.int64,
    4: torch.int32,
    2: torch.int16,
    1: torch.int8,
}


def row_bytes(t: torch.Tensor) -> int:
    """Bytes in one row (all dimensions after the first) of ``t``."""
    return math.prod(t.shape[1:]) * t.element_size()


def word_bytes_for(*tensors: torch.Tensor) -> int:
    """The widest word size that divides the (shared) row size and the byte offset of every tensor.

    Example:
        >>> word_bytes_for(torch.zeros(2, 3, dtype=torch.bool))  # 3-byte rows
        1
    """
    size = row_bytes(tensors[0])
    for width in (8, 4, 2):
        if size % width == 0 and all(t.storage_offset() * t.element_size() % width == 0 for t in tensors):
            return width
    return 1


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 2-D ``[N, elements per row]`` view (also when N is 0)."""
    return t.reshape(t.shape[0], math.prod(t.shape[1:]))


def as_words(t: torch.Tensor, width: int) -> torch.Tensor:
    """A ``[N, row_bytes // width]`` integer view of the contiguous tensor ``t`` (no copy).

    Args:
        t: A contiguous tensor with at least one dimension.
        width: Word size in bytes, from :func:`word_bytes_for`.
    """
    # Through int8: torch regroups bytes only from a 1-byte view, and not every Warp takes bool.
    return as_rows(t).view(torch.int8).view(WORD_DTYPES[width])


def as_flat_words(t: torch.Tensor) -> torch.Tensor:
    """The whole contiguous tensor ``t`` as a 1-D run of the widest fitting words."""
    whole = t.reshape(1, t.numel())
    return as_words(whole, word_bytes_for(whole))[0]
