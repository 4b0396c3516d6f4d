"""One int32 per neighbour: the neighbour's slot within its system in the low ``index_bits`` bits
and its periodic image ``m`` in the rest: ``image_bits = min(10, (31 - index_bits) // 3)`` per
axis, each stored as ``m + 2^(image_bits - 1)``. Positions are wrapped at every build, so ``|m|``
exceeds 1 only for cells thinner than the cutoff. Systems are limited to 2^25 atoms
(:data:`MAX_INDEX_BITS`).

Example:
    >>> import numpy as np
    >>> bits = index_bits(np.array([108]))
    >>> code = encode(np.array([5]), np.array([[0, -1, 1]]), bits)
    >>> slot, image = decode(code, bits)
    >>> int(slot[0]), image[0].tolist()
    (5, [0, -1, 1])
"""

from __future__ import annotations

import numpy as np
import warp as wp

wp.set_module_options({"enable_backward": False})

#: Index bits of the largest system an entry can address (leaves 2 bits per image axis).
MAX_INDEX_BITS = 25


@wp.func
def image_bits_for(index_bits: int):
    return wp.min(10, (31 - index_bits) / 3)


@wp.func
def image_limit(image_bits: int):
    """The largest ``|m|`` an entry holds."""
    return (1 << (image_bits - 1)) - 1


@wp.func
def encode_entry(slot: int, mx: int, my: int, mz: int, index_bits: int, image_bits: int):
    bias = 1 << (image_bits - 1)
    image = (mx + bias) | ((my + bias) << image_bits) | ((mz + bias) << (2 * image_bits))
    return slot | (image << index_bits)


@wp.func
def entry_slot(code: int, index_bits: int):
    return code & ((1 << index_bits) - 1)


@wp.func
def entry_image(code: int, index_bits: int, image_bits: int):
    h = code >> index_bits
    mask = (1 << image_bits) - 1
    bias = 1 << (image_bits - 1)
    return wp.vec3i((h & mask) - bias, ((h >> image_bits) & mask) - bias, ((h >> (2 * image_bits)) & mask) - bias)


def index_bits(atoms_per_system: np.ndarray) -> np.ndarray:
    """Index bits of each system: enough for its largest slot (at least 1)."""
    largest_slot = np.maximum(np.asarray(atoms_per_system, dtype=np.int64) - 1, 1)
    return np.frexp(largest_slot)[1].astype(np.int64)  # the bit length, exactly


def image_bits(bits: np.ndarray) -> np.ndarray:
    return np.minimum(10, (31 - np.asarray(bits, dtype=np.int64)) // 3)


def encode(slot: np.ndarray, image: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """Pack slots ``[n]`` and images ``[n, 3]`` (numpy twin of the kernels' ``encode_entry``)."""
    slot, image, bits = np.asarray(slot, np.int64), np.asarray(image, np.int64), np.asarray(bits, np.int64)
    ib = image_bits(bits)
    packed = (image + (1 << (ib - 1))[..., None]) << (np.arange(3) * ib[..., None])
    return (slot | (packed.sum(-1) << bits)).astype(np.int32)


def decode(code: np.ndarray, bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Slots ``[n]`` and images ``[n, 3]`` of packed entries (``bits``: index bits per entry)."""
    code, bits = np.asarray(code, np.int64), np.asarray(bits, np.int64)
    ib = image_bits(bits)
    slot = code & ((1 << bits) - 1)
    h = (code >> bits)[..., None] >> (np.arange(3) * ib[..., None])
    image = (h & ((1 << ib) - 1)[..., None]) - (1 << (ib - 1))[..., None]
    return slot, image
