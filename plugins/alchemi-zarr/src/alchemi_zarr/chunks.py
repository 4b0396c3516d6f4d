"""Whole chunks encoded here and stored directly, as the Zarr v3 specification defines them.

Appends write whole chunks only (:mod:`alchemi_zarr.aligned`), and alchemi's arrays have one of
three codec chains after little-endian ``bytes``: ``crc32c``, ``blosc`` + ``crc32c``, or ``zstd``
(zarr's default, the commit's). Encoding a whole chunk is then a checksum (and one compressor
call), and storing it one file on a local store (:mod:`alchemi_zarr.local_files`) or one ``set``
on any other store, where zarr's array assignment spends several asyncio tasks, a selection and
copies per chunk. The bytes are the ones zarr writes (tested), so any Zarr v3 reader reads them;
arrays with other codec chains are written through zarr.

Example:
    >>> import numpy as np, zarr
    >>> from zarr.codecs import Crc32cCodec
    >>> group = zarr.open_group("memory://chunks-doc", mode="w", zarr_format=3)
    >>> arr = group.create_array("x", shape=(8,), dtype="f4", chunks=(4,), compressors=[Crc32cCodec()])
    >>> write_pieces([(arr, slice(0, 8), np.arange(8, dtype="f4"))])
    >>> arr[:].tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from alchemi_zarr.local_files import ChunkFile, local_root, write_files

#: An encoded chunk, in parts written one after another (no copy joins the data and its checksum).
Parts = list[Any]
Encoder = Callable[[np.ndarray], Parts]

#: Write a local store's whole chunks as files here and read its commit directly (False: through
#: zarr, as ``tools/store_append.py --via`` compares).
LOCAL_FILES = True


def _crc_bytes(data: Any) -> bytes:
    """The CRC-32C of ``data``, as zarr's ``crc32c`` codec stores it (4 bytes, little-endian)."""
    import google_crc32c

    return int(google_crc32c.value(data)).to_bytes(4, "little")


def _crc32c(chunk: np.ndarray) -> Parts:
    data = np.ascontiguousarray(chunk).reshape(-1).view(np.uint8)
    return [data.data, _crc_bytes(data)]


def _chain(arr: Any) -> str | None:
    """Which of alchemi's codec chains ``arr`` has (``"crc32c"``, ``"zstd"`` or
    ``"blosc+crc32c"``, on a regular grid of whole rows), or None (zarr must encode its chunks).

    The metadata is read by what it holds, not by zarr's class names (zarr 3.4 renamed the
    regular chunk grid and made endianness a string); anything unexpected is warned about once."""
    try:
        from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ZstdCodec

        meta = arr.metadata
        codecs = tuple(meta.codecs)
        dtype = np.dtype(arr.dtype)
        # A regular grid has one chunk shape (a rectilinear one has ``chunk_shapes``).
        chunk_shape = getattr(meta.chunk_grid, "chunk_shape", None)
        if getattr(meta, "zarr_format", None) != 3 or chunk_shape is None:
            return None
        if tuple(chunk_shape[1:]) != tuple(arr.shape[1:]):
            return None  # chunks split rows: not one of alchemi's arrays
        if not codecs or not isinstance(codecs[0], BytesCodec) or dtype.byteorder == ">":
            return None
        if dtype.itemsize > 1 and _name(codecs[0].endian) != "little":
            return None
        rest = codecs[1:]
        if len(rest) == 1 and isinstance(rest[0], Crc32cCodec):
            return "crc32c"
        if len(rest) == 1 and isinstance(rest[0], ZstdCodec):
            return "zstd"
        if len(rest) == 2 and isinstance(rest[0], BloscCodec) and isinstance(rest[1], Crc32cCodec):
            return "blosc+crc32c"
    except Exception as exc:  # noqa: BLE001 - anything unexpected: zarr does the work, and says so once
        _warn_once(f"{type(exc).__name__}: {exc}")
    return None


def encoder(arr: Any) -> Encoder | None:
    """How to encode a whole chunk of ``arr`` here, or None when zarr must (see :func:`_chain`)."""
    chain = _chain(arr)
    if chain == "crc32c":
        return _crc32c
    if chain == "zstd":
        from numcodecs import Zstd

        codec = arr.metadata.codecs[1]
        zstd = Zstd(level=codec.level, checksum=codec.checksum)
        return lambda chunk: [zstd.encode(np.ascontiguousarray(chunk))]
    if chain == "blosc+crc32c":
        blosc = _blosc(arr.metadata.codecs[1], np.dtype(arr.dtype))
        if blosc is not None:
            return lambda chunk: _crc32c(np.frombuffer(blosc.encode(np.ascontiguousarray(chunk)), np.uint8))
    return None


def _name(value: Any) -> Any:
    """An enum's value, or the value itself (zarr 3.4 keeps some settings as plain strings)."""
    return getattr(value, "value", value)


_WARNED: set[str] = set()


def _warn_once(why: str) -> None:
    import warnings

    if why not in _WARNED:
        _WARNED.add(why)
        warnings.warn(
            f"alchemi-zarr cannot encode chunks itself with this zarr ({why}); zarr writes them instead, "
            "which is slower. Please report it with your zarr version",
            RuntimeWarning,
            stacklevel=3,
        )


