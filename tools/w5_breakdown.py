"""Where W5's time goes: alchemi's W1 108x2048 with snapshots and logging, one part at a time.

Runs the same Langevin dynamics (one dynamics object per variant, reused across repeats) with
no hooks, with a ``SnapshotHook`` into an asynchronous ``ZarrData`` (child-process writer, and
thread writer for comparison), with the device-to-host copies alone (into reused staging
buffers, as ``ZarrData`` copies, or into new pinned tensors per snapshot), with a CSV
``LoggingHook``, and with both, every ``--every`` steps. For each it reports the median time
of a run of ``--steps`` steps, of the wait for the sink's last writes after the run
(``drain``), and the host time of each hook call; and, on its own, the time one synchronous
``ZarrData.write`` of the whole batch takes (what the writer process spends per snapshot).

Usage::

    python -m tools.w5_breakdown --json w5_breakdown.json      # GPU when present
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import spec
from benchmarks.adapters.alchemi import Alchemi, to_batch
from benchmarks.structures import replicated_crystal
from benchmarks.timing import synchronize


class _Timed:
    """Wraps a hook's ``__call__`` to record its host time (the hook keeps its other attributes)."""

    def __init__(self, hook: Any, times: list[float]) -> None:
        self._hook, self._times = hook, times

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hook, name)

    def __call__(self, batch: Any, dynamics: Any) -> None:
        t = time.perf_counter()
        self._hook(batch, dynamics)
        self._times.append(time.perf_counter() - t)


class _CopyOnly:
    """A sink that copies each snapshot to the host and drops it once the copy has landed: the
    cost of the device-to-host copies alone, into reused staging buffers (as ``ZarrData`` does)
    or, with ``reuse=False``, into new pinned tensors per snapshot."""

    def __init__(self, reuse: bool = True) -> None:
        import queue
        import threading

        from alchemi_core.data.staging import HostStaging

        self.staging = HostStaging(4) if reuse else None
        self._queue: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._drop, daemon=True).start()

    def _drop(self) -> None:
        while True:
            snap = self._queue.get()
            snap.wait()
            snap.release()
            self._queue.task_done()

    def write(self, batch: Any, mask: Any = None) -> None:
        from functools import partial

        from alchemi_zarr.records import snapshot

        if self.staging is None:
            self._queue.put(snapshot(batch, copy=True))
        else:
            slot = self.staging.acquire()
            self._queue.put(snapshot(batch, copy=True, slot=slot, release=partial(self.staging.release, slot)))

    def flush(self) -> None:
        self._queue.join()

    def close(self) -> None:
        self.flush()


