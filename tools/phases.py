"""Where a run's time goes: wall time of chosen engine methods, device synchronised around each.

A diagnosis, not a benchmark: the synchronisations add a little to every timed call, so the
totals are larger than an untimed run's. ``python -m tools.phases w2`` times W2's run
(2048 cells of 108 atoms, FIRE, checks every step) by phase and writes a CUDA profile;
``python -m tools.phases quarantine`` times the quarantine benchmark's clean and exploding
runs by phase; ``python -m tools.phases w3 [--cells N]`` times W3's inflight run by phase
and profiles its host time (cProfile, whole run); ``python -m tools.phases prepare`` times
W2's start (``Engine.prepare``) in parts, synchronised and not. All four are meant for a GPU
(``--device cpu`` runs them on the CPU, unsynchronised).

Example:
    >>> from tools.phases import PhaseTimer
    >>> timer = PhaseTimer("cpu")
    >>> timer.totals()
    {}
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import spec
from benchmarks.report import print_report


class PhaseTimer:
    """Wraps methods of classes so each call's wall time adds to a per-name total.

    A call made inside another timed call counts only in the outer one (``check`` is the
    exception: its total is kept apart, so its parts can be read against it). ``_graph_step``
    splits into ``capture`` and ``replay`` by whether the engine captured.
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self.acc: dict[str, list[float]] = {}
        self._depth = 0
        self._originals: list[tuple[type, str, Any | None]] = []

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def wrap(self, cls: type, name: str, nested: bool = False, inside_only: bool = False) -> None:
        """Time ``cls.name`` from now on (``nested``: also inside other timed calls;
        ``inside_only``: only there, as a part of them: a step's calls run under graph capture,
        where synchronising fails)."""
        original = getattr(cls, name)
        # What the class itself defines (None: the method is inherited, restore() removes the wrap).
        self._originals.append((cls, name, cls.__dict__.get(name)))
        timer = self

        outer = 0 if nested else 1  # what this call adds to the depth of timed calls

        @functools.wraps(original)
        def timed(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if (timer._depth and outer) or (inside_only and not timer._depth):
                return original(obj, *args, **kwargs)
            timer._depth += outer
            captures = getattr(getattr(obj, "state", obj), "graph_captures", 0)
            timer._sync()
            start = time.perf_counter()
            try:
                return original(obj, *args, **kwargs)
            finally:
                timer._sync()
                key = name
                if name == "_graph_step":
                    key = "capture" if getattr(getattr(obj, "state", obj), "graph_captures", 0) != captures else "replay"
                entry = timer.acc.setdefault(key, [0, 0.0])
                entry[0] += 1
                entry[1] += time.perf_counter() - start
                timer._depth -= outer

        setattr(cls, name, timed)

    def totals(self) -> dict[str, list[float]]:
        """``{name: [calls, milliseconds]}`` since the last :meth:`clear`."""
        return {k: [int(v[0]), round(v[1] * 1e3, 3)] for k, v in self.acc.items()}

    def clear(self) -> None:
        self.acc.clear()

    def restore(self) -> None:
        """Put the wrapped methods back."""
        for cls, name, original in reversed(self._originals):
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        self._originals.clear()


def _engine_timer(device: str, parts: tuple[tuple[str, str], ...]) -> PhaseTimer:
    from alchemi_core.dynamics.admission import Admission
    from alchemi_core.dynamics.checks import Checks
    from alchemi_core.dynamics.engine import Engine
    from alchemi_core.dynamics.masks import Masks
    from alchemi_core.dynamics.step import StepLoop

    classes = {"Admission": Admission, "Checks": Checks, "Engine": Engine, "Masks": Masks, "StepLoop": StepLoop}
    timer = PhaseTimer(device)
    timer.wrap(Checks, "check", nested=True)
    for cls, name in parts:
        timer.wrap(classes[cls], name)
    return timer


def _warm_w2(device: str, cells: int) -> tuple[Any, Any, list[float]]:
    """W2's systems (``cells`` cells), the framework, and the seconds of four untimed runs."""
    from benchmarks.adapters.alchemi import Alchemi
    from benchmarks.structures import ArgonCells

    systems = ArgonCells([spec.W2_REPEAT] * cells).systems()
    framework = Alchemi()
    return systems, framework, [framework.relax(systems, device, 2000, None).seconds for _ in range(4)]


def w2(device: str, repeats: int) -> dict[str, Any]:
    """W2's run by phase (after four untimed runs), then one run under torch.profiler."""
    systems, framework, plain = _warm_w2(device, spec.W2_CELLS)
    timer = _engine_timer(device, (("Engine", "prepare"), ("StepLoop", "_graph_step"),
                                   ("Masks", "update")))
    runs = []
    for _ in range(repeats):
        timer.clear()
        outcome = framework.relax(systems, device, 2000, None)
        runs.append({"seconds": outcome.seconds, "steps": outcome.steps, "parts": timer.totals()})
    timer.restore()
    def run() -> None:
        framework.relax(systems, device, 2000, None)

    from alchemi_core.dynamics.checks import Checks
    from alchemi_core.dynamics.engine import Engine

    report: dict[str, Any] = {
        "untimed_seconds": plain,
        "runs": runs,
        "check_profile": profile_calls(Checks, "check", run),
        "prepare_profile": profile_calls(Engine, "prepare", run),
        "run_profile": profile_calls(type(framework), "relax", run, order="tottime"),
    }
    if device.startswith("cuda"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run()
        report["cuda_table"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
        report["prepare_cuda_table"] = profile_calls(Engine, "prepare", run, torch_profiler=True)
    return report


def prepare_parts() -> list[tuple[type, str]]:
    """The parts of a run's start that :func:`prepare` times, nested in ``Engine.prepare``."""
    from alchemi_core.dynamics.admission import Admission
    from alchemi_core.dynamics.engine import Engine
    from alchemi_core.dynamics.masks import Masks
    from alchemi_integrators.base import Integrator
    from alchemi_potentials.neighbors.cell_list import BatchedNeighborList
    from alchemi_potentials.neighbors.layout import Layout
    from alchemi_potentials.pair_potential import PairPotential

    return [(Admission, "fill_defaults"), (PairPotential, "check_batch"), (Integrator, "setup"),
            (Masks, "init_entering"), (Masks, "update"), (BatchedNeighborList, "update"),
            (Layout, "__init__"), (BatchedNeighborList, "_run"), (Engine, "_build_tables")]


def prepare(device: str, repeats: int, cells: int = spec.W2_CELLS) -> dict[str, Any]:
    """W2's start (``Engine.prepare``) in parts, after four untimed runs: each part's wall time
    per run, the median of ``repeats`` runs, with the device synchronised around every part
    (``synchronised``) and without (``host``), each part's calls in a run, and the runs' own
    times with each timer. Parts nest (``update`` holds the layout's ``__init__``) and count only
    inside ``prepare``."""
    import statistics

    from alchemi_core.dynamics.engine import Engine

    systems, framework, _untimed = _warm_w2(device, cells)
    report: dict[str, Any] = {"cells": cells}
    for label, timing_device in (("synchronised", device), ("host", "cpu")):
        timer = PhaseTimer(timing_device)
        timer.wrap(Engine, "prepare")
        for cls, name in prepare_parts():
            timer.wrap(cls, name, nested=True, inside_only=True)
        parts: dict[str, list[float]] = {}
        runs, calls = [], {}
        try:
            for _ in range(repeats):
                timer.clear()
                runs.append(round(framework.relax(systems, device, 2000, None).seconds * 1e3, 3))
                for key, (count, ms) in timer.totals().items():
                    parts.setdefault(key, []).append(ms)
                    calls[key] = count
        finally:
            timer.restore()
        report[label] = {key: round(statistics.median(v), 3) for key, v in parts.items()}
        report[f"{label}_calls"] = calls  # per run (the last)
        report[f"{label}_run_ms"] = runs
    return report


def profile_calls(
    cls: type, name: str, run: Any, rows: int = 40, torch_profiler: bool = False, order: str = "cumulative"
) -> str:
    """Host time by Python function inside every call of ``cls.name`` during ``run()``
    (cProfile sorted by ``order``; cumulative: a read-back's wait for the device shows in the
    call that makes it), or with ``torch_profiler`` the host and CUDA time of those calls by
    operator and kernel."""
    import cProfile
    import io
    import pstats

    original = cls.__dict__[name]
    if torch_profiler:
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        start, stop = prof.start, prof.stop
    else:
        profiler = cProfile.Profile()
        start, stop = profiler.enable, profiler.disable

    @functools.wraps(original)
    def profiled(obj: Any, *args: Any, **kwargs: Any) -> Any:
        start()
        try:
            return original(obj, *args, **kwargs)
        finally:
            if torch_profiler:
                torch.cuda.synchronize()
            stop()

    setattr(cls, name, profiled)
    try:
        run()
    finally:
        setattr(cls, name, original)
    if torch_profiler:
        return str(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(rows)
    return text.getvalue()


def quarantine(device: str, repeats: int) -> dict[str, Any]:
    """The quarantine benchmark's two runs by phase."""
    from tools import quarantine as q

    timer = _engine_timer(device, (("Checks", "_mark_quarantined"), ("Checks", "measure"),
                                   ("Admission", "graduate_and_refill"), ("StepLoop", "_core")))
    n_steps, every = 40, 10
    structures, explode = q.inputs(1000, n_steps)
    q._run(structures[:128], [], device, 64, 10, every)
    runs: dict[str, list[dict[str, Any]]] = {"clean": [], "exploding": []}
    for _ in range(repeats):
        for name, which in (("clean", []), ("exploding", explode)):
            timer.clear()
            result = q._run(structures, which, device, 64, n_steps, every)
            runs[name].append({"seconds": result["seconds"], "steps": result["steps"], "parts": timer.totals()})
    return runs


def w3(device: str, repeats: int, cells: int, check_every: tuple[int, ...], profile_only: bool = False) -> dict[str, Any]:
    """W3's inflight run by phase (after one untimed run of the same cells), compiled with each
    of ``check_every`` (steps between checks) and eager with the first, then one compiled run
    under cProfile: where the host's time goes between and around the steps. ``profile_only``:
    one small untimed run (compilation), then only the profiled run."""

    from benchmarks.adapters.alchemi import Alchemi
    from benchmarks.structures import ArgonCells

    full = ArgonCells.drawn(cells, spec.W3_REPEATS)
    framework = Alchemi()
    if profile_only:
        framework.inflight(ArgonCells.drawn(64, spec.W3_REPEATS, seed=1), device, spec.W3_MD_STEPS, None)
        return {"cells": cells, "profile": _profiled_inflight(framework, full, device)}
    untimed = framework.inflight(full, device, spec.W3_MD_STEPS, None).seconds
    timer = _engine_timer(device, (("Engine", "prepare"), ("StepLoop", "_graph_step"),
                                   ("Admission", "graduate_and_refill"), ("Masks", "update")))
    runs = []
    for _ in range(repeats):
        for compiled, every in [(True, e) for e in check_every] + [(False, check_every[0])]:
            timer.clear()
            outcome = framework.inflight(full, device, spec.W3_MD_STEPS, None, compile_step=compiled, check_every=every)
            runs.append({"compiled": compiled, "check_every": every, "seconds": outcome.seconds,
                         "out": len(outcome.ids_out), "converged": outcome.converged, "parts": timer.totals()})
    timer.restore()
    # Without the timers' synchronisations: what each interval costs when the host's work at a
    # check (the sampler's prefetch) overlaps the GPU's steps, as in the benchmark.
    plain = {}
    for every in check_every:
        outcome = framework.inflight(full, device, spec.W3_MD_STEPS, None, check_every=every)
        plain[str(every)] = {"seconds": outcome.seconds, "out": len(outcome.ids_out), "converged": outcome.converged}
    return {"cells": cells, "untimed_seconds": untimed, "runs": runs, "unsynchronised": plain,
            "profile": _profiled_inflight(framework, full, device)}


def w3_split(device: str, cells: int) -> dict[str, Any]:
    """Where a change of the set of systems costs in W3's inflight run: one compiled run with
    the capture's parts, the neighbour layout, admissions, graduations, the sampler's requests
    and the checks' measurements timed (device synchronised around each), then one plain run.
    Both after one small untimed run (compilation)."""
    from alchemi_core.dynamics import check_capture, step
    from alchemi_core.dynamics.admission import Admission
    from alchemi_core.dynamics.check_capture import CheckCapture
    from alchemi_core.dynamics.sampler import SizeAwareSampler
    from alchemi_potentials.neighbors.layout import Layout
    from benchmarks.adapters.alchemi import Alchemi
    from benchmarks.structures import ArgonCells

    full = ArgonCells.drawn(cells, spec.W3_REPEATS)
    framework = Alchemi()
    framework.inflight(ArgonCells.drawn(64, spec.W3_REPEATS, seed=1), device, spec.W3_MD_STEPS, None)
    timer = _engine_timer(device, (("StepLoop", "_graph_step"),))
    nested: list[tuple[Any, str]] = [
        (step, "capture_graph"), (check_capture, "capture_graph"), (Layout, "__init__"), (Admission, "admit"),
        (Admission, "write_to_sinks"), (SizeAwareSampler, "request_batch"), (CheckCapture, "measure"),
    ]
    for owner, name in nested:
        timer.wrap(owner, name, nested=True)
    outcome = framework.inflight(full, device, spec.W3_MD_STEPS, None)
    parts = timer.totals()
    timer.restore()
    plain = framework.inflight(full, device, spec.W3_MD_STEPS, None)
    return {"cells": cells, "timed_seconds": outcome.seconds, "parts": parts, "out": len(outcome.ids_out),
            "plain_seconds": plain.seconds, "plain_out": len(plain.ids_out)}


def _profiled_inflight(framework: Any, cells: Any, device: str) -> dict[str, Any]:
    """One compiled W3 run under cProfile: its seconds and the tables by cumulative and own time."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    outcome = framework.inflight(cells, device, spec.W3_MD_STEPS, None)
    profiler.disable()
    tables: dict[str, Any] = {"seconds": outcome.seconds, "out": len(outcome.ids_out)}
    for order in ("cumulative", "tottime"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(45)
        tables[order] = text.getvalue()
    return tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", choices=["w2", "prepare", "quarantine", "w3"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--cells", type=int, default=None, help="w3, prepare: structures (default: the workload's)")
    parser.add_argument("--profile-only", action="store_true",
                        help="w3: after a small warm-up, only the run under cProfile")
    parser.add_argument("--split", action="store_true",
                        help="w3: one run with the parts of a change of the set of systems timed (w3_split)")
    parser.add_argument("--check-every", default=None,
                        help="w3: comma-separated steps between checks to compare (default: the benchmark's)")
    args = parser.parse_args(argv)
    if args.run == "prepare":
        return print_report(prepare(args.device, args.repeats, args.cells or spec.W2_CELLS), args.json)
    if args.run == "w3":
        from benchmarks.adapters.alchemi import CHECK_EVERY_INFLIGHT

        every = str(CHECK_EVERY_INFLIGHT) if args.check_every is None else args.check_every
        if args.split:
            return print_report(w3_split(args.device, args.cells or spec.W3_CELLS), args.json)
        cells = args.cells or spec.W3_CELLS
        report = w3(args.device, args.repeats, cells, tuple(int(v) for v in every.split(",")), args.profile_only)
    else:
        report = (w2 if args.run == "w2" else quarantine)(args.device, args.repeats)
    return print_report(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
