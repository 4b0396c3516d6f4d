"""What one snapshot costs the writer: appending W5's batch (108x2048) to a store, by chunk size.

For each chunk size it times ``AtomicStore.append`` of the whole batch (the writer process's work
per snapshot, median of ``--repeats``), and, as the floor no store can beat, writing the same
bytes as plain files of that size (write and rename, as zarr's local store does).

Usage::

    python -m benchmarks.store_append --json store_append.json --chunk-kib 256,512,2048,8192
    python -m benchmarks.store_append --chunk-kib 512 --via zarr,files
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunk-kib", default="256,512,2048,8192")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--via", default="files",
                        help="comma-separated: files (a local store's chunks written as files by alchemi-zarr), "
                             "zarr (through zarr's store, as any other store)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from alchemi_zarr import chunks, layout
    from alchemi_zarr.records import HostRecords, snapshot
    from alchemi_zarr.storage import AtomicStore

    atoms, systems = spec.W5_SHAPE
    batch = to_batch(replicated_crystal(atoms, systems, spec.LANGEVIN.temperature, seed=0), "cpu")
    records = HostRecords.from_snapshot(snapshot(batch, copy=False))
    megabytes = sum(a.nbytes for a in records.fields.values()) / 1e6
    scratch = Path(tempfile.mkdtemp(prefix="alchemi-store-append-"))
    result: dict[str, Any] = {"batch": f"{atoms}x{systems}", "megabytes": megabytes, "chunks": {}}
    default, default_via = layout.CHUNK_BYTES, chunks.LOCAL_FILES
    try:
        for kib in (int(k) for k in args.chunk_kib.split(",")):
            layout.CHUNK_BYTES = kib * 1024
            row: dict[str, float] = {}
            for via in args.via.split(","):
                chunks.LOCAL_FILES = {"files": True, "zarr": False}[via.strip()]
                store = AtomicStore(str(scratch / f"{kib}-{via}.zarr"), read_only=False)
                store.append(records)  # lays the arrays out
                row[f"append_ms_via_{via}"] = _median_ms(lambda store=store: store.append(records), args.repeats)
            folder = scratch / f"{kib}.files"
            folder.mkdir()
            row["plain_files_ms"] = _median_ms(
                lambda folder=folder, kib=kib: _plain_files(folder, list(records.fields.values()), kib * 1024), args.repeats
            )
            result["chunks"][kib] = row
            print(f"{kib:>6} KiB chunks: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
    finally:
        layout.CHUNK_BYTES, chunks.LOCAL_FILES = default, default_via
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
