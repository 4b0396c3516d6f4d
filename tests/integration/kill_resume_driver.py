"""Kill a checkpointed inflight run with SIGKILL at random steps, resume it until it finishes, and
compare what its sink holds with an uninterrupted run (``test_kill_and_resume.py`` runs this).

One process imports torch once and forks a child per attempt (a fresh interpreter per attempt
would cost seconds each). A child runs the workflow, resuming from the checkpoint when there is
one, and kills itself with SIGKILL at the step the parent drew; the parent waits and starts the
next attempt, until one finishes. The parent touches no Zarr store until every child is done
(zarr's event-loop thread would not survive a fork).

Usage: ``python kill_resume_driver.py SINK TRIALS SEED WORKDIR [RUN]`` with SINK ``zarr`` or
``host`` and RUN ``fused`` (relax then MD, the default) or ``static`` (``integrator:static``);
prints one JSON object: per trial the kills made, the system ids found and whether the final
state equals the uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from alchemi_core.data.datapipes import ListDataset  # noqa: E402
from alchemi_core.dynamics import (  # noqa: E402
    ConvergenceHook,
    DemoDynamics,
    DynamicsStage,
    Hook,
    HostMemory,
    SizeAwareSampler,
)
from alchemi_core.dynamics import checkpoint as ckpt  # noqa: E402
from alchemi_core.dynamics.static import Static  # noqa: E402
from alchemi_core.models.demo import DemoModelWrapper  # noqa: E402
from alchemi_core.testing import random_structures  # noqa: E402

SIZES = [3, 5, 4, 2, 6, 3, 4, 5, 2, 3, 4, 6, 5, 3]
RUN = sys.argv[5] if len(sys.argv) > 5 else "fused"


def _warm_up() -> None:
    """Import Warp and load the health-check kernels here, once, so that the forked children
    inherit them (each child would otherwise spend most of its second doing that itself)."""
    from alchemi_core.dynamics.quarantine import HealthCheck
    from alchemi_core.testing import make_batch

    HealthCheck().codes(make_batch([3], dtype=torch.float64))
FIELDS = ("positions", "velocities", "status", "energy")


class KillAt(Hook):
    """SIGKILL this process at step ``at`` (at its hook point)."""

    def __init__(self, at: int, stage: DynamicsStage) -> None:
        super().__init__(frequency=1, stage=stage)
        self.at = at

    def __call__(self, batch, dynamics) -> None:
        if dynamics.step_count == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


def _sink(kind: str, where: Path):
    if kind == "zarr":
        from alchemi_zarr import ZarrData

        return ZarrData(str(where / "out.zarr"))
    return HostMemory(capacity=None)


def _workflow(kind: str, where: Path, hooks=()):
    dataset = ListDataset(random_structures(SIZES, dtype=torch.float64))
    sampler = SizeAwareSampler(dataset, max_atoms=16, max_batch_size=4, bin_width=1)
    sink = _sink(kind, where)
    model = DemoModelWrapper()
    if RUN == "static":
        return Static(model, sampler=sampler, sinks=[sink], hooks=list(hooks)), sink
    opt = DemoDynamics(model=model, n_steps=9, dt=0.5, sampler=sampler, refill_frequency=2, sinks=[sink],
                       convergence_hook=ConvergenceHook.from_fmax(0.3, frequency=2), hooks=list(hooks))
    return opt + DemoDynamics(model=model, n_steps=6, dt=0.5), sink


def _child(kind: str, where: Path, kill_at: int | None, point: DynamicsStage) -> None:
    """Run (or resume) the workflow in this forked process; never returns."""
    code = 0
    try:
        hooks = [KillAt(kill_at, point)] if kill_at is not None else []
        fused, sink = _workflow(kind, where, hooks)
        path = where / "run.ckpt"
        resume = path if path.exists() else None
        fused.run(checkpoint=path, checkpoint_every=3, resume_from=resume)
        (where / "steps.txt").write_text(str(fused.step_count))
        if kind == "host":
            torch.save(ckpt.batch_state(sink.read()), where / "result.pt")
        else:
            sink.close()
    except BaseException as exc:  # noqa: BLE001 - reported through the exit status
        (where / "error.txt").write_text(repr(exc))
        code = 3
    os._exit(code)


def _attempt(kind: str, where: Path, kill_at: int | None, point: DynamicsStage) -> int:
    pid = os.fork()
    if pid == 0:
        _child(kind, where, kill_at, point)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _result(kind: str, where: Path) -> dict[str, torch.Tensor]:
    if kind == "host":
        from alchemi_core.dynamics.checkpoint import batch_from_state

        batch = batch_from_state(torch.load(where / "result.pt", weights_only=True), "cpu")
    else:
        from alchemi_zarr import ZarrData

        batch = ZarrData(str(where / "out.zarr")).read()
    order = torch.argsort(batch.system_id)
    batch = batch.index_select(order)
    out = {k: getattr(batch, k).clone() for k in FIELDS}
    out["system_id"] = batch.system_id.clone()
    return out


def main(kind: str, trials: int, seed: int, workdir: Path) -> dict:
    rng = random.Random(seed)
    _warm_up()
    reference = workdir / "reference"
    reference.mkdir(parents=True)
    if _attempt(kind, reference, None, DynamicsStage.AFTER_STEP) != 0:
        raise RuntimeError((reference / "error.txt").read_text())
    steps = int((reference / "steps.txt").read_text())
    report = []
    for t in range(trials):
        where = workdir / f"trial-{t}"
        where.mkdir()
        kills, attempts = [], 0
        while True:
            attempts += 1
            # One or two kills per trial, at a random step and hook point; then let it finish.
            kill_at = rng.randrange(0, steps) if len(kills) < rng.choice((1, 2)) and attempts < 4 else None
            point = rng.choice((DynamicsStage.BEFORE_STEP, DynamicsStage.AFTER_STEP, DynamicsStage.AFTER_COMPUTE))
            rc = _attempt(kind, where, kill_at, point)
            if rc == -signal.SIGKILL:
                kills.append(kill_at)
                continue
            if rc != 0:
                raise RuntimeError(f"trial {t}: {(where / 'error.txt').read_text()}")
            break
        report.append({"trial": t, "kills": kills, "where": str(where)})
    expected = _result(kind, reference)
    for entry in report:
        got = _result(kind, Path(entry["where"]))
        entry["system_ids"] = got["system_id"].tolist()
        entry["same"] = all(
            got[k].shape == expected[k].shape and torch.equal(got[k], expected[k]) for k in (*FIELDS, "system_id")
        )
    return {"expected_ids": expected["system_id"].tolist(), "steps": steps, "trials": report}


if __name__ == "__main__":
    kind, trials, seed, workdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    print(json.dumps(main(kind, trials, seed, workdir)))
