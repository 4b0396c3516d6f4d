"""Rows seen as words: the widest safe word is chosen and the views alias the tensor."""

from __future__ import annotations

import pytest
import torch

from alchemi_warp.words import as_flat_words, as_words, word_bytes_for


@pytest.mark.parametrize(
    ("dtype", "trailing", "width"),
    [
        (torch.float64, (3,), 8),
        (torch.float32, (3,), 4),  # 12-byte rows: 8 does not divide them
        (torch.float32, (3, 3), 4),
        (torch.float32, (2,), 8),
        (torch.int64, (), 8),
        (torch.int64, (2,), 8),
        (torch.int32, (), 4),
        (torch.bool, (), 1),
        (torch.bool, (3,), 1),
        (torch.bool, (4,), 4),
        (torch.float16, (3,), 2),
    ],
)
def test_widest_word_that_divides_the_row(dtype, trailing, width):
    t = torch.zeros((5, *trailing), dtype=dtype)
    assert word_bytes_for(t) == width
    w = as_words(t, width)
    assert w.shape == (5, t[0].numel() * t.element_size() // width)
    assert w.data_ptr() == t.data_ptr()


def test_byte_offset_narrows_the_word():
    base = torch.zeros(10, 2, dtype=torch.float32)  # 8-byte rows
    assert word_bytes_for(base[1:]) == 8
    flat = torch.zeros(10, dtype=torch.float32)
    assert word_bytes_for(flat[1:].reshape(-1, 1)) == 4  # 4-byte rows at a 4-byte offset
    assert word_bytes_for(base, torch.zeros(21, dtype=torch.float32)[1:].reshape(10, 2)) == 4


def test_views_alias_and_keep_bits():
    t = torch.tensor([[float("nan"), -0.0, 1.5]], dtype=torch.float64)
    w = as_words(t, 8)
    w[0, 2] = torch.tensor([2.5], dtype=torch.float64).view(torch.int64)[0]
    assert t[0, 2].item() == 2.5
    assert torch.equal(w[0, :2], t[0, :2].view(torch.int64))


def test_zero_rows_and_flat_words():
    empty = torch.zeros(0, 3, dtype=torch.bool)
    assert as_words(empty, 1).shape == (0, 3)
    flat = as_flat_words(torch.ones(4, 3, dtype=torch.float32))
    assert flat.shape == (6,) and flat.dtype == torch.int64
