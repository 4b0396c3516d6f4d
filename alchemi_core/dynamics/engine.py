"""The loop behind ``BaseDynamics.run`` and ``FusedStage.run``: stages sharing one batch.

Each system carries a ``status``; a sub-stage integrates the systems whose status equals its
code. One model forward per step serves every sub-stage. At *check* steps (every
``check_interval`` steps) convergence criteria move systems on, systems that used their step
budget move on too, and graduated systems (``status >= exit_status``) go to the sinks while the
sampler refills their slots. Checks are the only places that read values back from the device;
the steps between them are a fixed sequence of device operations on fixed buffers.

The engine keeps on the batch the fields it needs: ``status``, ``system_id``, ``velocities``,
``forces``, ``energy``, ``atomic_masses``, ``stage_steps`` (steps used in the current stage), and
``fmax``/``energy_change``/``energy_prev`` when a criterion names them. They travel with each
system through sinks, refills and ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.data import Batch
from alchemi_core.data.elements import masses_for
from alchemi_core.dynamics.convergence import ConvergenceHook
from alchemi_core.dynamics.hook import build_hook_table
from alchemi_core.dynamics.stage import INNER_POINTS, DynamicsStage
from alchemi_core.errors import CapacityError, ConfigurationError, InvalidDataError
from alchemi_core.units import ACCELERATION

if TYPE_CHECKING:
    from alchemi_core.dynamics.base import BaseDynamics
    from alchemi_core.dynamics.sampler import SizeAwareSampler
    from alchemi_core.dynamics.sinks import DataSink

_P = DynamicsStage
#: A step index no run reaches.
_NEVER = 2**62


class SubStage:
    """One stage inside an engine: its status code, budget and where its systems go next."""

    __slots__ = (
        "code", "dynamics", "budget", "target", "conv", "source", "sys_mask", "node_weight",
        "weighted_inv_mass", "buffers_version", "hooks",
    )

    def __init__(self, code: int, dynamics: BaseDynamics, target: int) -> None:
        self.code = int(code)
        self.dynamics = dynamics
        self.budget = int(dynamics.n_steps)
        self.target = int(target)
        self.conv: ConvergenceHook | None = dynamics.convergence_hook
        self.source = self.code
        if self.conv is not None:
            if self.conv.source_status is not None:
                self.source = self.conv.source_status
            if self.conv.target_status is not None:
                self.target = self.conv.target_status
        self.sys_mask: torch.Tensor | None = None
        self.node_weight: torch.Tensor | None = None
        self.weighted_inv_mass: torch.Tensor | None = None
        self.buffers_version = -1
        #: Per hook point, this stage's ``(frequency, hook)`` entries.
        self.hooks: tuple[tuple[tuple[int, Any], ...], ...] = ()


class Engine:
    """Runs sub-stages on one batch (see the module docstring).

    Args:
        stages: ``(status_code, dynamics)`` pairs, in order.
        entry_status: Status of systems entering (from the sampler or a fresh batch).
        exit_status: Status at which a system has graduated.
        sinks: Graduated systems go to the first sink with room, in order.
        sampler: Refills graduated slots when given.
        refill_frequency: Steps between graduation/refill checks.
        graduate_on_budget: Whether a system that used a stage's ``n_steps`` moves on. False for a
            plain single stage, which instead runs ``n_steps`` steps in all.
        owner: The object users called ``run`` on (for lifecycle hooks and messages).
        hooks: Extra hooks applying to all systems (a fused stage's own).
    """

    def __init__(
        self,
        stages: Sequence[tuple[int, BaseDynamics]],
        *,
        entry_status: int,
        exit_status: int,
        sinks: Sequence[DataSink] = (),
        sampler: SizeAwareSampler | None = None,
        refill_frequency: int = 1,
        graduate_on_budget: bool = True,
        owner: Any = None,
        hooks: Sequence[Any] = (),
    ) -> None:
        if not stages:
            raise ConfigurationError("an engine needs at least one stage")
        codes = [int(c) for c, _ in stages]
        if len(set(codes)) != len(codes):
            raise ConfigurationError(f"sub-stage status codes must differ, got {codes}")
        self.entry_status = int(entry_status)
        self.exit_status = int(exit_status)
        if self.exit_status in codes:
            raise ConfigurationError(f"exit_status {exit_status} is also a sub-stage's status code")
        self.subs: list[SubStage] = []
        for i, (code, dyn) in enumerate(stages):
            nxt = codes[i + 1] if i + 1 < len(codes) else self.exit_status
            self.subs.append(SubStage(code, dyn, nxt))
        self.sinks = list(sinks)
        self.sampler = sampler
        self.refill_frequency = max(1, int(refill_frequency))
        self.graduate_on_budget = bool(graduate_on_budget)
        self.owner = owner
        self.extra_hooks = list(hooks)
        self.models = list({id(s.dynamics.model): s.dynamics.model for s in self.subs}.values())
        self.masked = len(self.subs) > 1 or graduate_on_budget or any(s.conv is not None for s in self.subs)
        freqs = [s.conv.frequency for s in self.subs if s.conv is not None]
        if sampler is not None or (graduate_on_budget and self.sinks):
            freqs.append(self.refill_frequency)
        if graduate_on_budget and not freqs:
            freqs.append(1)
        self.check_interval = math.gcd(*freqs) if freqs else 0
        # With checks more than a step apart, an extra check is scheduled for the step at which
        # the first active system uses its budget, so every system gets exactly n_steps in a
        # stage whatever the check interval (a fused stage and a pipeline then agree).
        self._schedule_budgets = self.graduate_on_budget and self.check_interval > 1
        self._budget_check = _NEVER
        keys: set[str] = set()
        for s in self.subs:
            if s.conv is not None:
                keys |= s.conv.keys
        self.track_fmax = "fmax" in keys
        self.track_energy_change = "energy_change" in keys
        self.needs_stress = any(getattr(s.dynamics, "needs_stress", False) for s in self.subs) or any(
            getattr(h, "needs_stress", False) for h in self._all_hooks()
        )
        self.batch: Batch | None = None
        self.step_count = 0
        self.table: tuple = ()
        self.host_results: DataSink | None = None
        self._masks_version = -1
        self._inv_mass: torch.Tensor | None = None
        self._inv_mass_version = -1
        self._inner_hooks = False
        self._inner_frequencies: tuple[int, ...] = ()
        self.owner_hooks: tuple = ()
        self.done = False
        #: Capture the step as a CUDA graph on GPUs (``compile()``); how often it was captured.
        self.graph_requested = bool(getattr(owner, "compile_step", False))
        self.graph_captures = 0
        #: Increases whenever the masks are rewritten (at checks and composition changes).
        self.mask_version = 0
        self._graph: Any = None
        self._graph_key = -1
        #: False on pipeline ranks that pass graduates downstream instead of to sinks.
        self.graduate_to_sinks = True
        #: Systems moved out to sinks so far.
        self.written_count = 0
        #: Systems taken in from the initial batch and the sampler so far.
        self.loaded_count = 0

    # ------------------------------------------------------------------ hooks
    def _all_hooks(self) -> list[Any]:
        out = list(self.extra_hooks)
        for s in self.subs:
            out.extend(s.dynamics.hooks)
        return out

    def _dispatch(self, point: int, step: int) -> None:
        batch = self.batch
        for freq, hook, stage in self.table[point]:
            if step % freq == 0:
                hook(batch, stage)

    def _build_tables(self) -> None:
        """Per-point hook tuples, built once per run: the per-step path never asks pluggy."""
        owners: list[tuple[Any, Sequence[Any]]] = [(s.dynamics, s.dynamics.hooks) for s in self.subs]
        if self.extra_hooks:
            owners.insert(0, (self.owner, self.extra_hooks))
        self.table = build_hook_table(owners)
        for s in self.subs:
            s.hooks = tuple(tuple((f, h) for f, h, st in point if st is s.dynamics) for point in self.table)
        self.owner_hooks = tuple(
            tuple((f, h) for f, h, st in point if self.extra_hooks and st is self.owner) for point in self.table
        )
        inner = [f for p in INNER_POINTS for f, _, _ in self.table[int(p)]]
        self._inner_hooks = bool(inner)
        self._inner_frequencies = tuple(sorted(set(inner)))

    # ------------------------------------------------------------------ preparation
    def prepare(self, batch: Batch | None, resume: dict[str, Any] | None = None) -> Batch:
        """Make ``batch`` (or the sampler's first batch) ready: defaults, capacity, state, forces.

        Args:
            batch: The systems to run; None to build them from the sampler.
            resume: A checkpoint (``alchemi_core.dynamics.checkpoint.load``) to continue instead:
                its batch, counters, random states, sampler position and kept results.
        """
        if resume is not None:
            from alchemi_core.dynamics.checkpoint import batch_from_state

            device = batch.device if batch is not None else torch.device(resume["device"])
            if device.type == "cuda" and not torch.cuda.is_available():
                device = torch.device("cpu")
            batch = batch_from_state(resume["batch"], device)
        if batch is None:
            if self.sampler is None:
                raise ConfigurationError(
                    "run() without a batch needs a sampler: pass sampler=SizeAwareSampler(...) to "
                    "the first stage, or call run(batch)"
                )
            batch = self.sampler.build_initial_batch()
        if not isinstance(batch, Batch):
            raise InvalidDataError(f"run() takes a Batch, got {type(batch).__name__}")
        if batch.num_graphs == 0 and self.sampler is None:
            raise InvalidDataError("run() got an empty batch and has no sampler to fill it")
        self._fill_defaults(batch, first=True)
        if self.sampler is not None:
            batch = self._with_capacity(batch)
        self.batch = batch
        for m in self.models:
            check = getattr(m, "check_batch", None)
            if check is not None:
                check(batch)
        for s in self.subs:
            s.dynamics._attach(self, s)
            s.dynamics.setup(batch)
        if resume is None:
            # Systems that already took steps (a batch continuing an earlier run) keep their state.
            entering = batch.stage_steps == 0
            if bool(entering.any()):
                self._init_entering(entering)
        self._update_masks()
        self.forward()
        if self.track_energy_change:
            batch.energy_prev.copy_(batch.energy)
        self._build_tables()
        self.step_count = 0
        self.done = False
        self.loaded_count = batch.num_graphs
        if resume is not None:
            from alchemi_core.dynamics.checkpoint import restore

            restore(self, resume)
            self._update_masks()  # budget checks are scheduled from the restored step count
        return batch

    def prepare_empty(self, template: Batch, num_systems: int, num_nodes: int, num_edges: int) -> Batch:
        """Start with no systems (a downstream pipeline rank): buffers shaped like ``template``."""
        batch = Batch.empty(num_systems=num_systems, num_nodes=num_nodes, num_edges=num_edges, template=template)
        self._fill_defaults(batch, first=True)
        self.batch = batch
        for s in self.subs:
            s.dynamics._attach(self, s)
            s.dynamics.setup(batch)
        self._update_masks()
        self._build_tables()
        self.step_count = 0
        self.done = False
        return batch

    def _fill_defaults(self, batch: Batch, first: bool) -> None:
        """Give ``batch`` every field the engine and integrators read."""
        n, dev = batch.num_graphs, batch.device
        ftype = batch.positions.dtype
        if "status" not in batch:
            batch.set_field("status", torch.full((n,), self.entry_status, dtype=torch.long, device=dev), "system")
        elif not first:
            batch.status.fill_(self.entry_status)
        if "system_id" not in batch:
            batch.set_field("system_id", torch.arange(n, dtype=torch.long, device=dev), "system")
        if "velocities" not in batch:
            batch.set_field("velocities", torch.zeros_like(batch.positions), "node")
        if "forces" not in batch:
            batch.set_field("forces", torch.zeros_like(batch.positions), "node")
        if "energy" not in batch:
            batch.set_field("energy", torch.zeros(n, 1, dtype=ftype, device=dev), "system")
        if "atomic_masses" not in batch:
            batch.set_field("atomic_masses", masses_for(batch.atomic_numbers, ftype), "node")
        if "stage_steps" not in batch or not first:
            batch.set_field("stage_steps", torch.zeros(n, dtype=torch.long, device=dev), "system")
        if self.track_fmax and ("fmax" not in batch or not first):
            batch.set_field("fmax", torch.full((n,), math.inf, dtype=ftype, device=dev), "system")
        if self.track_energy_change:
            if "energy_change" not in batch or not first:
                batch.set_field("energy_change", torch.full((n,), math.inf, dtype=ftype, device=dev), "system")
            if "energy_prev" not in batch or not first:
                batch.set_field("energy_prev", batch.energy.clone(), "system")
        self._check_finite(batch)

    @staticmethod
    def _check_finite(batch: Batch) -> None:
        bad = ~torch.isfinite(batch.positions).all(dim=1)
        if bool(bad.any()):
            systems = torch.unique(batch.batch_idx[bad]).tolist()
            ids = batch.system_id[systems].tolist() if "system_id" in batch else systems
            raise InvalidDataError(f"positions are NaN or infinite in systems with system_id {ids[:10]}")

    def _with_capacity(self, batch: Batch) -> Batch:
        """Move the sampler's batch into buffers sized for the sampler's budgets."""
        s = self.sampler
        assert s is not None
        atoms, edges = s._atoms, s._edges
        cap_sys = s.max_batch_size or len(s)
        cap_sys = min(cap_sys, s.max_atoms // max(1, int(atoms.min()) if len(atoms) else 1))
        cap_sys = max(cap_sys, batch.num_graphs)
        if s.max_edges is not None:
            cap_edges = s.max_edges
        else:  # the most edges cap_sys systems can bring
            cap_edges = int(np.sort(edges)[::-1][:cap_sys].sum()) if len(edges) else 0
        buf = Batch.empty(
            num_systems=cap_sys,
            num_nodes=max(s.max_atoms, batch.num_nodes),
            num_edges=max(cap_edges, batch.num_edges),
            template=batch,
        )
        buf.put(batch)
        return buf

    def _init_entering(self, entering: torch.Tensor) -> None:
        """Let each stage set up integrator state for systems that just entered it."""
        status = self.batch.status
        for s in self.subs:
            s.dynamics.init_state(self.batch, entering & (status == s.code))

    def inv_mass(self) -> torch.Tensor:
        """``[V, 1]`` acceleration per unit force (Å/fs² per eV/Å) for every atom."""
        batch = self.batch
        if self._inv_mass_version != batch.version or self._inv_mass is None:
            self._inv_mass = (ACCELERATION / batch.atomic_masses).unsqueeze(-1)
            self._inv_mass_version = batch.version
        return self._inv_mass

    def _update_masks(self) -> None:
        """Which systems (and atoms) each stage integrates until the next check.

        The masks live in buffers that are reallocated only when the set of systems changes,
        and are rewritten in place otherwise, so a captured CUDA graph keeps seeing them; each
        rewrite bumps ``mask_version`` so hooks can tell. Atoms of a batch field ``frozen``
        get weight 0 in every stage: no integrator moves them.
        """
        batch = self.batch
        inv_mass = self.inv_mass()
        self.mask_version += 1
        frozen = batch.frozen.reshape(-1).to(torch.bool) if "frozen" in batch else None
        for s in self.subs:
            if not self.masked and frozen is None:
                s.sys_mask = s.node_weight = None
                s.weighted_inv_mass = inv_mass
                self._publish(s)
                continue
            if s.buffers_version != batch.version or s.node_weight is None or s.weighted_inv_mass is None:
                s.sys_mask = torch.empty(batch.num_graphs, dtype=torch.bool, device=batch.device) if self.masked else None
                s.node_weight = torch.empty(batch.num_nodes, 1, dtype=batch.positions.dtype, device=batch.device)
                s.weighted_inv_mass = torch.empty_like(s.node_weight)
                s.buffers_version = batch.version
            if s.sys_mask is not None:
                torch.eq(batch.status, s.code, out=s.sys_mask)
                if self.graduate_on_budget:
                    s.sys_mask.logical_and_(batch.stage_steps < s.budget)
                atoms = s.sys_mask.index_select(0, batch.batch_idx)
                s.node_weight.copy_((atoms & ~frozen if frozen is not None else atoms).unsqueeze(-1))
            else:
                s.node_weight.copy_((~frozen).unsqueeze(-1))
            torch.mul(inv_mass, s.node_weight, out=s.weighted_inv_mass)
            self._publish(s)
        self._schedule_budget_check()

    def _schedule_budget_check(self) -> None:
        """Set ``_budget_check`` to the step after which the first active system will have used
        its stage's budget (one read-back, where the masks are rewritten anyway)."""
        self._budget_check = _NEVER
        batch = self.batch
        if not self._schedule_budgets or batch is None or not batch.num_graphs:
            return
        steps = batch.stage_steps
        left = torch.full_like(steps, _NEVER)
        for s in self.subs:
            torch.where(s.sys_mask, torch.clamp_min(s.budget - steps, 1).minimum(left), left, out=left)
        soonest = int(left.min())
        if soonest < _NEVER:
            self._budget_check = self.step_count + soonest - 1

    def _publish(self, s: SubStage) -> None:
        d = s.dynamics
        d.system_mask, d.node_weight, d.weighted_inv_mass = s.sys_mask, s.node_weight, s.weighted_inv_mass
        d.mask_version = self.mask_version

    # ------------------------------------------------------------------ the step
    def forward(self) -> None:
        """One model evaluation per distinct model; results written into the batch buffers.
        Atoms marked ``frozen`` feel no force (as under ASE's ``FixAtoms``): no integrator, FIRE's
        velocity mixing included, moves them, and ``fmax`` counts only the atoms that move."""
        batch = self.batch
        if len(self.models) == 1:
            out = self.models[0](batch, compute_stress=self.needs_stress) if self.needs_stress else self.models[0](batch)
            self._store(batch, out)
            _hold_frozen(batch)
            return
        # Several models: each system takes the forces of its own stage's model.
        base = self.models[0](batch)
        self._store(batch, base)
        for m in self.models[1:]:
            out = m(batch)
            for s in self.subs:
                if s.dynamics.model is m and s.sys_mask is not None:
                    nm = s.sys_mask.index_select(0, batch.batch_idx).unsqueeze(-1)
                    batch.forces.copy_(torch.where(nm, out["forces"], batch.forces))
                    batch.energy.copy_(torch.where(s.sys_mask.unsqueeze(-1), out["energy"], batch.energy))
        _hold_frozen(batch)

    @staticmethod
    def _store(batch: Batch, out: Any) -> None:
        try:
            energy, forces = out["energy"], out["forces"]
        except (KeyError, TypeError):
            raise InvalidDataError(
                "a model must return a mapping with 'energy' [B, 1] and 'forces' [V, 3]"
            ) from None
        f = batch.forces
        if forces is not f:
            f.copy_(forces)
        e = batch.energy
        if energy is not e:
            e.copy_(energy.reshape(e.shape))
        stress = out.get("stress") if hasattr(out, "get") else None
        if stress is not None:
            if "stress" in batch:
                batch.stress.copy_(stress)
            else:
                batch.set_field("stress", stress.detach().clone(), "system")

    def step(self) -> None:
        """One step of every sub-stage, then the checks that are due."""
        k = self.step_count
        table = self.table
        for s in self.subs:
            s.dynamics.step_count = k
        if table[0]:
            self._dispatch(0, k)
        if self.graph_requested and self.batch.device.type == "cuda" and not self._inner_hooks_fire(k):
            self._graph_step(k)
        else:
            self._core(k, self._inner_hooks)
        if table[7]:
            self._dispatch(7, k)
        self.step_count = k + 1
        if self.check_interval and (k % self.check_interval == 0 or k >= self._budget_check):
            self.check(k)

    def _core(self, k: int, hooks: bool) -> None:
        """Integrator halves around the model forward: the part a CUDA graph can hold.

        Inner hook points run here only when ``hooks`` is set; hooks of each sub-stage run next
        to that stage's update, a fused stage's own hooks once around all of them.
        """
        batch, subs, own = self.batch, self.subs, self.owner_hooks
        with torch.no_grad():
            if hooks and own[1]:
                _run(own[1], batch, self.owner, k)
            for s in subs:
                if hooks and s.hooks[1]:
                    _run(s.hooks[1], batch, s.dynamics, k)
                s.dynamics.pre_update(batch)
                if hooks and s.hooks[2]:
                    _run(s.hooks[2], batch, s.dynamics, k)
            if hooks and own[2]:
                _run(own[2], batch, self.owner, k)
        if hooks and self.table[3]:
            self._dispatch(3, k)
        self.forward()
        if self.track_energy_change:
            torch.sub(batch.energy.view(-1), batch.energy_prev.view(-1), out=batch.energy_change).abs_()
            batch.energy_prev.copy_(batch.energy)
        if hooks and self.table[4]:
            self._dispatch(4, k)
        with torch.no_grad():
            if hooks and own[5]:
                _run(own[5], batch, self.owner, k)
            for s in subs:
                if hooks and s.hooks[5]:
                    _run(s.hooks[5], batch, s.dynamics, k)
                s.dynamics.post_update(batch)
                if hooks and s.hooks[6]:
                    _run(s.hooks[6], batch, s.dynamics, k)
            if hooks and own[6]:
                _run(own[6], batch, self.owner, k)
            steps = batch.stage_steps
            if self.masked:
                for s in subs:
                    steps.add_(s.sys_mask)
            else:
                steps.add_(1)

    def _inner_hooks_fire(self, k: int) -> bool:
        return any(k % f == 0 for f in self._inner_frequencies)

    def _graph_step(self, k: int) -> None:
        """Replay the captured step; capture it first when the set of systems changed.

        Capturing records without executing, so step ``k`` itself runs eagerly (on a side
        stream, which also warms up lazily initialised libraries) and the capture of the same
        sequence serves the following steps.
        """
        key = self.batch.version
        if self._graph is not None and self._graph_key == key:
            self._graph.replay()
            return
        self._graph = None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._core(k, False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._core(k, False)
        self._graph, self._graph_key = graph, key
        self.graph_captures += 1

    # ------------------------------------------------------------------ checks
    def _update_fmax(self) -> None:
        b = self.batch
        norms = torch.linalg.vector_norm(b.forces, dim=-1)
        b.fmax.zero_().scatter_reduce_(0, b.batch_idx, norms, reduce="amax", include_self=False)

    def check(self, k: int) -> None:
        """Convergence, budgets, graduation and refill (the only device read-backs)."""
        batch = self.batch
        for m in self.models:
            verify = getattr(m, "verify", None)
            if verify is not None:
                verify(batch)
        status = batch.status
        before = status.clone()
        if self.track_fmax and any(s.conv is not None and k % s.conv.frequency == 0 for s in self.subs):
            self._update_fmax()
        for s in self.subs:
            if s.conv is not None and k % s.conv.frequency == 0:
                conv = s.conv.evaluate(batch) & (before == s.source)
                s.dynamics.converged_mask = conv
                status.masked_fill_(conv, s.target)
                for freq, hook, stage in self.table[int(_P.ON_CONVERGE)]:
                    if stage is s.dynamics and k % freq == 0:
                        hook(batch, stage)
            if self.graduate_on_budget:
                done = (before == s.code) & (batch.stage_steps >= s.budget) & (status == s.code)
                status.masked_fill_(done, s.target)
        moved = status != before
        if bool(moved.any()):  # checks may read back; integrators' resets are not free
            _rest_after_optimisers(batch, self.subs, moved, before)
            batch.stage_steps.masked_fill_(moved, 0)
            self._init_entering(moved)
            # Integrators and hooks may derive values from the masks in Python (caches refreshed
            # when their code runs); a replayed graph would not run that code, so capture anew.
            self._graph = None
        if self.sampler is not None or self.sinks:
            # A check scheduled for a budget also hands graduates on and refills their slots.
            if k % self.refill_frequency == 0 or k >= self._budget_check:
                self._graduate_and_refill()
        self._update_masks()
        self._check_done()
        if self.done and (self.sampler is not None or self.sinks) and self.graduate_to_sinks:
            # The run ends here: graduates still waiting for a refill check go out now.
            if self.batch.num_graphs and bool(self.graduated_mask().any()):
                self._graduate_and_refill()
                self._update_masks()

    def _check_done(self) -> None:
        batch = self.batch
        if self.sampler is not None and not self.sampler.exhausted:
            return
        if batch.num_graphs == 0:
            self.done = True
            return
        if self.graduate_on_budget:
            self.done = bool((batch.status >= self.exit_status).all())
        else:
            active = torch.zeros_like(batch.status, dtype=torch.bool)
            for s in self.subs:
                active |= batch.status == s.code
            self.done = not bool(active.any())

    def graduated_mask(self) -> torch.Tensor:
        return self.batch.status >= self.exit_status

    def _graduate_and_refill(self) -> None:
        batch = self.batch
        if self.graduate_to_sinks:
            grad = self.graduated_mask().cpu().numpy()
            if grad.any():
                self.write_to_sinks(np.nonzero(grad)[0])
        if self.sampler is not None and not self.sampler.exhausted:
            self.refill()

    def sink_list(self) -> list[DataSink]:
        if self.sinks:
            return self.sinks
        if self.host_results is None:
            from alchemi_core.dynamics.sinks import HostMemory

            self.host_results = HostMemory(capacity=None)
        return [self.host_results]

    def write_to_sinks(self, rows: np.ndarray) -> None:
        """Move systems ``rows`` out of the batch into the sinks, first sink with room first.

        Raises:
            CapacityError: Every sink is full; the systems that did not fit stay in the batch.
        """
        batch = self.batch
        remaining = list(rows.tolist())
        written: list[int] = []
        for sink in self.sink_list():
            if not remaining:
                break
            room = sink.free
            if room <= 0:
                continue
            take, remaining = remaining[:room], remaining[room:]
            mask = torch.zeros(batch.num_graphs, dtype=torch.bool)
            mask[take] = True
            sink.write(batch, mask.to(batch.device))
            written.extend(take)
        if written:
            mask = torch.zeros(batch.num_graphs, dtype=torch.bool)
            mask[written] = True
            batch.defrag(mask.to(batch.device))
            self.written_count += len(written)
        if remaining:
            ids = batch.system_id[batch.status >= self.exit_status].tolist()
            caps = ", ".join(f"{type(s).__name__} {len(s)}/{s.capacity}" for s in self.sink_list())
            raise CapacityError(
                f"every sink is full ({caps}): {len(remaining)} graduated systems (system_id "
                f"{ids[:10]}{'...' if len(ids) > 10 else ''}) stay in the active batch "
                "(dynamics.active_batch). Everything written before is in the sinks; add a sink or "
                "raise a capacity and run again"
            )

    def refill(self) -> None:
        """Fill free slots from the sampler (best fit within the remaining budgets)."""
        batch, s = self.batch, self.sampler
        assert s is not None
        free_sys = batch.system_capacity - batch.num_graphs
        free_atoms = min(s.max_atoms, batch.node_capacity) - batch.num_nodes
        edge_room = batch.edge_capacity - batch.num_edges
        free_edges = min(s.max_edges, edge_room) if s.max_edges is not None else edge_room
        if free_sys <= 0 or free_atoms <= 0:
            return
        has_edges = batch.edge_capacity > 0
        new = s.request_many(free_sys, free_atoms, free_edges if has_edges else None)
        if not new:
            return
        incoming = Batch.from_data_list(new, device=batch.device)
        self.admit(incoming)
        self.loaded_count += incoming.num_graphs

    def admit(self, incoming: Batch, partial: bool = False) -> int:
        """Put new systems into the batch at ``entry_status`` and refresh forces.

        Args:
            incoming: The systems (a batch or a receive buffer; its status fields are reset).
            partial: Copy as many as fit instead of requiring all to fit.

        Returns:
            How many were copied (``incoming._copied_mask`` says which).

        Raises:
            CapacityError: Not all fit and ``partial`` is False.
        """
        batch = self.batch
        self._fill_defaults(incoming, first=False)
        for m in self.models:
            check = getattr(m, "check_batch", None)
            if check is not None:
                check(incoming)
        n0 = batch.num_graphs
        copied = batch.put(incoming)
        if copied != incoming.num_graphs and not partial:
            raise CapacityError(
                f"{incoming.num_graphs - copied} incoming systems do not fit the active batch "
                f"({batch.num_graphs}/{batch.system_capacity} systems, {batch.num_nodes}/"
                f"{batch.node_capacity} atoms)"
            )
        if copied:
            new = torch.zeros(batch.num_graphs, dtype=torch.bool, device=batch.device)
            new[n0:] = True
            self._init_entering(new)
            self._update_masks()
            self.forward()
            if self.track_energy_change:
                batch.energy_prev.copy_(batch.energy)
        return copied

    def after_removal(self) -> None:
        """Refresh masks after systems were taken out of the batch."""
        self._update_masks()

    # ------------------------------------------------------------------ running
    def run(self, max_steps: int | None, checkpoint: Any = None, checkpoint_every: int = 0) -> None:
        """Step until done (every system graduated and the sampler empty) or ``max_steps``.

        With ``checkpoint`` (a path) and ``checkpoint_every``, a checkpoint is written after
        every ``checkpoint_every``-th step (its checks included) and when the run stops.
        """
        from alchemi_core.dynamics import checkpoint as ckpt

        every = int(checkpoint_every) if checkpoint is not None else 0
        while not self.done:
            if max_steps is not None and self.step_count >= max_steps:
                break
            self.step()
            if every and self.step_count % every == 0:
                ckpt.save(self, checkpoint)
        if checkpoint is not None:
            ckpt.save(self, checkpoint)

    def start_hooks(self) -> None:
        """Every hook's ``on_run_start``; masks are then refreshed, as a hook may have marked
        atoms (``frozen``) or changed fields the masks depend on."""
        for s in self.subs:
            for h in s.dynamics.hooks:
                getattr(h, "on_run_start", _noop)(self.batch, s.dynamics)
        for h in self.extra_hooks:
            getattr(h, "on_run_start", _noop)(self.batch, self.owner)
        if self.batch is not None:
            self._update_masks()

    def end_hooks(self) -> None:
        """Every hook's ``on_run_end``, even when one raises (files get closed); the first
        error is raised afterwards."""
        calls = [(h, s.dynamics) for s in self.subs for h in s.dynamics.hooks]
        calls += [(h, self.owner) for h in self.extra_hooks]
        first: BaseException | None = None
        for hook, stage in calls:
            try:
                getattr(hook, "on_run_end", _noop)(self.batch, stage)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                first = first or exc
        if first is not None:
            raise first

    def stream_context(self, stream: Any) -> Any:
        if stream is not None and self.batch is not None and self.batch.device.type == "cuda":
            return torch.cuda.stream(stream)
        return nullcontext()


def _hold_frozen(batch: Batch) -> None:
    """Zero the forces on atoms marked ``frozen`` (in place: nothing allocated, no read-back)."""
    if "frozen" in batch:
        frozen = batch.frozen
        mask = frozen if frozen.dtype == torch.bool else frozen.to(torch.bool)
        batch.forces.masked_fill_(mask.view(-1, 1), 0.0)


def _rest_after_optimisers(batch: Batch, subs: Sequence[SubStage], moved: torch.Tensor, before: torch.Tensor) -> None:
    """Systems leaving an optimiser (a stage whose ``velocities_are_physical`` is False, FIRE)
    leave at rest: its velocities are the minimiser's, not the atoms' (ASE keeps them apart too),
    so neither the next stage nor ``to_atoms`` of a relaxed structure inherits them."""
    for s in subs:
        if getattr(s.dynamics, "velocities_are_physical", True):
            continue
        left = moved & (before == s.code)
        batch.velocities.masked_fill_(left.index_select(0, batch.batch_idx).unsqueeze(-1), 0.0)


def _noop(*_: Any) -> None:
    return None


def _run(entries: tuple[tuple[int, Any], ...], batch: Batch, stage: Any, k: int) -> None:
    for freq, hook in entries:
        if k % freq == 0:
            hook(batch, stage)
