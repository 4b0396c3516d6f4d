"""Systems in and out of a run: the fields new systems need, graduation, refill and admission.

Graduated systems (``status >= exit_status``, or quarantined) go to the sinks, first sink with
room first, and the sampler refills their slots. Systems that arrive (from the sampler, or from
the previous rank of a pipeline) get the fields the engine and integrators read, their stage's
``init_state``, and fresh forces. Everything that enters is counted in ``loaded_count`` and
everything that leaves in ``written_count``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from alchemi_core.data import Batch
from alchemi_core.data.elements import masses_for
from alchemi_core.dynamics.columns import flatten_system_columns
from alchemi_core.dynamics.forward import forward, verify_models
from alchemi_core.dynamics.masks import Masks
from alchemi_core.dynamics.sinks import DataSink, HostMemory
from alchemi_core.dynamics.state import RunState
from alchemi_core.errors import CapacityError, InvalidDataError
from alchemi_core.models.base import check_input


class Admission:
    """Moves systems into and out of a run's batch (see the module docstring).

    Args:
        state: The run's state.
        masks: Rewritten whenever systems arrive or leave.
    """

    def __init__(self, state: RunState, masks: Masks) -> None:
        self.state, self.masks = state, masks

    # ------------------------------------------------------------------ fields of new systems
    def fill_defaults(self, batch: Batch, first: bool) -> None:
        """Give ``batch`` every field the engine and integrators read."""
        st = self.state
        n, dev = batch.num_graphs, batch.device
        ftype = batch.positions.dtype
        if first:
            st.user_shapes = flatten_system_columns(batch)
        if "status" not in batch:
            batch.set_field("status", torch.full((n,), st.entry_status, dtype=torch.long, device=dev), "system")
        elif not first:
            # Quarantined systems passed on by an upstream rank keep their failure status.
            batch.status.copy_(torch.where(batch.status < 0, batch.status, st.entry_status))
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
        if st.track_fmax and ("fmax" not in batch or not first):
            batch.set_field("fmax", torch.full((n,), math.inf, dtype=ftype, device=dev), "system")
        if st.track_energy_change:
            if "energy_change" not in batch or not first:
                batch.set_field("energy_change", torch.full((n,), math.inf, dtype=ftype, device=dev), "system")
            if "energy_prev" not in batch or not first:
                batch.set_field("energy_prev", batch.energy.clone(), "system")
        bad = ~torch.isfinite(batch.positions).all(dim=1)
        if bool(bad.any()):
            systems = torch.unique(batch.batch_idx[bad]).tolist()
            ids = batch.system_id[systems].tolist() if "system_id" in batch else systems
            raise InvalidDataError(f"positions are NaN or infinite in systems with system_id {ids[:10]}")

    def with_capacity(self, batch: Batch) -> Batch:
        """Move the sampler's batch into buffers sized for the sampler's budgets."""
        s = self.state.sampler
        assert s is not None
        cap_sys, cap_edges = s.batch_capacity()
        cap_sys = max(cap_sys, batch.num_graphs)
        buf = Batch.empty(
            num_systems=cap_sys,
            num_nodes=max(s.max_atoms, batch.num_nodes),
            num_edges=max(cap_edges, batch.num_edges),
            template=batch,
        )
        buf.put(batch)
        return buf

    # ------------------------------------------------------------------ out
    def check_done(self, batch: Batch, known: tuple[bool, bool] | None = None) -> None:
        """Whether the run is over; ``known`` (any system active, all graduated) when the
        check's read-back answered it already."""
        st = self.state
        if st.sampler is not None and not st.sampler.exhausted:
            return
        if batch.num_graphs == 0:
            st.done = True
            return
        if known is not None:
            any_active, all_graduated = known
            st.done = all_graduated if st.graduate_on_budget else not any_active
        elif st.graduate_on_budget:
            st.done = bool(st.graduated_mask().all())
        else:
            st.done = not bool(st.active_mask().any())

    def flush_graduates(self, batch: Batch) -> None:
        """When the run ends, graduates still waiting for a refill check go out now."""
        st = self.state
        if st.done and (st.sampler is not None or st.sinks) and st.graduate_to_sinks:
            if batch.num_graphs and bool(st.graduated_mask().any()):
                self.graduate_and_refill(batch)
                self.masks.update(batch)

    def graduate_and_refill(self, batch: Batch) -> None:
        st = self.state
        if st.graduate_to_sinks:
            grad = st.graduated_mask().cpu().numpy()
            if grad.any():
                self.write_to_sinks(batch, np.nonzero(grad)[0])
        if st.sampler is not None and not st.sampler.exhausted:
            self.refill(batch)

    def sink_list(self) -> list[DataSink]:
        """The run's sinks; without any, one unbounded ``HostMemory`` that ``run()`` returns."""
        st = self.state
        if st.sinks:
            return st.sinks
        if st.host_results is None:
            st.host_results = HostMemory(capacity=None)
        return [st.host_results]

    def write_to_sinks(self, batch: Batch, rows: np.ndarray) -> None:
        """Move systems ``rows`` out of the batch into the sinks, first sink with room first.

        Raises:
            CapacityError: Every sink is full; the systems that did not fit stay in the batch.
        """
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
            self.state.written_count += len(written)
        if remaining:
            ids = batch.system_id[batch.status >= self.state.exit_status].tolist()
            caps = ", ".join(f"{type(s).__name__} {len(s)}/{s.capacity}" for s in self.sink_list())
            raise CapacityError(
                f"every sink is full ({caps}): {len(remaining)} graduated systems (system_id "
                f"{ids[:10]}{'...' if len(ids) > 10 else ''}) stay in the active batch "
                "(dynamics.active_batch). Everything written before is in the sinks; add a sink or "
                "raise a capacity and run again"
            )

    # ------------------------------------------------------------------ in
    def refill(self, batch: Batch) -> None:
        """Fill free slots from the sampler (best fit within the remaining budgets)."""
        st = self.state
        s = st.sampler
        assert s is not None
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
        st.ids.admit(incoming.system_id.tolist(), "a refill from the sampler")
        self.admit(batch, incoming)
        st.loaded_count += incoming.num_graphs
        st.sampled_count += incoming.num_graphs

    def admit(self, batch: Batch, incoming: Batch, partial: bool = False) -> int:
        """Put new systems into ``batch`` at ``entry_status`` and refresh forces.

        Args:
            batch: The run's batch.
            incoming: The systems (a batch or a receive buffer; its status fields are reset).
            partial: Copy as many as fit instead of requiring all to fit.

        Returns:
            How many were copied (``incoming._copied_mask`` says which).

        Raises:
            CapacityError: Not all fit and ``partial`` is False.
        """
        st = self.state
        self.fill_defaults(incoming, first=False)
        for m in st.models:
            check_input(m, incoming, stress=st.needs_stress)
        n0 = batch.num_graphs
        copied = batch.put(incoming)
        if copied != incoming.num_graphs and not partial:
            raise CapacityError(
                f"{incoming.num_graphs - copied} incoming systems do not fit the active batch "
                f"({batch.num_graphs}/{batch.system_capacity} systems, {batch.num_nodes}/"
                f"{batch.node_capacity} atoms)"
            )
        if copied:
            self.masks.pass_empty_stages(batch)
            new = torch.zeros(batch.num_graphs, dtype=torch.bool, device=batch.device)
            new[n0:] = True
            self.masks.init_entering(batch, new)
            self.masks.update(batch)
            if st.forces_on_entry:
                forward(st, batch)
                verify_models(st.models, batch)  # what the newcomers need (neighbour columns) before they step
            if st.track_energy_change:
                batch.energy_prev.copy_(batch.energy)
        return copied
