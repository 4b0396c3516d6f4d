"""The pipeline protocol in one process: frames, routing, back-pressure, overflow, setup checks,
the stage-facing methods and errors. Fast; the same protocol over real processes is in
``test_pipeline_gloo.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from alchemi_core.comm.frame import FLAG_DONE, Frame, decode_schema, encode_schema
from alchemi_core.comm.inprocess import InProcessBackend
from alchemi_core.data import Batch
from alchemi_core.dynamics import DemoDynamics, DistributedPipeline, FusedStage, HostMemory
from alchemi_core.dynamics.base import COMM_MODES, BufferConfig
from alchemi_core.errors import ConfigurationError, PipelineError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing.contracts import CommBackendContract, assert_same_systems
from alchemi_core.testing.factories import make_batch, never_converging

MODEL = DemoModelWrapper()


def stages(steps: tuple[int, ...], mode: str = "async_recv", buffer: BufferConfig | None = None, **last: Any) -> list[DemoDynamics]:
    out = [DemoDynamics(model=MODEL, n_steps=n, dt=0.3 + 0.1 * i, comm_mode=mode, buffer_config=buffer)
           for i, n in enumerate(steps)]
    for k, v in last.items():
        setattr(out[-1], k, v)
    return out


def by_id(batch: Batch) -> Batch:
    return batch.index_select(torch.argsort(batch.system_id))


def iterate_until_done(ranks: list[Any]) -> None:
    """What the in-process run does: one iteration of each rank per round, then close."""
    while not all(r.ready_to_stop() for r in ranks):
        for r in ranks:
            if not r.ready_to_stop():
                r.iterate()
    for r in ranks:
        r.close()


# ---------------------------------------------------------------------- frames
def test_frame_round_trip_keeps_every_dtype_and_edge_indices() -> None:
    batch = make_batch([3, 1, 4, 2], edges=True, extras=True, dtype=torch.float64)
    sender = Frame.like(batch, num_systems=6, num_nodes=16, num_edges=16)
    assert sender.batch.put(batch, torch.tensor([True, False, True, True])) == 3
    sender.stamp(flags=FLAG_DONE)
    receiver = Frame(decode_schema(encode_schema(sender.schema)), device="cpu")
    receiver.arena.copy_(sender.arena)  # what a transport does: the bytes, nothing else
    assert receiver.read() == FLAG_DONE
    assert_same_systems(batch.index_select([0, 2, 3]), receiver.batch)
    assert receiver.batch.frozen.dtype == torch.bool and receiver.batch.tag.dtype == torch.int32


def test_frame_fields_are_views_of_one_arena() -> None:
    frame = Frame.like(make_batch([2], extras=True), num_systems=2, num_nodes=4, num_edges=0)
    for name in frame.names:
        t = frame.batch.storage(name)
        lo = frame.arena.data_ptr()
        assert lo <= t.data_ptr() < lo + frame.nbytes, name


def test_frame_rejects_a_header_that_does_not_fit() -> None:
    frame = Frame.like(make_batch([2]), num_systems=2, num_nodes=4, num_edges=0)
    frame.header[0] = 3  # more systems than the buffer holds
    with pytest.raises(PipelineError, match="does not fit a buffer"):
        frame.read()


def test_frame_refuses_a_field_it_does_not_carry() -> None:
    batch = make_batch([2, 2])
    frame = Frame.like(batch, num_systems=2, num_nodes=4, num_edges=0)
    batch.set_field("spin", torch.ones(4), "node")
    frame.batch.put(batch)
    with pytest.raises(PipelineError, match="spin"):
        frame.check_fields()


def test_schema_with_an_unknown_dtype_is_refused() -> None:
    schema = {"capacity": [1, 1, 0], "fields": [{"name": "x", "dtype": "evil()", "shape": [], "level": "node"}]}
    with pytest.raises(PipelineError, match="unknown dtype"):
        Frame(schema, "cpu")


# ---------------------------------------------------------------------- in-process backend
class TestInProcessContract(CommBackendContract):
    def run_group(self, world_size: int, fn: Callable[[Any], Any]) -> list[Any]:
        group = InProcessBackend.group(world_size, timeout_s=10.0)
        results: list[Any] = [None] * world_size
        errors: list[BaseException] = []

        def main(b: InProcessBackend) -> None:
            try:
                results[b.rank] = fn(b)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
                b.abort()

        threads = [threading.Thread(target=main, args=(b,)) for b in group]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        if errors:
            raise errors[0]
        return results


# ---------------------------------------------------------------------- the protocol
@pytest.mark.parametrize("mode", COMM_MODES)
def test_in_process_pipeline_equals_fused_stage(mode: str) -> None:
    batch = make_batch([3, 4, 2, 5, 3], dtype=torch.float64)
    reference = FusedStage(list(enumerate(stages((4, 3, 2))))).run(batch.clone())
    out = DistributedPipeline.chain(stages((4, 3, 2), mode, BufferConfig(1, 5))).run(batch.clone())
    assert sorted(out.system_id.tolist()) == list(range(5))
    torch.testing.assert_close(by_id(out).positions, reference.positions, rtol=0, atol=1e-13)
    torch.testing.assert_close(by_id(out).velocities, reference.velocities, rtol=0, atol=1e-13)


def test_budgets_are_exact_with_a_check_interval_above_one() -> None:
    """A convergence check every 3 steps makes checks sparse; systems still get exactly
    n_steps per stage, in the pipeline (arrivals at any phase) as in the fused stage."""

    def sparse() -> list[DemoDynamics]:
        never = never_converging(frequency=3)
        a = DemoDynamics(model=MODEL, n_steps=5, dt=0.5, convergence_hook=never)
        b = DemoDynamics(model=MODEL, n_steps=5, dt=0.25, buffer_config=None)
        return [a, b]

    batch = make_batch([3, 4, 2], dtype=torch.float64)
    reference = FusedStage(list(enumerate(sparse()))).run(batch.clone())
    a, b = sparse()
    out = (a | b).run(batch.clone())
    torch.testing.assert_close(by_id(out).positions, reference.positions, rtol=0, atol=1e-13)
    # And the count itself: 5 steps of dt 0.5 then 5 of 0.25 move a free atom by v*(2.5+1.25).
    free = make_batch([1], dtype=torch.float64)
    free.set_field("velocities", torch.tensor([[0.01, 0.0, 0.0]], dtype=torch.float64), "node")
    start = free.positions.clone()
    a, b = sparse()
    moved = (a | b).run(free).positions - start
    torch.testing.assert_close(moved[0, 0], torch.tensor(0.01 * (5 * 0.5 + 5 * 0.25), dtype=torch.float64))


def test_stage_methods_drive_the_phases_by_hand() -> None:
    batch = make_batch([3, 2, 4, 1], dtype=torch.float64)
    auto = DistributedPipeline.chain(stages((3, 2), "sync", BufferConfig(1, 4))).run(batch.clone())
    pipeline = DistributedPipeline.chain(stages((3, 2), "sync", BufferConfig(1, 4)))
    ranks = pipeline.in_process_ranks(batch.clone())
    while not all(r.ready_to_stop() for r in ranks):
        for rank in ranks:
            if rank.ready_to_stop():
                continue
            stage = rank.stage
            stage._prestep_sync_buffers()
            stage._complete_pending_recv()
            rank.step()
            stage._poststep_sync_buffers()
    for rank in ranks:
        rank.close()
    assert ranks[0].stage.send_buffer is ranks[0].send_buffer
    assert ranks[1].stage.recv_buffer is ranks[1].recv_buffer
    torch.testing.assert_close(by_id(ranks[-1].result()).positions, by_id(auto).positions)


def test_stage_methods_outside_a_pipeline_say_so() -> None:
    for stage in (DemoDynamics(model=MODEL, n_steps=1), DemoDynamics(model=MODEL, n_steps=1) + DemoDynamics(model=MODEL)):
        assert stage.send_buffer is None and stage.recv_buffer is None
        with pytest.raises(ConfigurationError, match="not running in a DistributedPipeline"):
            stage._prestep_sync_buffers()
        with pytest.raises(ConfigurationError, match="not running in a DistributedPipeline"):
            stage.pipeline_rank  # noqa: B018


def test_a_fused_stage_on_a_rank_has_the_ranks_members() -> None:
    fused = DemoDynamics(model=MODEL, n_steps=2) + DemoDynamics(model=MODEL, n_steps=2)
    pipeline = fused | DemoDynamics(model=MODEL, n_steps=2)
    ranks = pipeline.in_process_ranks(make_batch([2, 3], dtype=torch.float64))
    assert fused.pipeline_rank is ranks[0]
    assert fused._poststep_sync_buffers == ranks[0]._poststep_sync_buffers
    assert fused.send_buffer is ranks[0].send_buffer is not None


def test_converged_indices_choose_what_is_sent() -> None:
    pipeline = DistributedPipeline.chain(stages((50, 1), "sync"))
    ranks = pipeline.in_process_ranks(make_batch([2, 3, 2], dtype=torch.float64))
    first = ranks[0]
    first._prestep_sync_buffers()
    first._complete_pending_recv()
    first.step()
    first._poststep_sync_buffers(converged_indices=[1])  # long before any budget is used
    assert first.left == 1 and first.active_batch.system_id.tolist() == [0, 2]
    second = ranks[1]
    second._prestep_sync_buffers()
    second._complete_pending_recv()
    assert second.active_batch.system_id.tolist() == [1]


def test_overflow_sinks_stage_and_drain_in_arrival_order() -> None:
    """Rank 1 holds 3 systems and integrates longer than rank 0: arrivals wait in its
    HostMemory and come back oldest first; nothing is lost."""
    from alchemi_core.data.datapipes import ListDataset
    from alchemi_core.dynamics.sampler import SizeAwareSampler
    from alchemi_core.testing.factories import random_structures

    data = random_structures([2, 3, 2, 2, 3, 2, 2], dtype=torch.float64)
    first, second = stages((1, 6), "async_recv")
    first.sampler = SizeAwareSampler(ListDataset(data), max_atoms=8, max_batch_size=3)
    arrivals: list[int] = []
    pipeline = first | second
    ranks = pipeline.in_process_ranks()
    original = ranks[1].engine.admission.admit

    def spy(batch: Batch, incoming: Batch, partial: bool = False) -> int:
        n = original(batch, incoming, partial)
        arrivals.extend(incoming.system_id[incoming._copied_mask].tolist())
        return n

    ranks[1].engine.admission.admit = spy  # type: ignore[method-assign]
    iterate_until_done(ranks)
    assert ranks[1].staged > 0
    assert sorted(arrivals) == list(range(7)) and len(arrivals) == 7
    assert sorted(ranks[1].result().system_id.tolist()) == list(range(7))


def test_back_pressure_holds_graduates_frozen_until_there_is_room() -> None:
    batch = make_batch([2, 2, 2, 2], dtype=torch.float64)
    pipeline = DistributedPipeline.chain(stages((2, 3), "sync", BufferConfig(1, 2)))
    ranks = pipeline.in_process_ranks(batch)
    first = ranks[0]
    first.iterate()
    first.iterate()  # every system has used its 2 steps; one leaves per iteration
    assert first.left == 1 and first.held_back == 3
    held = first.active_batch.positions.clone()
    first.iterate()
    assert first.left == 2
    # The systems still waiting did not move while they waited.
    torch.testing.assert_close(first.active_batch.positions, held[-first.active_batch.num_nodes :])


def test_a_system_larger_than_the_send_buffer_is_an_error_not_a_hang() -> None:
    pipeline = DistributedPipeline.chain(stages((1, 1), "sync", BufferConfig(2, 3)))
    with pytest.raises(PipelineError, match="does not fit the send buffer"):
        pipeline.run(make_batch([2, 5], dtype=torch.float64))


def test_full_overflow_sinks_are_an_error_naming_the_systems() -> None:
    from alchemi_core.data.datapipes import ListDataset
    from alchemi_core.dynamics.sampler import SizeAwareSampler
    from alchemi_core.testing.factories import random_structures

    first, middle, last = stages((1, 8, 1), "sync")
    first.sampler = SizeAwareSampler(ListDataset(random_structures([2] * 6)), max_atoms=4, max_batch_size=2)
    middle.sinks = [HostMemory(capacity=0)]  # a middle stage's sinks are its overflow sinks
    with pytest.raises(PipelineError, match="overflow sinks are full"):
        (first | middle | last).run()


def test_the_last_stage_sinks_hold_every_system() -> None:
    sink = HostMemory(capacity=None)
    out = DistributedPipeline.chain(stages((2, 2), sinks=[sink])).run(make_batch([1, 2, 3]))
    assert out is None
    assert sorted(sink.read().system_id.tolist()) == [0, 1, 2]


# ---------------------------------------------------------------------- configuration
def test_setup_checks_adjacent_buffer_configs() -> None:
    a, b = stages((1, 1))
    a.buffer_config, b.buffer_config = BufferConfig(2, 10), BufferConfig(3, 10)
    with pytest.raises(ConfigurationError, match="ranks 0 and 1 have different BufferConfigs"):
        (a | b).setup()


def test_setup_refuses_a_sampler_after_the_first_stage() -> None:
    from alchemi_core.data.datapipes import ListDataset
    from alchemi_core.dynamics.sampler import SizeAwareSampler
    from alchemi_core.testing.factories import random_structures

    a, b = stages((1, 1))
    b.sampler = SizeAwareSampler(ListDataset(random_structures([2])), max_atoms=4)
    with pytest.raises(ConfigurationError, match="only the first stage may have a sampler"):
        (a | b).setup()


def test_setup_refuses_one_stage_object_on_two_ranks() -> None:
    a = DemoDynamics(model=MODEL, n_steps=1)
    with pytest.raises(ConfigurationError, match="share the stage object"):
        DistributedPipeline({0: a, 1: a}).setup()


def test_first_stage_without_input_warns_and_does_nothing() -> None:
    with pytest.warns(UserWarning, match="first pipeline stage got no batch and has no sampler"):
        assert DistributedPipeline.chain(stages((1, 1, 1))).run() is None


def test_a_failing_stage_names_its_rank() -> None:
    class Boom:
        stage = 7  # AFTER_STEP
        frequency = 1

        def __call__(self, batch: Batch, dynamics: Any) -> None:
            raise ValueError("boom")

    a, b = stages((3, 3))
    b.hooks.append(Boom())
    with pytest.raises(PipelineError, match="rank 1 failed: ValueError: boom"):
        (a | b).run(make_batch([2, 2]))


def test_wrong_world_size_under_a_launcher_says_how_to_launch() -> None:
    a, b, c = stages((1, 1, 1))
    backend = InProcessBackend.group(world_size=2)[0]
    with pytest.raises(ConfigurationError, match="nproc-per-node=3"):
        with DistributedPipeline({0: a, 1: b, 2: c}, backend=backend):
            pass


def test_fields_added_mid_run_travel_on() -> None:
    """A hook adds an atom field on rank 0 and a system field on rank 1 after setup: the frames
    are reshaped (one schema renewal per link and field) and both reach the last stage."""

    class Adds:
        stage = 7  # AFTER_STEP
        frequency = 1

        def __init__(self, name: str, level: str) -> None:
            self.name, self.level = name, level

        def __call__(self, batch: Batch, dynamics: Any) -> None:
            if self.name not in batch:
                n = batch.num_nodes if self.level == "node" else batch.num_graphs
                batch.set_field(self.name, torch.zeros(n, dtype=torch.float64), self.level)
            getattr(batch, self.name).fill_(2.5)  # every system this stage integrates

    a, b, c = stages((2, 2, 2), "sync", BufferConfig(2, 8))
    a.hooks.append(Adds("spin", "node"))
    b.hooks.append(Adds("label", "system"))
    pipeline = a | b | c
    ranks = pipeline.in_process_ranks(make_batch([2, 3, 2, 2], dtype=torch.float64))
    iterate_until_done(ranks)
    out = ranks[-1].result()
    assert sorted(out.system_id.tolist()) == [0, 1, 2, 3]
    assert out.spin.dtype == torch.float64 and bool((out.spin == 2.5).all())
    assert bool((out.label == 2.5).all())
    assert [r.link.schema_renewals for r in ranks] == [1, 2, 1]
