"""Does a snapshot's device-to-host copy return at once, and how fast does it run? (GPU only)

While the device is busy (a ``torch.cuda._sleep`` kernel of ``--busy-ms``), it issues a
non-blocking copy of W5's per-atom positions (2.7 MB) into host memory of several kinds and
reports the host time of the ``copy_`` call (a copy that waits for the device takes about
``--busy-ms``) and the device time of the copy (CUDA events):

- ``pinned (new)``: ``torch.empty(pin_memory=True)`` for every copy (PyTorch's caching host
  allocator);
- ``pinned (reused)``: one such buffer, allocated once;
- ``registered shared memory``: an anonymous shared mapping page-locked with
  ``cudaHostRegister``;
- ``pageable``: plain host memory.

Usage::

    python -m benchmarks.d2h_copy --json d2h.json
"""

from __future__ import annotations

import argparse
import json
import mmap
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ATOMS = 108 * 2048


def _sleep_cycles(ms: float) -> int:
    """Clock cycles of ``torch.cuda._sleep`` that take about ``ms`` milliseconds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(10_000_000 * ms / start.elapsed_time(end))


def _measure(host_for: Callable[[], torch.Tensor], source: torch.Tensor, cycles: int, repeats: int) -> dict[str, Any]:
    host_ms, device_ms, pinned = [], [], []
    for _ in range(repeats):
        host = host_for()
        pinned.append(bool(host.is_pinned()))
        torch.cuda._sleep(cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t = time.perf_counter()
        host.copy_(source, non_blocking=True)
        host_ms.append(1e3 * (time.perf_counter() - t))
        end.record()
        end.synchronize()
        device_ms.append(start.elapsed_time(end))
    return {
        "host_ms": statistics.median(host_ms),
        "device_ms": statistics.median(device_ms),
        "GB_per_s": source.numel() * source.element_size() / 1e6 / statistics.median(device_ms),
        "is_pinned": all(pinned),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    source = torch.randn(ATOMS, 3, device="cuda")
    cycles = _sleep_cycles(args.busy_ms)
    nbytes = source.numel() * source.element_size()
    reused = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
    shared = mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED)
    registered = torch.frombuffer(shared, dtype=source.dtype).view(source.shape)
    code = torch.cuda.cudart().cudaHostRegister(registered.data_ptr(), nbytes, 0)
    kinds: dict[str, Callable[[], torch.Tensor]] = {
        "pinned (new)": lambda: torch.empty(source.shape, dtype=source.dtype, pin_memory=True),
        "pinned (reused)": lambda: reused,
        "registered shared memory": lambda: registered,
        "pageable": lambda: torch.empty(source.shape, dtype=source.dtype),
    }
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "busy_ms": args.busy_ms, "megabytes": nbytes / 1e6,
        "cudaHostRegister": int(code), "kinds": {},
    }
    for name, host_for in kinds.items():
        result["kinds"][name] = _measure(host_for, source, cycles, args.repeats)
        print(f"{name:26s} {json.dumps(result['kinds'][name])}", flush=True)
    torch.cuda.cudart().cudaHostUnregister(registered.data_ptr())
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
