"""The framework's own cost per step on the CPU: ``DemoDynamics`` on one 8-atom system.

Prints the model forward alone, the whole step, their difference (what the engine and the
integrator cost), and the step with the seed's hooks (``MaxForceClampHook`` every step,
``LoggingHook`` every 100 steps). One torch thread; medians of 7 repeats of 2000 steps.

    python -m tools.engine_overhead [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from alchemi_core.dynamics import DemoDynamics
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch

STEPS, REPEATS = 2000, 7


def per_call_us(run: Callable[[int], Any], n: int = STEPS) -> float:
    """Median over repeats of the time per call of ``run(n)`` (n calls), in µs."""
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        run(n)
        times.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(times)


def step_cost(model: DemoModelWrapper, hooks: list[Any]) -> float:
    dynamics = DemoDynamics(model=model, n_steps=10, dt=0.5, hooks=hooks)
    dynamics.run(make_batch([8]))  # prepares the engine, builds the hook tables
    engine = dynamics._engine
    assert engine is not None
    return per_call_us(lambda n: [engine.step() for _ in range(n)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from alchemi_core.dynamics.hooks import LoggingHook, MaxForceClampHook

    model = DemoModelWrapper()
    batch = make_batch([8])
    forward = per_call_us(lambda n: [model(batch) for _ in range(n)])
    plain = step_cost(model, [])
    with tempfile.TemporaryDirectory() as tmp:
        seed_hooks = step_cost(model, [MaxForceClampHook(max_force=10.0),
                                       LoggingHook(backend="csv", log_path=str(Path(tmp) / "md_log.csv"), frequency=100)])
    result = {"forward_us": forward, "step_us": plain, "framework_us": plain - forward, "seed_hooks_step_us": seed_hooks}
    for k, v in result.items():
        print(f"{k:20s} {v:8.1f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
