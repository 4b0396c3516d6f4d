"""Systems in and out of the engine: checks, graduation, refill and admission.

At a check step the engine reads back from the device, the only place it does: convergence
criteria move converged systems on (``ON_CONVERGE`` hooks run), systems that used a stage's
budget move on, graduated systems (``status >= exit_status``) go to the sinks, first sink with
room first, and the sampler refills their slots. Systems that arrive (from the sampler, or from
the previous rank of a pipeline) get the fields the engine and integrators read, their stage's
``init_state``, and fresh forces. Everything that enters is counted in ``loaded_count`` and
everything that leaves in ``written_count``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from alchemi_core.data import Batch
from alchemi_core.data.elements import masses_for
from alchemi_core.dynamics.columns import flatten_system_columns
from alchemi_core.dynamics.hook import dispatch
from alchemi_core.dynamics.measure import MODEL_FLAG, ON_CONVERGE, Measuring
from alchemi_core.dynamics.quarantine import Quarantined
from alchemi_core.dynamics.sinks import DataSink, HostMemory
from alchemi_core.dynamics.state import SubStage
from alchemi_core.errors import CapacityError, InvalidDataError
from alchemi_core.models.base import check_input


class Admission(Measuring):
    """The admission layer of the engine (see the module docstring)."""

    # ------------------------------------------------------------------ fields of new systems
    def _fill_defaults(self, batch: Batch, first: bool) -> None:
        """Give ``batch`` every field the engine and integrators read."""
        n, dev = batch.num_graphs, batch.device
        ftype = batch.positions.dtype
        if first:
            self.user_shapes = flatten_system_columns(batch)
        if "status" not in batch:
            batch.set_field("status", torch.full((n,), self.entry_status, dtype=torch.long, device=dev), "system")
        elif not first:
            # Quarantined systems passed on by an upstream rank keep their failure status.
            batch.status.copy_(torch.where(batch.status < 0, batch.status, self.entry_status))
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

    # ------------------------------------------------------------------ checks
    def check(self, k: int) -> None:
        """Convergence, budgets, graduation and refill (the only device read-backs)."""
        batch = self.batch
        assert batch is not None
        m = self._measure_check(k)
        before = m.before
        # One read-back for all: did this check move systems, did anything (a hook between
        # checks too) change a status since the masks were written, is any system left to step,
        # has every system graduated, did any go bad, and has a model an error to raise?
        # The wait for it is the GPU finishing the steps queued since the last check: the sampler
        # builds the structures the next refills will likely take meanwhile.
        # Where nothing done below changes what the next step computes, it is queued before the
        # wait (step.StepLoop._step_ahead): the GPU works on it while the host acts on the flags.
        ahead = self._steps_ahead_at(k)
        read = self._flags.read(m.flags, self._idle_work, (lambda: self._step_ahead(k + 1)) if ahead else None)
        any_moved, any_changed, any_active, all_graduated, any_bad, any_error = read[:MODEL_FLAG + 1]
        codes, moved = m.codes, m.moved
        read_at = batch.version
        if any_error:
            self._verify_or_restore(self.verify_models, before)
        if any_bad:
            assert codes is not None
            self._collect_quarantined(codes, k)
        for s, converged in zip(self.subs, read[MODEL_FLAG + 1:], strict=True):
            if converged:  # as in nvalchemi, ON_CONVERGE hooks run only when something converged
                dispatch(s.hooks[ON_CONVERGE], batch, k)
        # The masks follow the statuses from the host unless the step ahead rewrote them already,
        # or the run's steps rewrite them at their start (CoreTuning.masks_in_step).
        if any_changed and not (ahead or self._masks_in_step):
            self._masks_stale = True
        if any_moved:  # checks may read back; integrators' resets are not free
            _rest_after_optimisers(batch, self.subs, moved, before)
            batch.stage_steps.masked_fill_(moved, 0)
            if self._moves_enter_stages:
                self._init_entering(moved)
            # A captured step stays: the masks, and what the stages derived from them, are
            # rewritten in place below.
        if self.sampler is not None or self.sinks:
            if k % self.refill_frequency == 0:
                self._graduate_and_refill()
            elif k >= self._budget_check and not any_active:
                # A budget that ends between refill steps leaves its graduates in the batch, not
                # stepping, until the next refill step hands them on with the others: refilling
                # here too would admit systems out of step with the refill cadence, whose budgets
                # then end between refill steps again (on the quarantine benchmark, a chain of
                # one-system refills every 40 steps). Only a batch with nothing left to step
                # is handed on and refilled at once (graduates left at the end: _flush_graduates).
                self._graduate_and_refill()
        if self._masks_out_of_date():  # a refill rewrote them already; a quiet check keeps them
            self._update_masks()
        # Nothing entered or left since the read-back: its answers still hold.
        self._check_done((any_active, all_graduated) if batch.version == read_at else None)
        self._flush_graduates()

    def _idle_work(self) -> bool:
        """Host work while a check waits for the GPU: the sampler builds one structure ahead
        (False: nothing to do)."""
        sampler = self.sampler
        return sampler is not None and sampler.prefetch()

    def _flush_graduates(self) -> None:
        """When the run ends, graduates still waiting for a refill check go out now."""
        if self.done and (self.sampler is not None or self.sinks) and self.graduate_to_sinks:
            if self.batch is not None and self.batch.num_graphs and bool(self.graduated_mask().any()):
                self._graduate_and_refill()
                self._update_masks()

    def _collect_quarantined(self, codes: torch.Tensor, k: int) -> None:
        """Record the systems :meth:`_mark_quarantined` failed (the read-back found some)."""
        assert self.batch is not None
        self.quarantined.extend(self.health.collect(self.batch, codes, k))
        self._start_masking()

    def _start_masking(self) -> None:
        """From now on each stage steps only its own systems (a failed system must not step). A
        step captured unmasked steps every system: it is retired (its memory pool serves the next
        capture, ``capture.retire_graph``), and the next step captures anew. A step captured
        masked stays: it reads the masks, which the next update rewrites in place."""
        if self.masked:
            return
        self.masked = True
        for s in self.subs:
            s.buffers_version = -1  # masks allocated at the next update
        self._retire_step_graph()

    def _quarantine(self, k: int) -> bool:
        """Give structures that went bad their failure status (``quarantine``); True if any."""
        batch = self.batch
        if batch is None or batch.num_graphs == 0:
            return False
        found = self.health.find(batch, self.active_mask(), k)
        if not found:
            return False
        self.quarantined.extend(found)
        self._start_masking()
        return True

    def health_check(self, k: int) -> None:
        """The quarantine of a run without checks. Its codes are read at the next health check
        (:meth:`settle_health`), so the GPU's queue of steps never drains for it
        (:class:`~alchemi_core.dynamics.quarantine.PendingCodes`); ``strict`` raises at once."""
        self.settle_health()
        batch = self.batch
        if batch is None or batch.num_graphs == 0:
            return
        if self.health.strict:
            if self._quarantine(k):
                self._update_masks()
            return
        self._health_pending = self.health.start(batch, self.active_mask(), k)

    def quarantine_records(self) -> list[Quarantined]:
        """Every structure quarantined so far, a health check still on its way included."""
        self.settle_health()
        return list(self.quarantined)

    def settle_health(self) -> None:
        """Act on the last health check's codes: bad systems get their status and records."""
        pending, self._health_pending = self._health_pending, None
        if pending is None or self.batch is None:
            return
        found = self.health.settle(self.batch, pending)
        if found:
            self.quarantined.extend(found)
            self._start_masking()
            self._update_masks()

    def _check_done(self, known: tuple[bool, bool] | None = None) -> None:
        """Whether the run is over; ``known`` (any system active, all graduated) when the
        check's read-back answered it already."""
        batch = self.batch
        assert batch is not None
        if self.sampler is not None and not self.sampler.exhausted:
            return
        if batch.num_graphs == 0:
            self.done = True
            return
        if known is not None:
            any_active, all_graduated = known
            self.done = all_graduated if self.graduate_on_budget else not any_active
        elif self.graduate_on_budget:
            self.done = bool(self.graduated_mask().all())
        else:
            self.done = not bool(self.active_mask().any())

    def _graduate_and_refill(self) -> None:
        if self.graduate_to_sinks:
            grad = self.graduated_mask().cpu().numpy()
            if grad.any():
                self.write_to_sinks(np.nonzero(grad)[0])
        if self.sampler is not None and not self.sampler.exhausted:
            self.refill()

    def sink_list(self) -> list[DataSink]:
        """The run's sinks; without any, one unbounded ``HostMemory`` that ``run()`` returns."""
        if self.sinks:
            return self.sinks
        if self.host_results is None:
            self.host_results = HostMemory(capacity=None)
        return [self.host_results]

    def write_to_sinks(self, rows: np.ndarray) -> None:
        """Move systems ``rows`` out of the batch into the sinks, first sink with room first.

        Raises:
            CapacityError: Every sink is full; the systems that did not fit stay in the batch.
        """
        batch = self.batch
        assert batch is not None
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
        assert batch is not None and s is not None
        free_sys = batch.system_capacity - batch.num_graphs
        free_atoms = min(s.max_atoms, batch.node_capacity) - batch.num_nodes
        edge_room = batch.edge_capacity - batch.num_edges
        free_edges = min(s.max_edges, edge_room) if s.max_edges is not None else edge_room
        if free_sys <= 0 or free_atoms <= 0:
            return
        has_edges = batch.edge_capacity > 0
        incoming = s.request_batch(free_sys, free_atoms, free_edges if has_edges else None, batch.device)
        if incoming is None:
            return
        self.ids.admit(incoming.system_id.tolist(), "a refill from the sampler")
        self.admit(incoming)
        self.loaded_count += incoming.num_graphs
        self.sampled_count += incoming.num_graphs

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
        assert batch is not None
        self._fill_defaults(incoming, first=False)
        for m in self.models:
            check_input(m, incoming, stress=self.needs_stress)
        n0 = batch.num_graphs
        copied = batch.put(incoming)
        if copied != incoming.num_graphs and not partial:
            raise CapacityError(
                f"{incoming.num_graphs - copied} incoming systems do not fit the active batch "
                f"({batch.num_graphs}/{batch.system_capacity} systems, {batch.num_nodes}/"
                f"{batch.node_capacity} atoms)"
            )
        if copied:
            self._pass_empty_stages()
            new = torch.zeros(batch.num_graphs, dtype=torch.bool, device=batch.device)
            new[n0:] = True
            self._init_entering(new)
            self._update_masks()
            self.forward()
            self.verify_models()  # what the newcomers need (neighbour columns) before they step
            if self.track_energy_change:
                batch.energy_prev.copy_(batch.energy)
        return copied

    def after_removal(self) -> None:
        """Refresh masks after systems were taken out of the batch."""
        self._update_masks()


def _rest_after_optimisers(batch: Batch, subs: Sequence[SubStage], moved: torch.Tensor, before: torch.Tensor) -> None:
    """Systems leaving an optimiser (a stage whose ``velocities_are_physical`` is False, FIRE)
    leave at rest: its velocities are the minimiser's, not the atoms' (ASE keeps them apart too),
    so neither the next stage nor ``to_atoms`` of a relaxed structure inherits them."""
    for s in subs:
        if getattr(s.dynamics, "velocities_are_physical", True):
            continue
        left = moved & (before == s.code)
        batch.velocities.masked_fill_(left.index_select(0, batch.batch_idx).unsqueeze(-1), 0.0)
