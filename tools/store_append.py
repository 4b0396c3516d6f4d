"""What one snapshot costs the writer: appending W5's batch (108x2048) to a store, by chunk size.

For each chunk size it times ``AtomicStore.append`` of the whole batch (the writer process's work
per snapshot, median of ``--repeats``), and, as the floor no store can beat, writing the same
bytes as plain files of that size (write and rename, as zarr's local store does). ``--via``
compares ways of writing a local store's chunks: ``zarr`` (through zarr's store) and ``files``
(alchemi-zarr's own, :mod:`alchemi_zarr.local_files`) on each of ``--file-threads``. With
``--rounds`` above 1 the ways run again in reversed order every other round (a disk under
writeback slows whatever runs later); each store is deleted once timed.

Usage::

    python -m tools.store_append --json store_append.json --chunk-kib 256,512,2048,8192
    python -m tools.store_append --chunk-kib 512 --via zarr,files --file-threads 1,2,4 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import spec
from benchmarks.adapters.alchemi import to_batch
from benchmarks.structures import replicated_crystal


def _median_ms(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def _plain_files(folder: Path, arrays: list[Any], chunk_bytes: int) -> None:
    for i, a in enumerate(arrays):
        data = memoryview(a.reshape(-1).view("u1"))
        for j in range(0, len(data), chunk_bytes):
            tmp = folder / f"{i}.{j}.tmp"
            tmp.write_bytes(data[j : j + chunk_bytes])
            os.replace(tmp, folder / f"{i}.{j}")


def _ways(via: str, file_threads: str) -> list[tuple[str, int | None]]:
    """``(label, threads)`` of each way to write: None for zarr's store, 0 for files at the default
    thread count (``local_files.FILE_THREADS``)."""
    ways: list[tuple[str, int | None]] = []
    for name in (v.strip() for v in via.split(",")):
        if name == "zarr":
            ways.append(("append_ms_via_zarr", None))
        elif name == "files":
            threads = [int(t) for t in file_threads.split(",")] if file_threads else [None]
            ways += [(f"append_ms_via_files_t{t}" if t else "append_ms_via_files", t or 0) for t in threads]
        else:
            raise SystemExit(f"--via: unknown {name!r}; use zarr, files")
    return ways


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunk-kib", default="256,512,2048,8192")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--via", default="files",
                        help="comma-separated: files (a local store's chunks written as files by alchemi-zarr), "
                             "zarr (through zarr's store, as any other store)")
    parser.add_argument("--file-threads", default="", help="comma-separated thread counts for --via files "
                        "(default: alchemi_zarr.local_files.FILE_THREADS)")
    parser.add_argument("--rounds", type=int, default=1, help="times each way is timed, in alternating order")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from alchemi_zarr import chunks, layout, local_files
    from alchemi_zarr.records import HostRecords, snapshot
    from alchemi_zarr.storage import AtomicStore

    atoms, systems = spec.W5_SHAPE
    batch = to_batch(replicated_crystal(atoms, systems, spec.LANGEVIN.temperature, seed=0), "cpu")
    records = HostRecords.from_snapshot(snapshot(batch, copy=False))
    megabytes = sum(a.nbytes for a in records.fields.values()) / 1e6
    scratch = Path(tempfile.mkdtemp(prefix="alchemi-store-append-"))
    result: dict[str, Any] = {"batch": f"{atoms}x{systems}", "megabytes": megabytes, "rounds": args.rounds,
                              "chunks": {}}
    ways = _ways(args.via, args.file_threads)
    defaults = layout.CHUNK_BYTES, chunks.LOCAL_FILES, local_files.FILE_THREADS
    try:
        for kib in (int(k) for k in args.chunk_kib.split(",")):
            layout.CHUNK_BYTES = kib * 1024
            times: dict[str, list[float]] = {label: [] for label, _ in ways}
            for r in range(args.rounds):
                for label, threads in ways if r % 2 == 0 else ways[::-1]:
                    chunks.LOCAL_FILES = threads is not None
                    local_files.FILE_THREADS = threads or defaults[2]
                    path = scratch / f"{kib}-{label}.zarr"
                    store = AtomicStore(str(path), read_only=False)
                    store.append(records)  # lays the arrays out
                    times[label].append(_median_ms(lambda store=store: store.append(records), args.repeats))
                    shutil.rmtree(path)
            row: dict[str, Any] = {k: statistics.median(v) for k, v in times.items()}
            if args.rounds > 1:
                row["rounds_ms"] = times
            folder = scratch / f"{kib}.files"
            folder.mkdir()
            row["plain_files_ms"] = _median_ms(
                lambda folder=folder, kib=kib: _plain_files(folder, list(records.fields.values()), kib * 1024), args.repeats
            )
            result["chunks"][kib] = row
            shown = ", ".join(f"{k} {v:.1f}" for k, v in row.items() if k != "rounds_ms")
            print(f"{kib:>6} KiB chunks: {shown}", flush=True)
    finally:
        layout.CHUNK_BYTES, chunks.LOCAL_FILES, local_files.FILE_THREADS = defaults
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
