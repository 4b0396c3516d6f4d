"""Pipeline scenarios run on every rank of a real process group (and their single-rank
references), shared by the tests in ``test_pipeline_*.py``.

Each scenario function takes the rank's joined ``CommBackend`` (from ``alchemi_nccl.spawn``) and
returns what the test checks. Run as a script, the file is one rank of a launched job (the
environment torchrun sets), for the failure tests::

    python pipeline_scenarios.py fail --fail-rank 1 --timeout 60
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from typing import Any

import numpy as np
import torch

from alchemi_core.data import Batch
from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import DemoDynamics, DistributedPipeline, DynamicsStage, FusedStage, HostMemory
from alchemi_core.dynamics.base import BufferConfig
from alchemi_core.dynamics.sampler import SizeAwareSampler
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing.factories import make_batch, random_structures

#: Per-stage step budgets and time steps (fs); the stages differ so a mix-up would show.
STEPS = (3, 5, 2, 4)
DTS = (0.5, 0.25, 0.4, 0.3)
#: Atoms per structure: uneven, so segment offsets and edge shifts matter.
SIZES = (3, 5, 2, 4, 6, 3, 2, 5, 4)
#: A send buffer far smaller than what graduates at once: forces back-pressure.
TINY = BufferConfig(num_systems=2, num_nodes=9, num_edges=9)


def structures() -> Batch:
    """Every dtype the data model keeps: int64 atomic numbers, bool ``frozen``, float64
    positions and ``charges``, int32 ``tag``, float64 ``dipole`` [1, 3], ring edges."""
    return make_batch(list(SIZES), edges=True, extras=True, dtype=torch.float64)


def sampler() -> SizeAwareSampler:
    data = random_structures(list(SIZES), edges=True, extras=True, dtype=torch.float64)
    return SizeAwareSampler(ListDataset(data), max_atoms=12, max_batch_size=3, bin_width=2)


def make_stages(n_stages: int, mode: str, buffer: BufferConfig | None, with_sampler: bool) -> list[DemoDynamics]:
    """``n_stages`` velocity-Verlet stages; the last writes to an unlimited HostMemory."""
    model = DemoModelWrapper()
    stages = []
    for r in range(n_stages):
        last = r == n_stages - 1
        stages.append(DemoDynamics(
            model=model, n_steps=STEPS[r], dt=DTS[r], comm_mode=mode, buffer_config=buffer,
            sampler=sampler() if with_sampler and r == 0 else None,
            sinks=[HostMemory(capacity=None)] if last else None,
        ))
    return stages


def fused_reference(n_stages: int, with_sampler: bool) -> Batch:
    """The same stages fused on one rank: what the pipeline must reproduce per system."""
    stages = make_stages(n_stages, "sync", None, with_sampler)
    stages[-1].sinks = []
    fused = FusedStage([(i, s) for i, s in enumerate(stages)])
    out = fused.run(None if with_sampler else structures())
    assert out is not None
    return out


def by_system_id(batch: Batch) -> Batch:
    """The systems of ``batch`` in ``system_id`` order."""
    return batch.index_select(torch.argsort(batch.system_id.cpu()))


def as_arrays(batch: Batch) -> dict[str, Any]:
    """Every field as a numpy array (picklable), plus per-system sizes."""
    fields = {k: getattr(batch, k).detach().cpu().numpy() for k in batch.keys()}
    fields["__num_nodes"] = np.asarray(batch.num_nodes_list)
    fields["__num_edges"] = np.asarray(batch.num_edges_list)
    return fields


def sink_contents(stage: Any) -> dict[str, Any]:
    """The last stage's sink: the ids in arrival order and every field in ``system_id`` order."""
    held = stage.sinks[0].read()
    return {"arrival_ids": held.system_id.tolist(), "fields": as_arrays(by_system_id(held))}


def _stats(rank: Any) -> dict[str, int]:
    return {
        "entered": rank.entered, "left": rank.left, "received": rank.received, "staged": rank.staged,
        "held_back": rank.held_back, "iterations": rank.iterations, "rounds": rank.rounds,
        "schema_renewals": rank.link.schema_renewals, "deferred": rank.deferred, "max_in_flight": rank.link.max_in_flight,
    }