def read_local_chunk(arr: Any, index: int) -> np.ndarray | None:
    """Whole chunk ``index`` (along rows) of a local store's array with one of alchemi's codec
    chains, read and decoded here, without zarr's event-loop round trips (a missing chunk is its
    fill value); None when zarr must read it.

    Raises:
        ValueError: The chunk fails its checksum or does not decode to a whole chunk.
    """
    root = local_root(arr.store_path.store) if LOCAL_FILES else None
    chain = _chain(arr) if root is not None else None
    if root is None or chain is None:
        return None
    key = _chunk_key(arr, index)
    shape = (arr.chunks[0], *arr.shape[1:])
    try:
        with open(root / key, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return np.full(shape, arr.fill_value, dtype=arr.dtype)
    if chain.endswith("crc32c"):
        if len(raw) < 4 or _crc_bytes(raw[:-4]) != raw[-4:]:
            raise ValueError(f"chunk {key} fails its CRC-32C checksum")
        raw = raw[:-4]
    if chain != "crc32c":
        from numcodecs import Blosc, Zstd

        try:
            raw = bytes((Zstd() if chain == "zstd" else Blosc()).decode(raw))
        except RuntimeError as exc:  # numcodecs' word for input that does not decode
            raise ValueError(f"chunk {key} does not decode: {exc}") from None
    values = np.frombuffer(raw, dtype=np.dtype(arr.dtype).newbyteorder("<"))
    if values.size != int(np.prod(shape)):
        raise ValueError(f"chunk {key} holds {values.size} values, not a whole chunk of {shape}")
    return values.reshape(shape).astype(arr.dtype, copy=False)


def _blosc(codec: Any, dtype: np.dtype) -> Any:
    """numcodecs' Blosc set up as zarr's ``codec``, or None for settings it does not map."""
    from numcodecs import Blosc

    shuffles = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}
    shuffle = shuffles.get(_name(codec.shuffle))
    if shuffle is None or (codec.typesize or dtype.itemsize) != dtype.itemsize:
        return None
    return Blosc(cname=_name(codec.cname), clevel=codec.clevel, shuffle=shuffle,
                 blocksize=codec.blocksize)


def _chunk_key(arr: Any, index: int) -> str:
    """The store key of ``arr``'s chunk ``index`` along its rows (its whole row width)."""
    prefix = f"{arr.store_path.path}/" if arr.store_path.path else ""
    return prefix + arr.metadata.encode_chunk_key((index, *(0,) * (arr.ndim - 1)))


def _chunk_sets(arr: Any, rows: slice, values: np.ndarray, encode: Encoder) -> list[tuple[int, str, Parts]]:
    """``(first row, key, encoded parts)`` of each whole chunk that ``values`` fill from ``rows.start``."""
    chunk = arr.chunks[0]
    assert rows.start % chunk == 0 and len(values) % chunk == 0, "whole chunks only"
    values = values.astype(arr.dtype, copy=False)
    return [(rows.start + at, _chunk_key(arr, (rows.start + at) // chunk), encode(values[at : at + chunk]))
            for at in range(0, len(values), chunk)]


def write_pieces(pieces: list[tuple[Any, slice, np.ndarray]], committed: Mapping[str, int] | None = None) -> None:
    """Assign every ``array[rows] = values``, returning when all are done: whole chunks of
    alchemi's codec chains are encoded here (a local store's written as files, any other store's
    stored with one ``set`` each), the rest go through zarr; zarr's writes overlap on its loop.

    Args:
        pieces: ``(array, rows, values)`` to assign.
        committed: Rows of each array (by its path in the store) that hold records: a chunk
            that starts at or past them holds none and may be written in place. Arrays not
            named here are written through temporary files only.
    """
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    direct: list[tuple[Any, str, Parts]] = []
    files: dict[Any, list[ChunkFile]] = {}
    through_zarr: list[tuple[Any, slice, np.ndarray]] = []
    encoders: dict[int, Encoder | None] = {}
    for arr, rows, values in pieces:
        if id(arr) not in encoders:
            encoders[id(arr)] = encoder(arr)
        encode = encoders[id(arr)]
        whole = rows.start % arr.chunks[0] == 0 and len(values) % arr.chunks[0] == 0
        if encode is None or not whole:
            through_zarr.append((arr, rows, values))
            continue
        store = arr.store_path.store
        root = local_root(store) if LOCAL_FILES else None
        records_end = (committed or {}).get(arr.path)
        for first, key, parts in _chunk_sets(arr, rows, values, encode):
            if root is None:
                direct.append((store, key, parts))
            else:
                fresh = records_end is not None and first >= records_end
                files.setdefault(root, []).append(ChunkFile(key, parts, in_place=fresh))
    for root, chunk_files in files.items():
        write_files(root, chunk_files)
    if not direct and not through_zarr:
        return
    buffer = default_buffer_prototype().buffer

    async def assign_all() -> None:
        await asyncio.gather(
            *(store.set(key, buffer.from_bytes(b"".join(parts))) for store, key, parts in direct),
            *((getattr(arr, "async_array", None) or arr._async_array).setitem(rows, values)
              for arr, rows, values in through_zarr),
        )

    sync(assign_all())
