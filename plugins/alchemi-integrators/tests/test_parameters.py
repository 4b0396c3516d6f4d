"""Per-system parameters: a tensor or a field name gives each system its own value, and field
values travel with their systems through inflight refills."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from integrators_testkit.oracles import implementation

from alchemi_core import registry
from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import SizeAwareSampler
from alchemi_core.errors import ConfigurationError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_integrators import FIRE2, Langevin, NoseHooverChain, VelocityVerlet
from alchemi_integrators.thermo import initialize_velocities

#: Production (Warp) and its torch oracle (integrators_testkit/oracles.py).
BACKENDS = ["torch", "warp"]


def _molecule(n: int, seed: int, dt: float | None = None) -> AtomicData:
    g = torch.Generator().manual_seed(seed)
    fields: dict[str, Any] = {
        "atomic_numbers": torch.randint(1, 9, (n,), generator=g),
        "positions": torch.randn(n, 3, generator=g, dtype=torch.float64) * 1.2,
        "velocities": torch.randn(n, 3, generator=g, dtype=torch.float64) * 0.01,
    }
    if dt is not None:
        return AtomicData(levels={"my_dt": "system"}, my_dt=torch.tensor([dt], dtype=torch.float64), **fields)
    return AtomicData(**fields)


def _alone(data: AtomicData, cls: type, steps: int, **kwargs: Any) -> Batch:
    batch = Batch.from_data_list([data])
    cls(DemoModelWrapper(), n_steps=steps, **kwargs).run(batch)
    return batch


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["tensor", "field"])
def test_each_system_gets_its_own_value(form: str, backend: str) -> None:
    """A batch with per-system dt, temperature and tau follows, system by system, the runs of
    each system alone with scalar values."""
    data = [_molecule(n, seed=i) for i, n in enumerate((4, 6, 5))]
    dts, temps = [0.3, 0.5, 0.7], [100.0, 300.0, 600.0]
    batch = Batch.from_data_list(data)
    if form == "tensor":
        dt, temperature = torch.tensor(dts, dtype=torch.float64), torch.tensor(temps)
    else:
        batch.set_field("my_dt", torch.tensor(dts, dtype=torch.float64), "system")
        batch.set_field("my_T", torch.tensor(temps, dtype=torch.float32).unsqueeze(-1), "system")  # [B, 1], float32
        dt, temperature = "my_dt", "my_T"
    implementation(NoseHooverChain, backend)(DemoModelWrapper(), n_steps=25, dt=dt, temperature=temperature, tau=5.0).run(batch)
    for i, d in enumerate(data):
        ref = _alone(d, implementation(NoseHooverChain, backend), 25, dt=dts[i], temperature=temps[i], tau=5.0)
        torch.testing.assert_close(batch.index_select([i]).positions, ref.positions, rtol=0, atol=1e-12)


def test_field_values_travel_through_inflight_refills() -> None:
    """Seven molecules, three slots: systems leave and enter, and each keeps its own dt (read from
    its own field) for exactly its n_steps, as if run alone."""
    dts = [0.2, 0.35, 0.5, 0.65, 0.8, 0.95, 1.1]
    data = [_molecule(3 + i % 3, seed=i, dt=dt) for i, dt in enumerate(dts)]
    sampler = SizeAwareSampler(ListDataset(data), max_atoms=16, max_batch_size=3, bin_width=1)
    out = VelocityVerlet(DemoModelWrapper(), n_steps=12, dt="my_dt", sampler=sampler).run()
    assert sorted(out.system_id.tolist()) == list(range(7))
    for row, system in enumerate(out.system_id.tolist()):
        ref = _alone(data[system], VelocityVerlet, 12, dt=dts[system])
        torch.testing.assert_close(out.index_select([row]).positions, ref.positions, rtol=0, atol=1e-12)


def test_tensor_follows_its_system_when_others_leave() -> None:
    """System 0 converges after one step and goes to the sink, which packs the batch; the tensor's
    values (kept in a field of the stage) move with the systems that stay, whose trajectories
    stay those of each system alone with its own dt."""
    from alchemi_core.dynamics import ConvergenceHook, HostMemory

    data = [_molecule(4, seed=i) for i in range(3)]
    batch = Batch.from_data_list(data)
    batch.set_field("leave_now", torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64), "system")
    sink = HostMemory(capacity=10)
    dts = [0.3, 0.6, 0.9]
    nve = VelocityVerlet(
        DemoModelWrapper(), n_steps=10, dt=torch.tensor(dts, dtype=torch.float64), sinks=[sink],
        convergence_hook=ConvergenceHook(criteria=[{"key": "leave_now", "threshold": 0.5}]),
    )
    out = nve.run(batch)
    left = sink.read()
    assert left.system_id.tolist() == [0] and left.stage0_dt.tolist() == [0.3]
    assert out.system_id.tolist() == [1, 2] and out.stage0_dt.tolist() == [0.6, 0.9]
    for row, system in enumerate((1, 2)):
        ref = _alone(data[system], VelocityVerlet, 10, dt=dts[system])
        torch.testing.assert_close(out.index_select([row]).positions, ref.positions, rtol=0, atol=1e-12)


def test_tensor_with_a_sampler_is_an_error_that_says_use_a_field() -> None:
    data = [_molecule(3, seed=i) for i in range(4)]
    sampler = SizeAwareSampler(ListDataset(data), max_atoms=6, max_batch_size=2)
    nve = VelocityVerlet(DemoModelWrapper(), n_steps=5, dt=torch.tensor([0.5, 0.5]), sampler=sampler)
    with pytest.raises(ConfigurationError, match="system-level batch field"):
        nve.run()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dt": torch.tensor([0.5, 0.5, 0.5])}, "3 values but the batch given to run"),
        ({"dt": "missing"}, "does not have"),
        ({"dt": "velocities"}, "node-level"),
        ({"dt": "bad_dt"}, r"dt must be > 0 fs; got \[-1.0\] at systems \[1\]"),
        ({"dt": torch.tensor([[0.5, 0.5]])}, r"shape \[B\]"),
        ({"dt": -1.0}, "dt must be > 0"),
        ({"dt": float("nan")}, "dt must be > 0"),
        ({"dt": [0.5, 0.5]}, "must be a number, a tensor"),
    ],
)
def test_bad_parameters_are_clear_errors(kwargs: dict[str, Any], message: str) -> None:
    batch = Batch.from_data_list([_molecule(3, 0), _molecule(3, 1)])
    batch.set_field("bad_dt", torch.tensor([0.5, -1.0], dtype=torch.float64), "system")
    with pytest.raises(ConfigurationError, match=message):
        VelocityVerlet(DemoModelWrapper(), n_steps=2, **kwargs).run(batch)


def test_parameter_fields_may_change_during_a_run() -> None:
    """A field parameter is read every step, so a hook can ramp it (here: stop one system)."""
    batch = Batch.from_data_list([_molecule(3, 0), _molecule(3, 1)])
    initialize_velocities(batch, 300.0, seed=0)
    batch.set_field("friction", torch.tensor([0.0, 0.0], dtype=torch.float64), "system")
    nvt = Langevin(DemoModelWrapper(), n_steps=5, dt=0.5, temperature=300.0, friction="friction")
    nvt.run(batch)
    ke_free = batch.velocities.clone()
    batch.friction.fill_(1e6)  # instantly thermalised: velocities become pure noise at 300 K
    nvt.run(batch, n_steps=1)
    assert not torch.allclose(batch.velocities, ke_free)


def test_build_by_name_with_the_briefs_arguments() -> None:
    nvt = registry.build(
        "integrator:langevin", model=DemoModelWrapper(), dt=5.0, temperature=50.0, friction=0.01, n_steps=1000
    )
    assert isinstance(nvt, Langevin)
    assert nvt.parameters["temperature"].scalar == 50.0 and nvt.n_steps == 1000
    for name, cls in (("velocity-verlet", VelocityVerlet), ("nose-hoover", NoseHooverChain), ("fire2", FIRE2)):
        assert registry.resolve(f"integrator:{name}") is cls
    from alchemi_core.dynamics import FIRE as ExportedFIRE
    from alchemi_integrators import FIRE

    assert ExportedFIRE is FIRE


@pytest.mark.parametrize("value", ["torch", "warp", "auto"])
def test_the_removed_backend_argument_is_a_clear_error(value: str) -> None:
    """``backend=`` went with the torch steps (one implementation per integrator): any value,
    old or not, is refused with a message that says to drop it, never silently ignored."""
    with pytest.raises(ConfigurationError, match=rf"backend='{value}' is no longer an option.*drop the argument"):
        Langevin(DemoModelWrapper(), temperature=300.0, backend=value)