class Stall:
    """Sleeps ``seconds`` at the given steps of its stage (every step: ``at=None``) and records
    when each step ended (wall clock, comparable between the processes of one host)."""

    stage = DynamicsStage.AFTER_STEP
    frequency = 1

    def __init__(self, seconds: float, at: tuple[int, ...] | None = None) -> None:
        self.seconds, self.at = seconds, at
        self.ends: list[float] = []

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        if self.at is None or dynamics.step_count in self.at:
            time.sleep(self.seconds)
        self.ends.append(time.time())


def run_ahead(
    backend: Any, n_stages: int, queue_depth: int, slow_rank: int, seconds: float, at: tuple[int, ...] | None
) -> dict[str, Any]:
    """``fully_async`` stages with a tiny frame; ``slow_rank`` stalls. Every rank returns its
    counters and the end times of its steps; the last also its sink."""
    stages = make_stages(n_stages, "fully_async", TINY, False)
    stall = Stall(seconds if backend.rank == slow_rank else 0.0, at)
    stages[backend.rank].hooks.append(stall)
    pipeline = DistributedPipeline(dict(enumerate(stages)), backend=backend, timeout_s=60.0, device="cpu",
                                   queue_depth=queue_depth)
    pipeline.run(structures() if backend.rank == 0 else None)
    out: dict[str, Any] = {"rank": backend.rank, "step_ends": stall.ends, **_stats(stages[backend.rank].pipeline_rank)}
    if backend.rank == n_stages - 1:
        out["sink"] = sink_contents(stages[-1])
    return out


def chain(
    backend: Any, n_stages: int, mode: str, buffer: bool, with_sampler: bool, device: str | None = "cpu"
) -> dict[str, Any]:
    """Run ``n_stages`` stages over the group; the last rank returns its sink's contents.

    ``device`` None lets the pipeline choose (the backend's GPU for NCCL)."""
    stages = make_stages(n_stages, mode, TINY if buffer else None, with_sampler)
    pipeline = DistributedPipeline(dict(enumerate(stages)), backend=backend, timeout_s=60.0, device=device)
    rank = backend.rank
    result = pipeline.run(structures() if rank == 0 and not with_sampler else None)
    stage = stages[rank]
    out: dict[str, Any] = {"rank": rank, "result_is_none": result is None, **_stats(stage.pipeline_rank)}
    if rank == n_stages - 1:
        out["sink"] = sink_contents(stage)
    return out


class AddSpin:
    """Adds a float64 atom field ``spin`` (from the atomic numbers) once, mid-run: a field the
    pipeline's buffers did not have at setup."""

    stage = DynamicsStage.AFTER_STEP
    frequency = 1

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        if dynamics.step_count == 1 and "spin" not in batch:
            batch.set_field("spin", batch.atomic_numbers.to(torch.float64) * 0.5, "node")


def mixed_modes(backend: Any) -> dict[str, Any]:
    """Three ranks, each in another comm mode, with the synchronized flag on; rank 0 adds a
    field mid-run."""
    stages = make_stages(3, "sync", TINY, False)
    for s, mode in zip(stages, ("fully_async", "sync", "async_recv")):
        s.comm_mode = mode
    stages[0].hooks.append(AddSpin())
    pipeline = DistributedPipeline(dict(enumerate(stages)), backend=backend, timeout_s=60.0, synchronized=True, device="cpu")
    pipeline.run(structures() if backend.rank == 0 else None)
    out: dict[str, Any] = {"rank": backend.rank, **_stats(stages[backend.rank].pipeline_rank)}
    if backend.rank == 2:
        out["sink"] = sink_contents(stages[2])
    return out


# ---------------------------------------------------------------------- failures
class FailAt:
    """A hook that raises (or hangs) at a given step of its stage."""

    stage = DynamicsStage.AFTER_STEP
    frequency = 1

    def __init__(self, step: int, hang_s: float = 0.0, kill: bool = False) -> None:
        self.step = step
        self.hang_s = hang_s
        self.kill = kill

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        if dynamics.step_count == self.step:
            print(f"FAIL_AT {time.time():.3f}", flush=True)
            if self.kill:  # no error report, no error frame: the process just disappears
                os.kill(os.getpid(), signal.SIGKILL)
            if self.hang_s:
                time.sleep(self.hang_s)
            else:
                raise RuntimeError("injected failure in the stage")


