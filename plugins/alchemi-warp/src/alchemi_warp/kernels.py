"""Warp kernels for row copies on integer words (:mod:`alchemi_warp.words`): one overload per word
size covers every dtype and trailing shape. Importing it imports Warp.
"""

from __future__ import annotations

from typing import Any

import warp as wp

wp.set_module_options({"enable_backward": False})

#: The Warp word type for each word size in bytes (matching ``words.WORD_DTYPES``).
WARP_WORDS: dict[int, Any] = {8: wp.int64, 4: wp.int32, 2: wp.int16, 1: wp.int8}


@wp.kernel
def gather_rows(src: wp.array2d(dtype=Any), index: wp.array(dtype=wp.int64), out: wp.array2d(dtype=Any)):
    """``out[i, j] = src[index[i], j]``; one thread per destination word."""
    i, j = wp.tid()
    out[i, j] = src[int(index[i]), j]


@wp.kernel
def gather_rows_shifted(
    src: wp.array2d(dtype=Any), index: wp.array(dtype=wp.int64), shift: wp.array(dtype=Any), out: wp.array2d(dtype=Any)
):
    """``out[i, j] = src[index[i], j] + shift[i]``: atom indices (neighbour lists) moved to their
    new offsets in the same pass as the copy."""
    i, j = wp.tid()
    out[i, j] = src[int(index[i]), j] + shift[i]


@wp.kernel
def fill_words(out: wp.array(dtype=Any), value: wp.array(dtype=Any)):
    """``out[i] = value[0]`` (a one-element array, so a recorded launch replays with new ones)."""
    i = wp.tid()
    out[i] = value[0]


for _word in WARP_WORDS.values():
    wp.overload(gather_rows, {"src": wp.array2d(dtype=_word), "out": wp.array2d(dtype=_word)})
    wp.overload(fill_words, {"out": wp.array(dtype=_word), "value": wp.array(dtype=_word)})
for _index in (wp.int32, wp.int64):
    wp.overload(
        gather_rows_shifted,
        {"src": wp.array2d(dtype=_index), "shift": wp.array(dtype=_index), "out": wp.array2d(dtype=_index)},
    )

