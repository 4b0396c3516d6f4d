"""Where W6's step goes on a CPU: every Warp launch of a W1-shaped Langevin run, timed.

Each CPU launch of a Warp kernel is timed around Warp's call into the kernel and summed by
kernel over ``--steps`` steps, after ``--equilibrate``. Kernels cut into ranges (the pair
kernel, the neighbour search) run on the native executor where Warp allows it, which calls the
kernel itself: they are timed as the calling thread's wall time of all ranges, labelled
``"<kernel> (ranges, wall)"``; through the thread pool (``--variant``-free fallback, or
``alchemi_core.cpu_executor.ENABLED = False``) each range is timed and summed over the threads, so
those totals can exceed their share of the step's wall time. ``--optimization-level`` and
``--cpu-flags`` set Warp's CPU compiler options before anything is compiled; ``--pair-masked``
chooses how the pair kernel treats listed pairs past the cutoff, ``--pair-lanes`` whether it takes
neighbours in SIMD lanes (``alchemi_potentials.pair_lanes``), ``--list`` a half or a full
neighbour list (``PotentialsTuning.half_list``), ``--search-trim`` whether the search skips
bins beyond the list radius (``PotentialsTuning.search_trim``), ``--search-listed`` whether it walks
a list of the rebuilding slots (``PotentialsTuning.force_search_listed``), ``--langevin-backend``
the Langevin step's backend.

    python -m tools.cpu_launches --atoms 108 --systems 64 --steps 500

Example:
    >>> sorted(LaunchTimer().per_step(10))
    []
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks import spec
from benchmarks.choices import chosen
from benchmarks.timing import CallTimer


class LaunchTimer:
    """Wall time of Warp's CPU kernel calls, by kernel (installed with :meth:`install`)."""

    def __init__(self) -> None:
        self._calls = CallTimer()

    def install(self) -> None:
        import warp._src.context as context

        from alchemi_core import cpu_executor

        self._calls.wrap(context, "invoke", lambda kernel, *args: kernel.key)
        self._calls.wrap(cpu_executor.Prepared, "run", lambda prepared: f"{prepared.key} (ranges, wall)")

    def restore(self) -> None:
        self._calls.restore()

    def per_step(self, steps: int) -> dict[str, dict[str, float]]:
        """``{kernel: {launches, ms}}`` per step, costliest first."""
        seconds, calls = self._calls.seconds, self._calls.calls
        rows = sorted(seconds, key=lambda k: -seconds[k])
        return {k: {"launches": calls[k] / steps, "ms": 1e3 * seconds[k] / steps} for k in rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.cpu_launches", description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=108, help="atoms per system")
    parser.add_argument("--systems", type=int, default=64)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--equilibrate", type=int, default=300)
    parser.add_argument("--optimization-level", type=int, default=None, help="Warp's, for CPU kernels (default 2)")
    parser.add_argument("--cpu-flags", default=None, help="Warp's CPU compiler flags (default -march=native)")
    parser.add_argument("--pair-masked", choices=("on", "off"), default=None,
                        help="pairs past the cutoff masked or branched around (default: PotentialsTuning.masked)")
    parser.add_argument("--pair-lanes", choices=("on", "off"), default=None,
                        help="neighbours in SIMD lanes or one at a time (default: PotentialsTuning.lanes)")
    parser.add_argument("--list", choices=("half", "full"), default=None,
                        help="the neighbour list a CPU makes (default: PotentialsTuning.half_list)")
    parser.add_argument("--search-trim", choices=("on", "off"), default=None,
                        help="the search skips bins beyond the list radius or walks the whole box "
                             "(default: PotentialsTuning.search_trim)")
    parser.add_argument("--search-listed", choices=("on", "off"), default=None,
                        help="the search walks a list of the rebuilding slots or every slot "
                             "(default: PotentialsTuning.search_listed)")
    parser.add_argument("--langevin-backend", choices=("torch", "warp"), default=None,
                        help="the Langevin step's backend on a CPU (default: Langevin.cpu_backend)")
    args = parser.parse_args(argv)
    import warp

    if args.optimization_level is not None:
        warp.config.optimization_level = args.optimization_level
    if args.cpu_flags is not None:
        warp.config.cpu_compiler_flags = args.cpu_flags
    import torch

    from alchemi_integrators.langevin import Langevin
    from benchmarks.adapters.alchemi import Alchemi
    from benchmarks.structures import replicated_crystal

    flags = {"masked": args.pair_masked, "lanes": args.pair_lanes, "half_list": args.list and args.list == "half",
             "search_trim": args.search_trim, "force_search_listed": args.search_listed}
    tuning = ",".join(f"{name}={value in (True, 'on')}" for name, value in flags.items() if value is not None)
    given = [(Langevin, "cpu_backend", args.langevin_backend)] if args.langevin_backend is not None else []
    timer = LaunchTimer()
    with chosen(given):
        try:
            sim = Alchemi(tuning).md(replicated_crystal(args.atoms, args.systems, spec.LANGEVIN.temperature, seed=0),
                                     "cpu")
            sim.run(args.equilibrate)
            timer.install()
            start = time.perf_counter()
            sim.run(args.steps)
            step_ms = 1e3 * (time.perf_counter() - start) / args.steps
        finally:
            timer.restore()
    print(json.dumps({"atoms": args.atoms, "systems": args.systems, "threads": torch.get_num_threads(),
                      "step_ms": step_ms, "launches_per_step": timer.per_step(args.steps)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
