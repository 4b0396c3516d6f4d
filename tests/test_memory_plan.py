"""Batches planned from the models' bytes per atom and the memory of the device the run uses
(RAM on a CPU, within a cgroup limit); a batch that cannot fit is refused before it starts."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import DemoDynamics, HostMemory, SizeAwareSampler
from alchemi_core.dynamics import device_memory as dm
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import random_structures

MB = 1e6


class Declared(DemoModelWrapper):
    """The demo model declaring what an MLIP declares: device bytes per atom (and a chunk)."""

    def __init__(self, per_atom: float, chunk_atoms: int | None = None) -> None:
        super().__init__()
        self.per_atom = per_atom
        self.chunk_atoms = chunk_atoms
        self.calls = 0

    def bytes_per_atom(self) -> float:
        return self.per_atom

    def forward(self, batch, compute_stress=False):
        self.calls += 1
        return super().forward(batch, compute_stress)


@pytest.fixture
def ram(monkeypatch):
    """Pretend the CPU has ``ram.free`` bytes free of 32 GB."""

    class Ram:
        free = 10e9

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("alchemi_core.dynamics.device_memory.available_memory",
                        lambda device: (int(Ram.free), int(32e9)))
    return Ram


def _cells(n: int = 12, size: int = 8) -> ListDataset:
    return ListDataset(random_structures([size] * n))


def test_max_atoms_none_on_a_cpu_is_planned_from_ram_and_the_models_bytes_per_atom(ram):
    ram.free = 500 * 8192 / 0.8
    sampler = SizeAwareSampler(_cells(), max_atoms=None)
    assert sampler.max_atoms == 500  # the generic estimate before a model is known
    ram.free = 10e9
    assert sampler.plan_memory(7.2 * MB) == int(10e9 * 0.8 / (7.2 * MB))  # 1111 for 7net-0 in 10 GB
    # Plenty of memory: a CPU batch stays at the CPU cap.
    assert SizeAwareSampler(_cells(), max_atoms=None).max_atoms == 100_000


def test_a_run_on_a_cpu_batches_what_the_declared_model_fits_and_runs_every_structure(ram):
    ram.free = 40 * MB / 0.8  # room for 40 atoms at 1 MB an atom: 5 structures of 8 atoms
    model = Declared(1 * MB)
    sampler = SizeAwareSampler(_cells(12), max_atoms=None, bin_width=2)
    sink = HostMemory(capacity=None)
    sizes: list[int] = []
    original = model.forward

    def recording(batch, compute_stress=False):
        sizes.append(batch.num_nodes)
        return original(batch, compute_stress)

    model.forward = recording
    DemoDynamics(model=model, n_steps=3, dt=0.5, sampler=sampler, refill_frequency=1, sinks=[sink]).run()
    assert sampler.max_atoms == 40
    assert max(sizes) <= 40 and sizes[0] == 40
    assert sorted(sink.read().system_id.tolist()) == list(range(12))


def test_a_given_max_atoms_that_cannot_fit_is_refused_before_the_first_batch_naming_what_fits(ram):
    ram.free = 100 * MB / 0.8
    model = Declared(7.2 * MB)
    sampler = SizeAwareSampler(_cells(600, 8), max_atoms=4096)
    with pytest.raises(ConfigurationError) as err:
        DemoDynamics(model=model, n_steps=3, dt=0.5, sampler=sampler).run()
    message = str(err.value)
    assert "[sampler] max_atoms" in message and "13 or less" in message  # 100 MB / 7.2 MB
    assert "7.2 MB per atom" in message and "'demo'" in message
    assert model.calls == 0 and sampler.remaining == 600  # nothing was built or evaluated
    # A max_atoms the data never reaches is no risk: 3 structures of 8 atoms fit 100 MB.
    small = SizeAwareSampler(_cells(3, 4), max_atoms=4096)
    DemoDynamics(model=Declared(7.2 * MB), n_steps=1, dt=0.5, sampler=small).run()


def test_a_chunk_that_cannot_fit_names_chunk_atoms_and_a_chunked_model_plans_the_rest(ram):
    ram.free = 100 * MB / 0.8
    sampler = SizeAwareSampler(_cells(), max_atoms=None)
    with pytest.raises(ConfigurationError, match=r"chunk_atoms=6912.*set the model's chunk_atoms to 13 or less"):
        DemoDynamics(model=Declared(7.2 * MB, chunk_atoms=6912), n_steps=1, dt=0.5, sampler=sampler).run()
    # A chunk of 8 atoms holds 57.6 MB of activations; the rest plans at the generic 8 kB an atom.
    sampler = SizeAwareSampler(_cells(), max_atoms=None)
    assert sampler.plan_memory(7.2 * MB, chunk_atoms=8) == int((100 * MB - 8 * 7.2 * MB) // 8192)


def test_a_structure_larger_than_memory_holds_is_refused_with_the_memory_named(ram):
    ram.free = 5 * MB / 0.8
    sampler = SizeAwareSampler(_cells(3, 8), max_atoms=None)
    with pytest.raises(InvalidDataError, match=r"structure 0 has 8 atoms but a batch of at most 5 atoms fits the memory of cpu"):
        sampler.plan_memory(1 * MB, needed_by="model 'big'")


def test_a_workflow_default_sampler_plans_from_memory_on_a_cpu(ram, tmp_path):
    from ase.build import bulk

    from alchemi_core.data import AtomicData
    from alchemi_core.workflow import build_plan, execute, parse_workflow

    text = """
