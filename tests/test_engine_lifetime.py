"""A finished run is freed by reference counting: stage, engine, batch, sampler and hooks go as
soon as the caller drops them, with Python's cycle collector off (``alchemi_core.dynamics.weak``)."""

from __future__ import annotations

import gc

import pytest
import torch

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import (
    ConvergenceHook,
    DemoDynamics,
    DistributedPipeline,
    DynamicsStage,
    FusedStage,
    Hook,
    HostMemory,
    SizeAwareSampler,
)
from alchemi_core.errors import ConfigurationError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch, random_structures
from alchemi_core.testing.lifetime import collector_off, still_alive, watch


class SeesItsStage(Hook):
    """Records the stage it was called with (the engine holds stages weakly and hands hooks the
    stage itself)."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self) -> None:
        super().__init__(frequency=2)
        self.seen: list[str] = []

    def __call__(self, batch, dynamics):
        self.seen.append(dynamics.name)


def test_a_fused_run_with_hooks_a_sampler_and_sinks_is_freed_when_dropped():
    with collector_off():
        hook = SeesItsStage()
        sampler = SizeAwareSampler(ListDataset(random_structures([3, 4, 5, 2, 3])), max_atoms=8, bin_width=1)
        relax = DemoDynamics(model=DemoModelWrapper(), n_steps=6, dt=0.5, name="relax", hooks=[hook], sampler=sampler,
                             convergence_hook=ConvergenceHook(criteria=[{"key": "fmax", "threshold": 1e-9}]))
        md = DemoDynamics(model=DemoModelWrapper(), n_steps=4, dt=0.5, name="md")
        sink = HostMemory(capacity=None)
        fused = FusedStage([(0, relax), (1, md)], sinks=[sink])
        assert fused.run() is None
        assert len(sink) == 5 and "relax" in hook.seen
        refs = watch(fused, fused._engine, relax, md, sampler, hook)
        del fused, relax, md, sampler, hook
        assert still_alive(refs) == []
        assert len(sink) == 5  # what the sinks hold is the caller's


def test_a_stepped_engine_continues_after_run_and_the_stage_is_still_freed():
    with collector_off():
        md = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5)
        batch = make_batch([2, 3], dtype=torch.float64)
        md.run(batch)
        engine = md._engine
        md.step(batch)
        assert md._engine is engine and md.step_count == 4 and md.context.run.steps_done == 4
        refs = watch(md, engine, batch)
        del md, engine, batch
        assert still_alive(refs) == []


def test_an_engine_that_outlives_its_stage_says_so():
    fused = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5) + DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5)
    engine = fused.make_engine()
    context = engine.state.subs[0].context
    del fused
    with pytest.raises(ConfigurationError, match="keep a reference to the stage"):
        engine.prepare(make_batch([2]))
    with pytest.raises(ConfigurationError, match="owner was freed"):
        _ = engine.state.owner
    assert context.run is not None and context.run.exit_status == 2  # the engine itself lives
    del engine
    with pytest.raises(ConfigurationError, match="run was freed"):
        _ = context.run.steps_done


def test_a_finished_pipeline_is_freed_when_dropped_and_its_ranks_stay_readable_until_then():
    with collector_off():
        first = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.3)
        last = DemoDynamics(model=DemoModelWrapper(), n_steps=2, dt=0.4)
        pipeline = DistributedPipeline(stages={0: first, 1: last})
        out = pipeline.run(make_batch([2, 3, 4]))
        assert out is not None and out.num_graphs == 3
        ranks = first.pipeline_rank, last.pipeline_rank
        assert [r.left for r in ranks] == [3, 3] and ranks[0].stage is first
        refs = watch(pipeline, first, last, *ranks, first._engine, last._engine)
        del pipeline, first, last, out, ranks
        assert still_alive(refs) == []


def test_a_rank_whose_stage_was_freed_says_so():
    ranks = DistributedPipeline(stages={0: DemoDynamics(model=DemoModelWrapper(), n_steps=2, dt=0.3),
                                        1: DemoDynamics(model=DemoModelWrapper(), n_steps=2, dt=0.3)}
                                ).in_process_ranks(make_batch([2]))
    gc.collect()  # the stages' only owner was the pipeline, a temporary
    with pytest.raises(ConfigurationError, match="stage was freed.*or to the pipeline"):
        ranks[0].iterate()
