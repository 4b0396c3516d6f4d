"""Where one W5 snapshot's append goes, part by part: the writer process's work, timed in place.

``python -m benchmarks.store_append`` says how long an append of W5's batch takes against plain
files of the same bytes; this says where the difference goes. It appends the batch ``--appends``
times to a local store and times, around the functions that do them, the parts of each append:

* on the appending thread: reading the commit (``refresh``), growing the arrays, cutting the rows
  into whole chunks (``ChunkTails.pieces``: tails and zero padding), encoding them (a copy and a
  CRC-32C) and writing them (``write_pieces``); the rest is the lock and the commit;
* writing the chunk files (a local store's whole chunks, :mod:`alchemi_zarr.local_files`, on a
  few threads; summed over them): each file's whole write, and of it the folders, the file's
  creation and the rename of a temporary file over a chunk that holds records.

Thread sums can exceed the wall time of the writes when the threads overlap. Python 3.12's
profilers are process-wide, one at a time, so this times known functions instead.

    python -m benchmarks.writer_parts --appends 50 --json writer_parts.json

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     result = measure(atoms=32, systems=2, appends=2, folder=Path(folder))
    >>> result["parts"]["append (whole)"]["calls_per_append"]
    1.0
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import spec
from benchmarks.adapters.alchemi import to_batch
from benchmarks.structures import replicated_crystal
from benchmarks.timing import CallTimer


def measure(atoms: int, systems: int, appends: int, folder: Path) -> dict[str, Any]:
    """Append a ``systems x atoms`` crystal batch ``appends`` times (after one that lays the store
    out) with its parts timed; ms and calls per append."""
    import os

    import alchemi_zarr.chunks as chunks
    import alchemi_zarr.local_files as local_files
    import alchemi_zarr.storage as storage
    from alchemi_zarr.aligned import ChunkTails
    from alchemi_zarr.records import HostRecords, snapshot
    from alchemi_zarr.storage import AtomicStore

    batch = to_batch(replicated_crystal(atoms, systems, spec.LANGEVIN.temperature, seed=0), "cpu")
    records = HostRecords.from_snapshot(snapshot(batch, copy=False))
    store = AtomicStore(str(folder / "parts.zarr"), read_only=False)
    store.append(records)
    timer = CallTimer()
    parts = [
        (AtomicStore, "append", "append (whole)"),
        (AtomicStore, "refresh", "read the commit"),
        (AtomicStore, "_grow", "grow the arrays"),
        (ChunkTails, "pieces", "whole chunks: tails and padding"),
        (chunks, "_chunk_sets", "encode: CRC-32C (and blosc)"),
        (storage, "write_pieces", "write_pieces (wall)"),
        (local_files, "write_file", "files: one chunk file"),
        (os, "makedirs", "files: their folders"),
        (os, "open", "files: create the file"),
        (os, "replace", "files: rename over a chunk with records"),
    ]
    for owner, attr, label in parts:
        timer.wrap(owner, attr, label)
    try:
        for _ in range(appends):
            store.append(records)
    finally:
        timer.restore()
    megabytes = sum(a.nbytes for a in records.fields.values()) / 1e6
    rows = {label: {"ms_per_append": 1e3 * timer.seconds[label] / appends,
                    "calls_per_append": timer.calls[label] / appends} for _, _, label in parts}
    return {"batch": f"{atoms}x{systems}", "megabytes": megabytes, "appends": appends, "parts": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.writer_parts", description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=spec.W5_SHAPE[0])
    parser.add_argument("--systems", type=int, default=spec.W5_SHAPE[1])
    parser.add_argument("--appends", type=int, default=30)
    parser.add_argument("--dir", type=Path, default=None, help="where the store goes (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="alchemi-writer-parts-", dir=args.dir))
    try:
        result = measure(args.atoms, args.systems, args.appends, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{result['batch']}, {result['megabytes']:.1f} MB per append, {result['appends']} appends")
    for label, row in result["parts"].items():
        print(f"  {label:<38} {row['ms_per_append']:8.2f} ms  {row['calls_per_append']:7.1f} calls")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
