"""Does work queued after a background snapshot wait for its host copies? (GPU only)

A snapshot for a background writer (``alchemi_zarr.records.snapshot(..., copy=True)``) queues
device-to-host copies of every field. With ``ZarrTuning.copy_stream`` on (``alchemi_zarr.tuning``), it first
copies the fields on the device (current stream) and copies those to the host on a stream of
its own, so that the next step need not wait for the bytes to cross PCIe. This measures whether
it does: on a batch of ``--atoms`` (20 bytes per atom, 320 MB at the default), it takes a
snapshot, queues one kernel after it on the same stream (the "next step") and records:

- ``next_step_ms``: device time from before the snapshot to the end of that kernel (CUDA
  events); a next step that waits for the host copies takes about as long as the copies;
- ``copies_ms``: host time until the host copies are done;
- ``snapshot_host_ms``: host time of the ``snapshot`` call itself (a copy that blocks the host
  shows here);
- ``pending``: whether the host copies were still running when the next step finished.

each for the copy stream on and off, on the legacy default stream and on a stream of the
caller's own (as ``with dynamics:`` steps). The side stream keeps its promise where
``pending`` is true and ``next_step_ms`` is a small fraction of ``copies_ms``.

Usage::

    python -m tools.snapshot_overlap --json overlap.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.report import print_report


def _trial(copy_stream: bool, own_stream: bool, atoms: int, repeats: int) -> dict[str, Any]:
    from alchemi_core.data.staging import HostStaging
    from alchemi_core.testing import make_batch
    from alchemi_zarr import records
    from alchemi_zarr.tuning import ZarrTuning

    tuning = ZarrTuning(copy_stream=copy_stream)
    batch = make_batch([atoms // 4] * 4).to("cuda")
    nbytes = sum(getattr(batch, k).numel() * getattr(batch, k).element_size() for k in batch.keys())
    slot = HostStaging(1).acquire()
    stream = torch.cuda.Stream() if own_stream else torch.cuda.current_stream()
    rows: list[dict[str, Any]] = []
    for i in range(repeats + 2):  # two warm-ups: pinned buffers, the stream's memory pool
        with torch.cuda.stream(stream):
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            snap = records.snapshot(batch, copy=True, slot=slot, tuning=tuning)
            t1 = time.perf_counter()
            batch.positions.add_(1.0)  # the next step
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        end.synchronize()
        pending = not snap.event.query() if snap.event is not None else False
        snap.wait()
        t2 = time.perf_counter()
        if i >= 2:
            rows.append({"pending": pending, "next_step_ms": start.elapsed_time(end),
                         "copies_ms": 1e3 * (t2 - t0), "snapshot_host_ms": 1e3 * (t1 - t0)})
    torch.cuda.synchronize()
    return {
        "copy_stream": copy_stream,
        "stream": "own" if own_stream else "legacy default",
        "megabytes": nbytes / 1e6,
        "pending": sum(r["pending"] for r in rows),
        "repeats": len(rows),
        **{k: statistics.median(r[k] for r in rows) for k in ("next_step_ms", "copies_ms", "snapshot_host_ms")},
    }


def measure(atoms: int, repeats: int) -> dict[str, Any]:
    """Every combination of copy stream (on, off) and stepping stream (legacy, own)."""
    trials = [_trial(c, o, atoms, repeats) for c in (True, False) for o in (False, True)]
    return {"device": torch.cuda.get_device_name(), "atoms": atoms, "trials": trials}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=16_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("snapshot_overlap needs a CUDA GPU", file=sys.stderr)
        return 2
    return print_report(measure(args.atoms, args.repeats), args.json)


if __name__ == "__main__":
    sys.exit(main())