[model]
component = "model:lennard-jones"
epsilon = 0.0104
sigma = 3.405
cutoff = 8.5
[[stage]]
component = "integrator:fire"
n_steps = 2
"""
    cells = [AtomicData.from_atoms(bulk("Ar", "fcc", a=5.3, cubic=True).repeat(2))] * 3  # 32 atoms each
    ram.free = 20 * 8192 / 0.8  # 20 atoms of a simulation's generic need: less than one cell
    plan = build_plan(parse_workflow(text), device="cpu")
    with pytest.raises(InvalidDataError, match="fits the memory of cpu"):
        execute(plan, ListDataset(cells), progress=False)
    plan = build_plan(parse_workflow(text + "[sampler]\nmax_atoms = 4096\n"), device="cpu")
    with pytest.raises(ConfigurationError, match=r"\[sampler\] max_atoms.* to 20 or less"):
        execute(plan, ListDataset(cells), progress=False)
    ram.free = 70 * 8192 / 0.8  # two cells a batch
    plan = build_plan(parse_workflow(text), device="cpu")
    assert execute(plan, ListDataset(cells), progress=False).structures_out == 3


def test_available_memory_on_a_cpu_is_capped_by_a_cgroup_limit(monkeypatch):
    monkeypatch.setattr(dm, "_ram", lambda: (20_000_000_000, 24_000_000_000))
    monkeypatch.setattr(dm, "_cgroup_limits", lambda: [(8_000_000_000, 3_000_000_000)])
    assert dm.available_memory("cpu") == (5_000_000_000, 8_000_000_000)


@pytest.mark.parametrize("version", [1, 2])
def test_cgroup_limits_are_read_for_the_process_and_its_parent_groups(tmp_path, version):
    if version == 2:
        proc = "0::/job/step\n"
        group = tmp_path / "job"
        files = {"memory.max": "6000000000\n", "memory.current": "2500000000\n",
                 "memory.stat": "anon 1\ninactive_file 500000000\n"}
        (tmp_path / "job" / "step").mkdir(parents=True)
        (tmp_path / "job" / "step" / "memory.max").write_text("max\n")
    else:
        proc = "4:memory:/job/step\n3:cpu:/\n"
        group = tmp_path / "memory" / "job"
        files = {"memory.limit_in_bytes": "6000000000\n", "memory.usage_in_bytes": "2500000000\n",
                 "memory.stat": "cache 1\ntotal_inactive_file 500000000\n"}
        (group / "step").mkdir(parents=True)
        (group / "step" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    for name, text in files.items():
        (group / name).write_text(text)
    (tmp_path / "self_cgroup").write_text(proc)
    assert dm._cgroup_limits(tmp_path / "self_cgroup", tmp_path) == [(6_000_000_000, 2_000_000_000)]
