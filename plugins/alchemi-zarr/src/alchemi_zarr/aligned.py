"""Appends that cover whole chunks, so zarr never reads a chunk back to merge into it.

Zarr writes a partly covered chunk by reading, decoding and merging it. Instead, the writer
remembers the committed rows of each field's last, partly filled chunk (its *tail*) and writes
``tail + new rows + zero padding`` from one chunk boundary to the next. Rows past the commit are
not records (the padding is overwritten by the next append).

Example:
    >>> import numpy as np
    >>> tails = ChunkTails()
    >>> pieces = tails.pieces("x", lo=0, rows=np.arange(5), chunk=4, read_tail=None)
    >>> [(start, p.tolist()) for start, p in pieces]
    [(0, [0, 1, 2, 3]), (4, [4, 0, 0, 0])]
    >>> [(start, p.tolist()) for start, p in tails.pieces("x", 5, np.arange(5, 7), 4, None)]
    [(4, [4, 5, 6, 0])]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _padded(parts: list[np.ndarray], rows: int, like: np.ndarray) -> np.ndarray:
    """``parts`` stacked into ``rows`` rows, the rest zero."""
    out = np.zeros((rows, *like.shape[1:]), dtype=like.dtype)
    at = 0
    for p in parts:
        out[at : at + len(p)] = p
        at += len(p)
    return out


class ChunkTails:
    """Per field, the committed rows of its last partly filled chunk (see the module docstring)."""

    def __init__(self) -> None:
        self._tails: dict[str, tuple[int, np.ndarray]] = {}  # name -> (end row, rows since boundary)

    def forget(self) -> None:
        """Drop every tail (another writer appended, or the store was cleared or re-laid out)."""
        self._tails.clear()

    def pieces(
        self, name: str, lo: int, rows: np.ndarray, chunk: int, read_tail: Callable[[int, int], np.ndarray] | None
    ) -> list[tuple[int, np.ndarray]]:
        """``(start row, values)`` pieces that write ``rows`` at row ``lo``, each whole chunks.

        Args:
            name: The field (its tail is looked up and replaced).
            lo: The first row to write (the committed end).
            rows: The new rows.
            chunk: Rows per chunk.
            read_tail: Reads committed rows ``[start, stop)`` when the tail is not remembered
                (first append after opening a store); None when there are none to read.
        """
        if not len(rows):
            return []
        hi = lo + len(rows)
        boundary = lo - lo % chunk
        tail = self._tail(name, boundary, lo, rows, read_tail)
        pieces: list[tuple[int, np.ndarray]] = []
        taken = 0
        if len(tail):  # the first chunk mixes committed and new rows
            taken = min(chunk - len(tail), len(rows))
            pieces.append((boundary, _padded([tail, rows[:taken]], chunk, rows)))
        start = lo + taken
        whole = (len(rows) - taken) // chunk * chunk
        if whole:  # whole chunks of new rows: written as they are, no copy
            pieces.append((start, rows[taken : taken + whole]))
        rest = rows[taken + whole :]
        if len(rest):
            pieces.append((start + whole, _padded([rest], chunk, rows)))
        # The new tail, copied: the caller may reuse its buffer.
        end_boundary = hi - hi % chunk
        if end_boundary >= lo:
            new_tail = np.array(rows[end_boundary - lo :])
        else:
            new_tail = np.concatenate([tail, rows])
        self._tails[name] = (hi, new_tail)
        return pieces

    def _tail(
        self, name: str, boundary: int, lo: int, rows: np.ndarray, read_tail: Callable[[int, int], np.ndarray] | None
    ) -> np.ndarray:
        if boundary == lo:
            return rows[:0]
        known = self._tails.get(name)
        if known is not None and known[0] == lo and len(known[1]) == lo - boundary:
            return known[1]
        if read_tail is None:
            raise ValueError(f"rows {boundary}:{lo} of {name!r} are needed but no reader was given")
        return np.asarray(read_tail(boundary, lo), dtype=rows.dtype).reshape(lo - boundary, *rows.shape[1:])

    @staticmethod
    def end(hi: int, chunk: int) -> int:
        """The first chunk boundary at or after row ``hi``: the array must be at least this long."""
        return -(-hi // chunk) * chunk