def _variant(
    name: str, make_hooks: Callable[[Path], tuple[list[Any], list[Any]]], batch: Any, args: argparse.Namespace,
    scratch: Path,
) -> dict[str, Any]:
    from alchemi_integrators import Langevin

    folder = scratch / name
    folder.mkdir()
    hooks, sinks = make_hooks(folder)
    calls: list[float] = []
    timed_hooks = [_Timed(h, calls) for h in hooks]
    p = spec.LANGEVIN
    dyn = Langevin(
        Alchemi().model(), dt=p.dt_fs, temperature=p.temperature, friction=p.friction_per_fs, random_seed=0,
        hooks=timed_hooks,
    ).compile()
    run_s, drain_s = [], []
    for repeat in range(args.repeats + 1):  # the first run warms up (kernels, capture)
        calls.clear()
        synchronize(args.device)
        t0 = time.perf_counter()
        with dyn:
            dyn.run(batch, n_steps=args.steps)
        synchronize(args.device)
        t1 = time.perf_counter()
        for s in sinks:
            s.flush()
        t2 = time.perf_counter()
        if repeat:
            run_s.append(t1 - t0)
            drain_s.append(t2 - t1)
    for s in sinks:
        s.close()
    out = {
        "ms_per_step": 1e3 * statistics.median(run_s) / args.steps,
        "run_s": statistics.median(run_s),
        "drain_s": statistics.median(drain_s),
        "total_ms_per_step": 1e3 * statistics.median([a + b for a, b in zip(run_s, drain_s)]) / args.steps,
    }
    if calls:
        out["hook_call_ms"] = {"median": 1e3 * statistics.median(calls), "max": 1e3 * max(calls), "calls": len(calls)}
    shutil.rmtree(folder, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--atoms", type=int, default=spec.W5_SHAPE[0])
    parser.add_argument("--systems", type=int, default=spec.W5_SHAPE[1])
    parser.add_argument("--every", type=int, default=spec.W5_EVERY)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--variants", default="all", help="comma-separated names among plain, process, thread, copy, copy-new, logging, both"
    )
    args = parser.parse_args(argv)

    from alchemi_hooks.logger import LoggingHook
    from alchemi_hooks.snapshot import SnapshotHook
    from alchemi_zarr import ZarrData

    batch = to_batch(replicated_crystal(args.atoms, args.systems, spec.LANGEVIN.temperature, seed=0), args.device)
    scratch = Path(tempfile.mkdtemp(prefix="alchemi-w5-breakdown-"))

    def snapshots(writer: str) -> Callable[[Path], tuple[list[Any], list[Any]]]:
        def make(folder: Path) -> tuple[list[Any], list[Any]]:
            sink = ZarrData(str(folder / "s.zarr"), asynchronous=writer)
            return [SnapshotHook(sink, frequency=args.every)], [sink]

        return make

    def logging(folder: Path) -> tuple[list[Any], list[Any]]:
        return [LoggingHook(backend="csv", log_path=folder / "log.csv", frequency=args.every)], []

    def copy_only(reuse: bool) -> Callable[[Path], tuple[list[Any], list[Any]]]:
        def make(folder: Path) -> tuple[list[Any], list[Any]]:
            sink = _CopyOnly(reuse)
            return [SnapshotHook(sink, frequency=args.every)], [sink]

        return make

    def both(folder: Path) -> tuple[list[Any], list[Any]]:
        hooks, sinks = snapshots("process")(folder)
        return hooks + logging(folder)[0], sinks

    variants: dict[str, Callable[[Path], tuple[list[Any], list[Any]]]] = {
        "plain": lambda folder: ([], []),
        "snapshots (process writer)": snapshots("process"),
        "snapshots (thread writer)": snapshots("thread"),
        "copies only (reused buffers)": copy_only(True),
        "copies only (new pinned tensors)": copy_only(False),
        "logging": logging,
        "snapshots + logging": both,
    }
    short = dict(zip(["plain", "process", "thread", "copy", "copy-new", "logging", "both"], variants))
    if args.variants != "all":
        chosen = ["plain", *(v for v in args.variants.split(",") if v != "plain")]
        variants = {short[v]: variants[short[v]] for v in chosen}
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "shape": f"{args.atoms}x{args.systems}",
        "every": args.every,
        "steps": args.steps,
        "repeats": args.repeats,
        "variants": {},
    }
    try:
        for name, make in variants.items():
            result["variants"][name] = _variant(name.split()[0] + str(len(result["variants"])), make, batch, args, scratch)
            print(name, json.dumps(result["variants"][name]), flush=True)
        # One synchronous write of the whole batch: the writer process's work per snapshot.
        sink = ZarrData(str(scratch / "sync.zarr"))
        sink.write(batch)
        times = []
        for _ in range(5):
            synchronize(args.device)
            t = time.perf_counter()
            sink.write(batch)
            times.append(time.perf_counter() - t)
        result["synchronous_write_ms"] = 1e3 * statistics.median(times)
        print("synchronous write ms", result["synchronous_write_ms"], flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base = result["variants"]["plain"]["total_ms_per_step"]
    for v in result["variants"].values():
        v["slowdown_percent"] = 100.0 * (v["total_ms_per_step"] / base - 1.0)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
