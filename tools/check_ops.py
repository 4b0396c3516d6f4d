"""Device operations a W2-shaped relaxation launches at its checks, by part (a diagnosis).

On a GPU each eager torch operation costs the host some 10-25 us to launch, and at a check the
device waits for the host: a check's measurement is one captured graph, but what the engine does
after the read-back (systems that converged leave FIRE at rest, masks rewritten, stages set up
for newcomers) and what FIRE rebuilds from the new masks before the next step run eagerly.
This counts those operations with torch's dispatcher over one relaxation (``--cells`` cells of
108 argon atoms rattled as W2's, FIRE to 0.05 eV/Å, a check every step) and prints each part's
operations per check at which some system converged. Counts, not times: the host-written flow's,
which CPUs run; on a GPU a compiled relaxation's step rewrites the masks itself
(``CoreTuning.masks_in_step``), so the mask and cache parts there are inside the step's graph.

    python -m tools.check_ops --cells 64

Example:
    >>> counter = OpCounter()
    >>> counter.per_call()
    {}
"""

from __future__ import annotations

import argparse
import functools
import json
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: The engine's and integrators' methods counted: part name -> (module, class or None, name).
PARTS = {
    "rest_after_optimisers": ("alchemi_core.dynamics.checks", None, "_rest_after_optimisers"),
    "init_entering": ("alchemi_core.dynamics.masks", "Masks", "init_entering"),
    "update_masks": ("alchemi_core.dynamics.masks", "Masks", "update"),
    # A rebuilt derived value is copied into the one a captured step reads.
    "derived_copy": ("alchemi_core.dynamics.context", None, "_copy_into"),
}
#: Operations that only describe a tensor (views), not device work.
VIEWS = {"aten.unsqueeze.default", "aten.view.default", "aten.lift_fresh.default", "aten.slice.Tensor",
         "aten.select.int", "aten.alias.default", "aten.t.default", "aten.expand.default"}


class _Count(TorchDispatchMode):
    def __init__(self, counter: OpCounter, part: str) -> None:
        super().__init__()
        self.counter, self.part = counter, part

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if str(func) not in VIEWS:
            self.counter.ops[self.part] += 1
        return func(*args, **(kwargs or {}))


class OpCounter:
    """Calls of, and device operations inside, the wrapped functions (innermost part counts)."""

    def __init__(self) -> None:
        self.ops: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._restore: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, part: str) -> None:
        original = getattr(owner, name)
        counter = self

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            counter.calls[part] += 1
            with _Count(counter, part):
                return original(*args, **kwargs)

        self._restore.append((owner, name, original))
        setattr(owner, name, counted)

    def wrap_cache_builds(self) -> None:
        """Count ``Integrator.cached``'s rebuilds (the values an integrator derives per run or per
        mask rewrite) as the part ``integrator_cache``."""
        from alchemi_integrators.base import Integrator

        original = Integrator.cached
        counter = self

        def cached(dyn: Any, name: str, batch: Any, build: Any, *args: Any, **kwargs: Any) -> Any:
            def counted_build() -> Any:
                counter.calls["integrator_cache"] += 1
                with _Count(counter, "integrator_cache"):
                    return build()

            return original(dyn, name, batch, counted_build, *args, **kwargs)

        self._restore.append((Integrator, "cached", original))
        Integrator.cached = cached  # type: ignore[method-assign]

    def restore(self) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    def per_call(self) -> dict[str, dict[str, int]]:
        return {part: {"calls": self.calls[part], "ops": self.ops[part]} for part in self.calls}


def count(cells: int, device: str) -> dict[str, Any]:
    """One W2-shaped relaxation with the parts counted; the operations per converged check."""
    import importlib

    from benchmarks.adapters.alchemi import Alchemi
    from benchmarks.structures import ArgonCells

    systems = ArgonCells([3] * cells).systems()
    framework = Alchemi()
    framework.relax(systems, device, 2000, None)  # compiled and warm, outside the count
    counter = OpCounter()
    for part, (module, cls, name) in PARTS.items():
        owner = importlib.import_module(module)
        counter.wrap(getattr(owner, cls) if cls else owner, name, part)
    counter.wrap_cache_builds()
    try:
        outcome = framework.relax(systems, device, 2000, None)
    finally:
        counter.restore()
    parts = counter.per_call()
    parts["total"] = {"calls": 0, "ops": sum(entry["ops"] for entry in parts.values())}
    # Every check where a system converged calls _rest_after_optimisers once; the run's start
    # rewrites the masks and sets up every stage once more, and builds every cached value.
    converged_checks = counter.calls["rest_after_optimisers"]
    return {"cells": cells, "device": device, "steps": outcome.steps, "converged_checks": converged_checks,
            "parts": parts}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    report = count(args.cells, args.device)
    print(f"{report['cells']} cells, {report['steps']} steps, {report['converged_checks']} checks where a system converged")
    print(f"{'part':<24}{'calls':>7}{'ops':>7}")
    for part, entry in report["parts"].items():
        print(f"{part:<24}{entry['calls']:>7}{entry['ops']:>7}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
