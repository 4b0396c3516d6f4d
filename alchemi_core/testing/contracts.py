"""Contract test classes every sink, integrator and comm backend must pass.

Subclass one in a plugin's test suite and implement its factory method; pytest collects the
inherited tests. Each test states a behaviour a user relies on, so a wrong implementation fails.

Example::

    class TestHostMemory(SinkContract):
        def make_sink(self, capacity):
            return HostMemory(capacity=capacity)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from alchemi_core.data import Batch
from alchemi_core.dynamics.base import BaseDynamics
from alchemi_core.dynamics.sinks import DataSink
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.testing.factories import make_batch


def assert_same_systems(a: Batch, b: Batch) -> None:
    """Equal fields, dtypes, levels and per-system sizes (order as given)."""
    assert a.num_graphs == b.num_graphs
    assert a.num_nodes_list == b.num_nodes_list
    assert a.num_edges_list == b.num_edges_list
    for k in a.keys():
        assert k in b, f"field {k!r} was lost"
        x, y = getattr(a, k), getattr(b, k)
        assert x.dtype == y.dtype, f"field {k!r} changed dtype {x.dtype} -> {y.dtype}"
        assert a.level_of(k) == b.level_of(k)
        assert torch.equal(x.cpu(), y.cpu()), f"field {k!r} changed"


class SinkContract:
    """What every ``DataSink`` does. Implement ``make_sink(capacity)``; override ``device``."""

    device = "cpu"

    def make_sink(self, capacity: int) -> DataSink:  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    def batch(self, sizes: list[int] | None = None, **kwargs: Any) -> Batch:
        return make_batch(sizes or [3, 1, 4, 2], edges=True, extras=True, **kwargs).to(self.device)

    def test_round_trip_keeps_every_dtype(self) -> None:
        sink = self.make_sink(capacity=10)
        b = self.batch()
        sink.write(b)
        assert len(sink) == b.num_graphs
        assert_same_systems(b, sink.read())

    def test_float64_positions_round_trip(self) -> None:
        sink = self.make_sink(capacity=10)
        b = self.batch([2, 3], dtype=torch.float64)
        sink.write(b)
        out = sink.read()
        assert out.positions.dtype == torch.float64
        assert_same_systems(b, out)

    def test_mask_selects_systems_in_order(self) -> None:
        sink = self.make_sink(capacity=10)
        b = self.batch()
        mask = torch.tensor([True, False, True, False], device=b.device)
        sink.write(b, mask)
        assert len(sink) == 2
        assert_same_systems(b.index_select(mask), sink.read())
        assert sink.read().system_id.tolist() == [0, 2]

    def test_appends_across_writes(self) -> None:
        sink = self.make_sink(capacity=10)
        a, b = self.batch([2, 3]), self.batch([4])
        b.system_id.fill_(7)
        sink.write(a)
        sink.write(b)
        assert len(sink) == 3
        assert sink.read().system_id.tolist() == [0, 1, 7]

    def test_capacity_overflow_raises_and_writes_nothing(self) -> None:
        sink = self.make_sink(capacity=3)
        sink.write(self.batch([2, 2]))
        with pytest.raises(RuntimeError):
            sink.write(self.batch([1, 1]))
        assert len(sink) == 2
        assert sink.read().num_graphs == 2
        assert not sink.is_full()
        sink.write(self.batch([1]))
        assert sink.is_full() and len(sink) == sink.capacity == 3

    def test_wrong_mask_length_is_a_value_error(self) -> None:
        sink = self.make_sink(capacity=10)
        with pytest.raises(ValueError):
            sink.write(self.batch(), torch.tensor([True, False], device=self.device))
        assert len(sink) == 0

    def test_drain_returns_everything_and_empties(self) -> None:
        sink = self.make_sink(capacity=10)
        b = self.batch()
        sink.write(b)
        assert_same_systems(b, sink.drain())
        assert len(sink) == 0
        sink.write(b)
        assert len(sink) == b.num_graphs

    def test_zero_empties_and_read_of_empty_raises(self) -> None:
        sink = self.make_sink(capacity=10)
        sink.write(self.batch())
        sink.zero()
        assert len(sink) == 0
        with pytest.raises(RuntimeError):
            sink.read()

    def test_empty_mask_writes_nothing(self) -> None:
        sink = self.make_sink(capacity=10)
        b = self.batch()
        sink.write(b, torch.zeros(b.num_graphs, dtype=torch.bool, device=b.device))
        assert len(sink) == 0

    def reopen(self, sink: DataSink) -> DataSink:
        """The sink a restarted process builds after a crash: over the same storage for a
        persistent sink (override this), a new empty one for a sink held in memory (default)."""
        return self.make_sink(capacity=sink.capacity)

    def test_a_kill_between_checkpoint_and_crash_leaves_each_record_once(self) -> None:
        """Records written after the checkpoint (committed, then the process was killed) are
        gone after the resume, which writes them again: every record is stored exactly once."""
        import io

        sink = self.make_sink(capacity=20)
        assert hasattr(sink, "state_dict") and hasattr(sink, "load_state_dict"), (
            f"{type(sink).__name__} must take part in checkpoints: give it state_dict() and load_state_dict()"
        )
        before = self.batch([2, 3])
        sink.write(before)
        # The state goes into a checkpoint file, which is read back as data only.
        buffer = io.BytesIO()
        torch.save(sink.state_dict(), buffer)
        buffer.seek(0)
        state = torch.load(buffer, weights_only=True)
        after = self.batch([1, 2, 1])
        after.system_id.add_(10)
        sink.write(after)
        getattr(sink, "flush", lambda: None)()  # committed before the kill: the hard case
        restarted: Any = self.reopen(sink)  # a sink that saves itself (state_dict, load_state_dict)
        restarted.load_state_dict(state)
        assert len(restarted) == before.num_graphs
        assert_same_systems(before, restarted.read())
        restarted.write(after)  # the resumed run writes them again
        assert len(restarted) == before.num_graphs + after.num_graphs
        assert restarted.read().system_id.tolist() == [0, 1, 10, 11, 12]


class IntegratorContract:
    """What every integrator does. Implement ``make_integrator(model, n_steps, **kwargs)``."""

    device = "cpu"
    #: Keyword arguments every test passes (e.g. a temperature).
    integrator_kwargs: dict[str, Any] = {}

    def make_integrator(self, model: Any, n_steps: int, **kwargs: Any) -> BaseDynamics:  # pragma: no cover
        raise NotImplementedError

    def model(self) -> Any:
        from alchemi_core.models.demo import DemoModelWrapper

        return DemoModelWrapper()

    def batch(self, sizes: list[int], dtype: torch.dtype = torch.float64) -> Batch:
        return make_batch(sizes, dtype=dtype).to(self.device)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_runs_and_stays_finite(self, dtype: torch.dtype) -> None:
        b = self.batch([3, 5], dtype=dtype)
        out = self.make_integrator(self.model(), 20, **self.integrator_kwargs).run(b)
        assert out is not None and out.positions.dtype == dtype
        assert bool(torch.isfinite(out.positions).all())
        assert bool(torch.isfinite(out.velocities).all())

    def test_moves_the_atoms(self) -> None:
        b = self.batch([4])
        start = b.positions.clone()
        self.make_integrator(self.model(), 10, **self.integrator_kwargs).run(b)
        assert not torch.allclose(b.positions, start)

    def test_systems_are_independent(self) -> None:
        """A system's trajectory does not depend on which other systems share the batch."""
        together = self.batch([3, 4, 2])
        alone = together.index_select([1])
        kwargs = dict(self.integrator_kwargs)
        self.make_integrator(self.model(), 15, **kwargs).run(together)
        self.make_integrator(self.model(), 15, **kwargs).run(alone)
        if self.deterministic:
            torch.testing.assert_close(together.index_select([1]).positions, alone.positions)

    #: False for stochastic integrators (whose noise depends on the batch layout).
    deterministic = True

    def test_a_dropped_stage_is_freed_at_once(self) -> None:
        """After ``run()``, dropping the stage and the batch frees them and the run's engine by
        reference counting alone (on a GPU, the run's device memory): nothing of a run may form a
        reference cycle back to the stage (see ``alchemi_core.dynamics.weak``)."""
        from alchemi_core.testing.lifetime import collector_off, still_alive, watch

        with collector_off():
            stage = self.make_integrator(self.model(), 4, **self.integrator_kwargs)
            batch = self.batch([3, 4])
            out = stage.run(batch)
            refs = watch(stage, stage._engine, batch)
            del stage, batch, out
            assert still_alive(refs) == []

    def test_held_atoms_and_components_never_move(self) -> None:
        """Atoms marked ``frozen`` and components ``frozen_axes`` holds (ASE's ``FixAtoms`` and
        ``FixCartesian``) keep their positions bit for bit, with zero velocity, whatever the
        update does to the others (thermostat noise, COM corrections, FIRE's mixing); where the
        integrator moves cells, each step carries them by the cell's deformation only, as ASE's
        cell filters do."""
        b = self.batch([3, 5])
        start = b.positions.clone()
        held = hold_some(b)
        frames = _Frames()
        stage = self.make_integrator(self.model(), 12, **self.integrator_kwargs)
        if stage.moves_cell:  # (a hook only there: the others run as users run them)
            frames.add(b)
            stage.hooks.append(frames)
        out = stage.run(b)
        assert out is not None
        assert_held(out, held, start, frames.frames)

    def test_graduated_systems_do_not_move(self) -> None:
        """In a fused stage, a system that finished this stage stops changing here."""
        b = self.batch([3, 3])
        first = self.make_integrator(self.model(), 5, **self.integrator_kwargs)
        second = self.make_integrator(self.model(), 50, **self.integrator_kwargs)
        fused = first + second
        out = fused.run(b)
        assert out is not None and out.status.tolist() == [2, 2]
        final = out.positions.clone()
        # Running again does nothing: every system has graduated.
        fused.run(out)
        torch.testing.assert_close(out.positions, final)


