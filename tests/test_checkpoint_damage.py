"""Damaged or inconsistent checkpoints fail with an error that says so and names the run that
made them (finding 3 of issue 13: they used to resume silently or fail with bare OSError/EOFError)."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import DemoDynamics, HostMemory, SizeAwareSampler
from alchemi_core.dynamics import checkpoint as ckpt
from alchemi_core.errors import DamagedCheckpointError, InvalidDataError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch, random_structures


@pytest.fixture()
def saved(tmp_path):
    path = tmp_path / "run.ckpt"
    DemoDynamics(model=DemoModelWrapper(), n_steps=40, dt=0.5).run(
        make_batch([30, 40, 20], dtype=torch.float64), n_steps=17, checkpoint=path
    )
    return path


def _resume(path):
    return DemoDynamics(model=DemoModelWrapper(), n_steps=40, dt=0.5).run(resume_from=path)


def test_a_checkpoint_names_its_format_version_and_run(saved):
    state = ckpt.load(saved)
    assert state["version"] == ckpt.VERSION == 2
    run_id = state["run_id"]
    assert run_id and isinstance(run_id, str)
    head = saved.read_bytes().split(b"\n", 2)
    assert head[0] == b"alchemi-checkpoint" and run_id.encode() in head[1] and b"sha256" in head[1]


def test_flipped_bytes_fail_the_checksum_and_name_the_run(saved):
    run_id = ckpt.load(saved)["run_id"]
    raw = bytearray(saved.read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + 64] = bytes(b ^ 0xFF for b in raw[middle : middle + 64])
    saved.write_bytes(bytes(raw))
    with pytest.raises(DamagedCheckpointError, match="damaged.*checksum") as err:
        _resume(saved)
    assert run_id in str(err.value)


@pytest.mark.parametrize("keep", [0, 10, 200, -100])
def test_empty_and_truncated_files_are_damaged_not_oserror_or_eoferror(saved, keep):
    raw = saved.read_bytes()
    saved.write_bytes(raw[:keep] if keep >= 0 else raw[:keep])
    with pytest.raises(DamagedCheckpointError, match="damaged"):
        _resume(saved)


def test_a_sampler_position_that_disagrees_with_the_run_is_refused(tmp_path):
    dataset = ListDataset(random_structures([3, 4, 5, 3, 4, 5, 3, 4, 5, 3], dtype=torch.float64))

    def run(**kwargs):
        sampler = SizeAwareSampler(dataset, max_atoms=12, max_batch_size=3, bin_width=1)
        stage = DemoDynamics(model=DemoModelWrapper(), n_steps=6, dt=0.5, sampler=sampler, sinks=[HostMemory(None)])
        return stage.run(**kwargs)

    path = tmp_path / "run.ckpt"
    run(checkpoint=path, checkpoint_every=4)
    state = ckpt.load(path)
    # Three structures the run took are "given back" to the sampler: resuming would run them twice.
    state["sampler"]["handed_out"] = state["sampler"]["handed_out"][:-3]
    ckpt.write_state(state, path)  # a valid checksum: only the counts can tell
    with pytest.raises(DamagedCheckpointError, match="sampler position") as err:
        run(resume_from=path)
    assert state["run_id"] in str(err.value)


def test_a_batch_holding_a_system_twice_is_refused(saved):
    state = ckpt.load(saved)
    fields = state["batch"]["fields"]
    fields["system_id"] = torch.tensor([0, 0, 2])
    ckpt.write_state(state, saved)
    with pytest.raises(DamagedCheckpointError, match="more than once"):
        _resume(saved)


def test_a_negative_step_count_is_reported_as_such(saved):
    state = ckpt.load(saved)
    state["step_count"] = -3
    ckpt.write_state(state, saved)
    with pytest.raises(DamagedCheckpointError, match=r"its step_count is negative \(-3\)"):
        _resume(saved)


def test_a_checkpoint_without_a_checksum_is_refused_unless_allowed(saved):
    state = ckpt.load(saved)
    legacy = saved.with_name("legacy.ckpt")
    torch.save(state, legacy)  # format version 1: a bare torch.save, no checksum
    with pytest.raises(InvalidDataError, match="no checksum") as err:
        _resume(legacy)
    assert "allow_unverified=True" in str(err.value)
    unverified = ckpt.load(legacy, allow_unverified=True)
    resumed = _resume(unverified)  # the caller's state, as resume_from
    assert resumed.num_graphs == 3 and unverified["step_count"] == 17


def test_a_sampler_position_that_disagrees_with_the_store_is_refused(tmp_path):
    dataset = ListDataset(random_structures([3, 4, 5, 3, 4, 5, 3, 4, 5, 3], dtype=torch.float64))

    def run(**kwargs):
        sampler = SizeAwareSampler(dataset, max_atoms=12, max_batch_size=3, bin_width=1)
        stage = DemoDynamics(model=DemoModelWrapper(), n_steps=6, dt=0.5, sampler=sampler, sinks=[HostMemory(None)])
        stage.run(**kwargs)
        return stage

    path = tmp_path / "run.ckpt"
    run(checkpoint=path, checkpoint_every=4, n_steps=None)
    state = ckpt.load(path)
    stored = set(state["sinks"][0]["batch"]["fields"]["system_id"].tolist())
    # Three written structures named as not handed out yet, with every count made to agree: only
    # the store can tell that resuming would run them again (and store them twice).
    sampler = state["sampler"]
    gone = [i for i in sampler["handed_out_ids"] if i in stored][:3]
    assert len(gone) == 3
    sampler["handed_out"] = [p for p, i in zip(sampler["handed_out"], sampler["handed_out_ids"]) if i not in gone]
    sampler["handed_out_ids"] = [i for i in sampler["handed_out_ids"] if i not in gone]
    state["sampled_count"] = len(sampler["handed_out"])
    ckpt.write_state(state, path)
    ckpt.load(path)  # the file itself is consistent
    with pytest.raises(InvalidDataError, match="disagrees with the stored results") as err:
        run(resume_from=path)
    message = str(err.value)
    assert "not handed out yet" in message and "twice" in message
    assert all(str(i) in message for i in gone)