def raising(backend: Any, fail_rank: int) -> None:
    """Three ranks; ``fail_rank``'s stage raises at its 6th step (the process lives on)."""
    stages = make_stages(3, "async_recv", TINY, False)
    for s in stages:
        s.n_steps = 40
    stages[fail_rank].hooks.append(FailAt(step=6))
    pipeline = DistributedPipeline(dict(enumerate(stages)), backend=backend, timeout_s=60.0, device="cpu")
    pipeline.run(structures() if backend.rank == 0 else None)


def salvage_main(argv: list[str]) -> int:
    """One rank of a job whose ``--kill-rank`` is SIGKILLed at its ``--kill-step``: every stage
    has a HostMemory sink (the last one's holds results, the others' take overflow and, after a
    peer failure, what the rank held). A survivor prints ``SALVAGE {json}``: its error's fields
    and its sink's ``(system_id, status)`` pairs."""
    import json

    from alchemi_core.dynamics.pipeline_salvage import RankLostError

    p = argparse.ArgumentParser()
    p.add_argument("--steps", default="40,40", help="n_steps per stage, comma-separated")
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--kill-step", type=int, default=2)
    args = p.parse_args(argv)
    steps = [int(x) for x in args.steps.split(",")]
    model = DemoModelWrapper()
    stages = [
        DemoDynamics(model=model, n_steps=n, dt=DTS[r], comm_mode="async_recv", buffer_config=TINY,
                     sinks=[HostMemory(capacity=None)])
        for r, n in enumerate(steps)
    ]
    stages[args.kill_rank].hooks.append(FailAt(step=args.kill_step, kill=True))
    rank = int(os.environ["RANK"])
    try:
        with DistributedPipeline(dict(enumerate(stages)), backend="comm:gloo", timeout_s=60.0, device="cpu") as pipeline:
            pipeline.run(structures() if rank == 0 else None)
    except RankLostError as exc:
        sink = stages[rank].sinks[0]
        held = sink.read() if len(sink) else None
        pairs = list(zip(held.system_id.tolist(), held.status.reshape(-1).tolist())) if held is not None else []
        report = {"peer": exc.peer, "saved": exc.saved, "lost": exc.lost,
                  "received_from_peer": exc.received_from_peer, "sink": pairs, "message": str(exc)}
        print(f"SALVAGE {json.dumps(report)}", flush=True)
        return 3
    print("EXIT_OK", flush=True)
    return 0


def launched_main(argv: list[str]) -> int:
    """One rank of a launched job: ``run`` a pipeline, or make ``--fail-rank`` raise (``fail``),
    hang (``hang``) or be killed (``kill``) mid-run. Prints ``EXIT_OK``/``EXIT_ERROR`` with a
    time stamp."""
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["run", "fail", "hang", "kill"])
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--mode", default="async_recv")
    p.add_argument("--backend", default="comm:gloo")
    p.add_argument("--device", default="cpu", help="'auto': let the pipeline choose")
    args = p.parse_args(argv)
    stages = make_stages(args.stages, args.mode, TINY, False)
    if args.what != "run":
        for s in stages:
            s.n_steps = 40  # long enough that every rank is mid-run when the failure comes
        hang = 2 * args.timeout if args.what == "hang" else 0.0
        stages[args.fail_rank].hooks.append(FailAt(step=6, hang_s=hang, kill=args.what == "kill"))
    rank = int(os.environ["RANK"])
    try:
        device = None if args.device == "auto" else args.device
        with DistributedPipeline(dict(enumerate(stages)), backend=args.backend, timeout_s=args.timeout, device=device) as pipeline:
            pipeline.run(structures() if rank == 0 else None)
    except BaseException as exc:
        traceback.print_exc()
        print(f"EXIT_ERROR {time.time():.3f} {type(exc).__name__}: {exc}", flush=True)
        return 3
    if rank == args.stages - 1:
        ids = sorted(stages[-1].sinks[0].read().system_id.tolist())
        print(f"SINK_IDS {ids}", flush=True)
    print(f"EXIT_OK {time.time():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["salvage"]:
        sys.exit(salvage_main(sys.argv[2:]))
    sys.exit(launched_main(sys.argv[1:]))