def hold_some(batch: Batch) -> torch.Tensor:
    """Hold atoms of ``batch`` as a test of constraints does: each system's first atom whole
    (``frozen``), its second in x and z and its third in y (``frozen_axes``), and give every atom a
    velocity (so an update that ignores the constraints moves them). Returns the ``[V, 3]`` held
    components."""
    first = batch.batch_ptr[:-1]
    frozen = torch.zeros(batch.num_nodes, dtype=torch.bool, device=batch.device)
    frozen[first] = True
    axes = torch.zeros(batch.num_nodes, 3, dtype=torch.bool, device=batch.device)
    axes[first + 1] = torch.tensor([True, False, True], device=batch.device)
    axes[first + 2] = torch.tensor([False, True, False], device=batch.device)
    batch.set_field("frozen", frozen, "node")
    batch.set_field("frozen_axes", axes, "node")
    g = torch.Generator().manual_seed(5)
    v = torch.randn(batch.num_nodes, 3, generator=g, dtype=torch.float64) * 0.01
    batch.set_field("velocities", v.to(device=batch.device, dtype=batch.positions.dtype), "node")
    return frozen.unsqueeze(-1) | axes


def assert_held(
    out: Batch, held: torch.Tensor, start: torch.Tensor, frames: Sequence[tuple[torch.Tensor, torch.Tensor]] = ()
) -> None:
    """The held components (``held`` ``[V, 3]``) of ``out`` are where they started (``start``),
    bit for bit, their velocities are zero and the free atoms moved. With ``frames`` (positions
    and cells after each step of an integrator that moves cells) each step instead carried them
    by its cell change ``cell_old^-1 cell_new`` (fractional coordinates of whole atoms kept)."""
    x = out.positions
    free_atoms = ~held.any(dim=1)
    assert not torch.equal(x[free_atoms], start[free_atoms]), "nothing moved: the test would prove nothing"
    if not frames:
        assert torch.equal(x[held], start[held]), (
            f"held components moved by up to {(x - start)[held].abs().max().item():.3g} Å"
        )
    assert bool((out.velocities[held] == 0).all()), "a held component has a velocity"
    if not frames:
        return
    assert not torch.equal(frames[0][1], frames[-1][1]), "no cell moved: the test would prove nothing"
    for (x0, cell0), (x1, cell1) in zip(frames, frames[1:]):
        carry = torch.linalg.solve(cell0.double(), cell1.double()).index_select(0, out.batch_idx)
        carried = torch.bmm(x0.double().unsqueeze(1), carry).squeeze(1).to(x1.dtype)
        torch.testing.assert_close(x1[held], carried[held], rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(frames[-1][0], x)


class _Frames:
    """An ``AFTER_STEP`` hook keeping positions and cells of every step."""

    stage = DynamicsStage.AFTER_STEP
    frequency = 1

    def __init__(self) -> None:
        self.frames: list[tuple[torch.Tensor, torch.Tensor]] = []

    def add(self, batch: Batch) -> None:
        self.frames.append((batch.positions.clone(), batch.cell.clone()))

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        self.add(batch)


class CommBackendContract:
    """What every comm backend does. Implement ``run_group(world_size, fn)``: call ``fn(backend)``
    on every rank (threads or processes) and return the results in rank order. The functions
    passed are module-level, so a launcher that starts processes can pickle them."""

    def run_group(self, world_size: int, fn: Callable[[Any], Any]) -> list[Any]:  # pragma: no cover
        raise NotImplementedError

    def test_point_to_point_keeps_dtype_and_values(self) -> None:
        results = self.run_group(2, _exchange_dtypes)
        assert results[1] == [[0, 1, 2], [True, False, True], [0.5, 1.5], [0.25, -2.0]]

    def test_all_reduce_max(self) -> None:
        assert self.run_group(3, _reduce_rank) == [2, 2, 2]

    def test_rank_and_world_size(self) -> None:
        assert self.run_group(2, rank_and_world_size) == [(0, 2), (1, 2)]

    def test_messages_arrive_in_order_bit_for_bit(self) -> None:
        """Several sends in flight at once arrive in order, in every dtype, 2-D and large ones
        included, with every bit kept (NaN payloads and -0.0 too)."""
        sent, received = self.run_group(2, _exchange_in_flight)
        assert received == sent

    def test_all_reduce_sum_and_barrier(self) -> None:
        assert self.run_group(3, _sum_after_barrier) == [3, 3, 3]


def _exchange_dtypes(backend: Any) -> Any:
    dev = backend.device
    tensors = [
        torch.tensor([0, 1, 2], dtype=torch.long, device=dev),
        torch.tensor([True, False, True], device=dev),
        torch.tensor([0.5, 1.5], dtype=torch.float32, device=dev),
        torch.tensor([0.25, -2.0], dtype=torch.float64, device=dev),
    ]
    if backend.rank == 0:
        for t in tensors:
            backend.isend_tensor(t, 1).wait()
        return None
    out = [torch.zeros_like(t) for t in tensors]
    for t in out:
        backend.irecv_tensor(t, 0).wait()
    return [t.cpu().tolist() for t in out]


def _in_flight_tensors(device: Any) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    big = torch.randn(100_000, 3, generator=g, dtype=torch.float64)
    big[0, 0], big[1, 1] = float("nan"), -0.0
    return [
        t.to(device)
        for t in (
            big,
            torch.arange(12, dtype=torch.int32).reshape(4, 3),
            torch.tensor([[True, False], [False, True]]),
            torch.tensor([0.1, -2.5], dtype=torch.float16),
            torch.tensor([3.0, -1.0e30], dtype=torch.bfloat16),
            torch.tensor([0, 255], dtype=torch.uint8),
            torch.tensor([-(2**62), 2**62 + 1], dtype=torch.int64),
        )
    ]


def _bits(t: torch.Tensor) -> tuple[str, list[int], bytes]:
    return str(t.dtype), list(t.shape), t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _exchange_in_flight(backend: Any) -> Any:
    tensors = _in_flight_tensors(backend.device)
    if backend.rank == 0:
        works = [backend.isend_tensor(t, 1) for t in tensors]  # all posted before any wait
        for w in works:
            w.wait()
        return [_bits(t) for t in tensors]
    out = [torch.zeros_like(t) for t in tensors]
    works = [backend.irecv_tensor(t, 0) for t in out]
    for w in works:
        w.wait()
    return [_bits(t) for t in out]


def _sum_after_barrier(backend: Any) -> int:
    backend.barrier()
    return backend.all_reduce_sum(1)


def _reduce_rank(backend: Any) -> int:
    return backend.all_reduce_max(backend.rank)


def rank_and_world_size(backend: Any) -> tuple[int, int]:
    """A backend's place in its group (module-level, so process launchers can pickle it)."""
    return backend.rank, backend.world_size
