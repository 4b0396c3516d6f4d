"""What handing a CPU kernel's ranges to a worker thread costs: one trivial kernel over ``--atoms``
threads launched once, and the same in ranges on the worker threads, one per thread
(``alchemi_core.warp_runtime.LaunchSequence.add_chunked``), microseconds per launch, rounds
alternating; and a bare ``ThreadPoolExecutor`` round trip (submit, run nothing, wait).

The ranges are measured twice: on the native executor (``ranges``, ``alchemi_core.cpu_executor``,
where this Warp allows it: its workers spin between launches) and on the thread pool it replaces
(``ranges_pool``). The difference from one launch is what a kernel must save by running on
several threads before ranges pay (the thresholds ``warp_kernels.KICK_CHUNKED_FROM`` and
``langevin_lanes.CHUNKED_FROM``).

    python -m benchmarks.cpu_dispatch --atoms 6912

Example:
    >>> round_trip_us(10) > 0
    True
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor


def round_trip_us(n: int) -> float:
    """Median microseconds of ``n`` submit-and-wait round trips to one idle worker thread."""
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        times = []
        for _ in range(n):
            start = time.perf_counter()
            pool.submit(lambda: None).result()
            times.append(time.perf_counter() - start)
        return 1e6 * statistics.median(times)
    finally:
        pool.shutdown()


def launch_us(atoms: int, launches: int, rounds: int) -> dict[str, list[float]]:
    """Microseconds per launch of a trivial kernel over ``atoms`` threads, once and in ranges."""
    import warp as wp

    from alchemi_core import cpu_executor, warp_runtime

    wp.init()

    @wp.kernel
    def scale(a: wp.array(dtype=wp.float32), start: int):  # type: ignore[valid-type]
        i = wp.tid() + start
        a[i] = a[i] * wp.float32(0.5) + wp.float32(1.0)

    data = wp.zeros(atoms, dtype=wp.float32, device="cpu")
    sequences = {}
    for name in ("one_launch", "ranges", "ranges_pool"):
        seq = warp_runtime.LaunchSequence("cpu")
        if name.startswith("ranges"):
            seq.add_chunked(scale, atoms, [data, 0], start_at="start", min_dim=1)
        else:
            seq.add(scale, atoms, [data, 0])
        sequences[name] = seq
    out: dict[str, list[float]] = {name: [] for name in sequences}
    for _ in range(rounds):
        for name, seq in sequences.items():
            cpu_executor.ENABLED = name != "ranges_pool"  # read when a sequence first runs ranges
            for _ in range(launches // 10):  # warm
                seq.run(None)
            start = time.perf_counter()
            for _ in range(launches):
                seq.run(None)
            out[name].append(1e6 * (time.perf_counter() - start) / launches)
    cpu_executor.ENABLED = True
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_dispatch", description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=6912, help="threads of the kernel")
    parser.add_argument("--launches", type=int, default=2000, help="launches per round and arm")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    import torch

    from alchemi_core import warp_runtime

    per_launch = launch_us(args.atoms, args.launches, args.rounds)
    print(json.dumps({
        "atoms": args.atoms, "threads": warp_runtime.cpu_workers(), "torch_threads": torch.get_num_threads(),
        "us_per_launch": {k: [round(x, 1) for x in v] for k, v in per_launch.items()},
        "thread_round_trip_us": round(round_trip_us(args.launches), 1),
    }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
