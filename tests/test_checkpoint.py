"""Checkpoints: a resumed run gives the uninterrupted run's result, and a checkpoint is data."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import ConvergenceHook, DemoDynamics, DynamicsStage, Hook, HostMemory, SizeAwareSampler
from alchemi_core.dynamics import checkpoint as ckpt
from alchemi_core.errors import DamagedCheckpointError, InvalidDataError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch, random_structures


class Interrupt(Hook):
    """Raises at a given step, as a crash or a killed job would."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self, at: int):
        super().__init__(frequency=1)
        self.at = at

    def __call__(self, batch, dynamics):
        if dynamics.step_count == self.at:
            raise KeyboardInterrupt("the job was stopped")


def test_a_resumed_single_stage_run_matches_the_uninterrupted_one(tmp_path):
    model = DemoModelWrapper()
    whole = make_batch([3, 4, 2], dtype=torch.float64)
    DemoDynamics(model=model, n_steps=40, dt=0.5).run(whole)
    part = make_batch([3, 4, 2], dtype=torch.float64)
    DemoDynamics(model=model, n_steps=40, dt=0.5).run(part, n_steps=17, checkpoint=tmp_path / "run.ckpt")
    resumed = DemoDynamics(model=model, n_steps=40, dt=0.5).run(resume_from=tmp_path / "run.ckpt")
    torch.testing.assert_close(resumed.positions, whole.positions, rtol=0, atol=0)
    torch.testing.assert_close(resumed.velocities, whole.velocities, rtol=0, atol=0)


def _fused(dataset, sink, hooks=()):
    model = DemoModelWrapper()
    sampler = SizeAwareSampler(dataset, max_atoms=30, max_batch_size=6, bin_width=2)
    opt = DemoDynamics(model=model, n_steps=9, dt=0.5, sampler=sampler, refill_frequency=2, sinks=[sink],
                       convergence_hook=ConvergenceHook.from_fmax(0.3, frequency=2), hooks=list(hooks))
    return opt + DemoDynamics(model=model, n_steps=6, dt=0.5)


def test_an_interrupted_inflight_run_resumes_to_the_same_results(tmp_path):
    dataset = ListDataset(random_structures([3, 5, 4, 2, 6, 3, 4, 5, 2, 3, 4, 6] * 2, dtype=torch.float64))
    reference = HostMemory(capacity=None)
    _fused(dataset, reference).run()
    expected = reference.read()

    sink = HostMemory(capacity=None)
    with pytest.raises(KeyboardInterrupt):
        _fused(dataset, sink, hooks=[Interrupt(at=23)]).run(checkpoint=tmp_path / "c.ckpt", checkpoint_every=5)
    # A new process would build everything anew: a new sink too, restored from the checkpoint.
    fresh_sink = HostMemory(capacity=None)
    _fused(dataset, fresh_sink).run(resume_from=tmp_path / "c.ckpt")
    got = fresh_sink.read()
    assert sorted(got.system_id.tolist()) == list(range(len(dataset)))
    order_got = torch.argsort(got.system_id)
    order_exp = torch.argsort(expected.system_id)
    for field in ("positions", "velocities", "status"):
        a = got.index_select(order_got)
        b = expected.index_select(order_exp)
        torch.testing.assert_close(getattr(a, field), getattr(b, field), rtol=0, atol=0)


def test_checkpoints_are_written_atomically_and_read_as_data(tmp_path):
    path = tmp_path / "run.ckpt"
    DemoDynamics(model=DemoModelWrapper(), n_steps=10, dt=0.5).run(make_batch([3]), checkpoint=path, checkpoint_every=4)
    state = ckpt.load(path)
    assert state["step_count"] == 10 and not (tmp_path / "run.ckpt.writing").exists()

    class Payload:
        def __reduce__(self):
            return (open, (str(tmp_path / "pwned"), "w"))

    # A crafted file with a valid checksum and a pickled object: refused, without running it.
    evil = tmp_path / "evil.ckpt"
    ckpt.write_state({"format": ckpt.FORMAT, "version": 2, "x": Payload()}, evil)
    with pytest.raises(DamagedCheckpointError, match="objects other than tensors") as refused:
        ckpt.load(evil)
    assert "weights_only" not in str(refused.value)
    assert not (tmp_path / "pwned").exists()
    (tmp_path / "other.ckpt").write_text("something else\n")
    with pytest.raises(InvalidDataError, match="not an alchemi checkpoint"):
        ckpt.load(tmp_path / "other.ckpt")


def test_a_stopped_run_ends_after_a_check_and_resumes_over_the_structures_not_stored(tmp_path):
    from alchemi_core.dynamics.stored import stored_results
    from alchemi_core.parallel import ShardDataset

    sizes = [3, 5, 4, 2, 6, 3, 4, 5, 2, 3, 4, 6] * 2
    dataset = ListDataset(random_structures(sizes, dtype=torch.float64))
    reference = HostMemory(capacity=None)
    _fused(dataset, reference).run()
    expected = reference.read()

    asked = []

    def stop():  # as a signal would: from the 12th time it is asked
        asked.append(1)
        return len(asked) >= 12

    sink = HostMemory(capacity=None)
    stopped = _fused(dataset, sink)
    stopped.run(checkpoint=tmp_path / "c.ckpt", checkpoint_every=50, stop=stop)
    assert not stopped.done and 0 < stopped.step_count < 50
    assert stopped.step_count % 2 == 1  # after the step that made a check (every 2 steps: 0, 2, ...)
    stored = sorted(stored_results(sink, range(2)).tolist())
    assert 0 < len(stored) < len(dataset) and ckpt.load(tmp_path / "c.ckpt")["step_count"] == stopped.step_count

    # A rerun gives the sampler only the structures not stored (as alchemi run does): the
    # checkpoint's position is matched by system_id, and the rest continues where it stopped.
    ids = [i for i in range(len(sizes)) if i not in stored]
    rest = ShardDataset(dataset, ids, ids)
    resumed = _fused(rest, sink)
    resumed.run(resume_from=tmp_path / "c.ckpt")
    assert resumed.done
    got = sink.read()
    assert sorted(got.system_id.tolist()) == list(range(len(sizes)))
    a, b = got.index_select(torch.argsort(got.system_id)), expected.index_select(torch.argsort(expected.system_id))
    for field in ("positions", "velocities", "status"):
        torch.testing.assert_close(getattr(a, field), getattr(b, field), rtol=0, atol=0)
