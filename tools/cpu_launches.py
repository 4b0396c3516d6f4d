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
neighbour list (``layout.HALF_LIST``), ``--search-trim`` whether the search skips
bins beyond the list radius (``layout.SEARCH_TRIM``), ``--search-listed`` whether it walks a list
of the rebuilding slots (``layout.SEARCH_LISTED``), ``--langevin-backend`` the Langevin step's backend.

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
                        help="pairs past the cutoff masked or branched around (default: pair_potential.MASKED)")
    parser.add_argument("--pair-lanes", choices=("on", "off"), default=None,
                        help="neighbours in SIMD lanes or one at a time (default: pair_potential.LANES)")
    parser.add_argument("--list", choices=("half", "full"), default=None,
                        help="the neighbour list a CPU makes (default: layout.HALF_LIST)")
    parser.add_argument("--search-trim", choices=("on", "off"), default=None,
                        help="the search skips bins beyond the list radius or walks the whole box "
                             "(default: layout.SEARCH_TRIM)")
    parser.add_argument("--search-listed", choices=("on", "off"), default=None,
                        help="the search walks a list of the rebuilding slots or every slot "
                             "(default: layout.SEARCH_LISTED)")
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
    from alchemi_potentials import pair_potential
    from alchemi_potentials.neighbors import layout
    from benchmarks.adapters.alchemi import Alchemi
    from benchmarks.structures import replicated_crystal

    given = (
        (pair_potential.MASKED, "cpu", args.pair_masked and args.pair_masked == "on"),
        (pair_potential.LANES, "cpu", args.pair_lanes and args.pair_lanes == "on"),
        (layout.HALF_LIST, "cpu", args.list and args.list == "half"),
        (layout.SEARCH_TRIM, "cpu", args.search_trim and args.search_trim == "on"),
        (layout.SEARCH_LISTED, "cpu", args.search_listed and args.search_listed == "on"),
        (Langevin, "cpu_backend", args.langevin_backend),
    )
    timer = LaunchTimer()
    with chosen([(owner, key, value) for owner, key, value in given if value is not None]):
        try:
            sim = Alchemi().md(replicated_crystal(args.atoms, args.systems, spec.LANGEVIN.temperature, seed=0), "cpu")
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
