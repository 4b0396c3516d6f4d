"""``TorchSimModel`` (``model:torchsim``): any TorchSim model as an alchemi model.

TorchSim (``torch-sim-atomistic``) models implement ``torch_sim.models.interface.ModelInterface``:
they take a ``SimState`` (positions, masses, cell as column vectors, one ``pbc`` for the whole
state, atomic numbers, system index) and return ``energy [B]``, ``forces [V, 3]`` and, when built
with ``compute_stress=True``, ``stress [B, 3, 3]``, in eV and Å, with alchemi's stress sign
(positive under tension). Most MLIP packages ship such a wrapper (``MaceTorchSimModel``,
``OrbTorchSimModel``, ...), so this adapter runs a model alchemi has no native plugin for in
alchemi's engine: samplers, fused stages, sinks, hooks and workflows.

What it costs against a native plugin: the ``SimState`` is built once per set of systems
(``batch.version``) and each step only rebinds its positions and cell to the batch's, so the
adapter itself reads nothing back and allocates nothing per step (except a cast when the batch's
dtype differs from the model's). A ``SimState`` holds one ``pbc`` for all its systems: a batch
that mixes periodicities (crystals and molecules) gets one state per periodicity and one model
call each, with its positions gathered and its results scattered back at every step. The
TorchSim model then does what it does under TorchSim: it builds its own neighbour list at every
call and most wrappers read sizes back from the device (``SimState.n_systems``) or copy the
state, so a step cannot be captured as a CUDA graph.

Example:
    >>> from torch_sim.models.lennard_jones import LennardJonesModel
    >>> lj = LennardJonesModel(sigma=3.405, epsilon=0.0104, cutoff=8.5, compute_stress=True)
    >>> model = TorchSimModel(lj)
    >>> model.card.name, model.card.cutoff, model.card.stress
    ('torchsim:LennardJonesModel', 8.5, True)
"""

from __future__ import annotations

import importlib
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from alchemi_core.errors import ConfigurationError, InvalidDataError, MissingDependencyError
from alchemi_core.models.base import BaseModel, ModelCard

if TYPE_CHECKING:
    from torch_sim.models.interface import ModelInterface
    from torch_sim.state import SimState

    from alchemi_core.data import Batch


def import_torch_sim() -> Any:
    """The ``torch_sim`` module.

    Raises:
        MissingDependencyError: torch-sim-atomistic is not installed.
    """
    try:
        import torch_sim
    except ImportError as exc:
        raise MissingDependencyError(
            f"model:torchsim needs torch-sim-atomistic (Python >= 3.12): pip install alchemi-torchsim ({exc})"
        ) from exc
    return torch_sim


def build_target(target: str, kwargs: Mapping[str, Any], trust_import: bool) -> Any:
    """The TorchSim model class ``target`` (``"package.module:Class"``) names, built with
    ``kwargs``: how a workflow file names one. Importing a module runs its code, so this needs
    ``trust_import=True``; the class must be a ``ModelInterface`` before it is called.

    Raises:
        ConfigurationError: ``trust_import`` is not True, ``target`` is not ``module:Class``,
            cannot be imported, or is not a TorchSim model class.
    """
    from torch_sim.models.interface import ModelInterface

    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(
            f"model:torchsim: model={target!r} must name a class as 'package.module:Class' "
            "(e.g. 'torch_sim.models.lennard_jones:LennardJonesModel'), or be a TorchSim model object"
        )
    if trust_import is not True:
        raise ConfigurationError(
            f"model:torchsim: model={target!r} imports {module_name!r}, which runs its code; pass "
            "trust_import=True (in a workflow file: trust_import = true) if you trust it, or pass the model object"
        )
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"model:torchsim: cannot import {target!r}: {exc}") from exc
    if not (isinstance(obj, type) and issubclass(obj, ModelInterface)):
        raise ConfigurationError(f"model:torchsim: {target!r} is not a TorchSim model class (a ModelInterface)")
    return obj(**dict(kwargs))


def _cutoff_of(model: Any) -> float | None:
    """The interaction range a TorchSim model states (``cutoff`` or ``r_max``), if any."""
    for name in ("cutoff", "r_max"):
        value = getattr(model, name, None)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


@attrs.frozen
class _Group:
    """The systems of one periodicity: their ``SimState`` and, when the batch holds others too,
    their atoms' and systems' rows in the batch (None: the whole batch)."""

    state: SimState
    atoms: torch.Tensor | None
    systems: torch.Tensor | None


class TorchSimModel(BaseModel):
    """A TorchSim ``ModelInterface`` as an alchemi model (see the module docstring).

    Args:
        model: A TorchSim model object, or the import path of its class (``"module:Class"``)
            to build with ``model_kwargs`` (for workflow files). It must compute forces; it
            gives stress when it was built with ``compute_stress=True``.
        model_kwargs: Arguments of the class ``model`` names (only with an import path).
        trust_import: Confirms that the module an import path names may be imported (which
            runs its code).
        species: Atomic numbers the model has parameters for (None: any; TorchSim models do not
            say). Systems with others are refused when they enter a run.
        cutoff: Interaction range in Å for the card (None: the model's ``cutoff`` or ``r_max``).
        memory_per_atom: Device bytes one atom needs in a step, for a sampler that plans its
            batches from memory (None: the sampler's generic estimate, far below an MLIP's;
            :meth:`measure_bytes_per_atom` measures it on a GPU).

    Raises:
        ConfigurationError: ``model`` is not a TorchSim model, computes no forces, or is an
            import path without ``trust_import=True`` or that cannot be built.
        MissingDependencyError: torch-sim-atomistic is not installed.
    """

    def __init__(self, model: ModelInterface | str, *, model_kwargs: Mapping[str, Any] | None = None,
                 trust_import: bool = False, species: Sequence[int] | None = None,
                 cutoff: float | None = None, memory_per_atom: float | None = None) -> None:
        super().__init__()
        import_torch_sim()
        from torch_sim.models.interface import ModelInterface

        if isinstance(model, str):
            model = build_target(model, model_kwargs or {}, trust_import)
        elif model_kwargs:
            raise ConfigurationError("model:torchsim: model_kwargs go with an import path as model=, not an object")
        if not isinstance(model, ModelInterface):
            raise ConfigurationError(
                f"model:torchsim: expected a TorchSim model (a torch_sim.models.interface.ModelInterface), "
                f"got {type(model).__name__}"
            )
        if not model.compute_forces:
            raise ConfigurationError(
                f"model:torchsim: {type(model).__name__} was built with compute_forces=False; alchemi's "
                "integrators need forces: build it with compute_forces=True"
            )
        self.model = model
        self.card = ModelCard(
            name=f"torchsim:{type(model).__name__}",
            cutoff=cutoff if cutoff is not None else _cutoff_of(model),
            periodic=True,
            stress=bool(model.compute_stress),
            species=tuple(int(z) for z in species) if species is not None else None,
        )
        self.memory_per_atom = memory_per_atom
        # The SimStates of the batch (and set of systems) last seen; rebuilt when either changes.
        self._groups: list[_Group] = []
        self._batch: weakref.ref[Batch] | None = None
        self._version = -1

    @property
    def dtype(self) -> torch.dtype:
        """The TorchSim model's dtype: positions and cell are cast to it, results back."""
        return self.model.dtype

    @property
    def device(self) -> torch.device:
        """Where the TorchSim model runs (fixed when it was built)."""
        return torch.device(self.model.device)

    def bytes_per_atom(self) -> float:
        """Device bytes one atom needs in a step: ``memory_per_atom`` or a measurement
        (:meth:`measure_bytes_per_atom`), else the sampler's generic estimate."""
        from alchemi_core.dynamics.device_memory import BYTES_PER_ATOM_ESTIMATE

        return float(self.memory_per_atom if self.memory_per_atom is not None else BYTES_PER_ATOM_ESTIMATE)

    def measure_bytes_per_atom(self, batch: Batch, headroom: float = 1.25) -> float:
        """Measure the peak device memory per atom (with ``headroom``) of a step on ``batch``'s
        GPU; :meth:`bytes_per_atom` returns it from then on (on a CPU: nothing is measured).

        Example:
            >>> model.measure_bytes_per_atom(batch.to("cuda"))   # doctest: +SKIP
            2.9e5
        """
        device = batch.positions.device
        if device.type != "cuda" or batch.num_nodes == 0:
            return self.bytes_per_atom()
        self(batch, compute_stress=self.card.stress)  # warm: the SimState, caches, kernels
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        self(batch, compute_stress=self.card.stress)
        torch.cuda.synchronize(device)
        self.memory_per_atom = headroom * (torch.cuda.max_memory_allocated(device) - base) / batch.num_nodes
        return self.memory_per_atom

    def check_batch(self, batch: Batch) -> None:
        """Besides species and cells: the batch lives on the model's device.

        Raises:
            InvalidDataError: Names both devices and how to build the model for the batch's.
        """
        super().check_batch(batch)
        here = self.device
        if batch.device.type != here.type or here.index not in (None, batch.device.index):
            raise InvalidDataError(
                f"{self.card.name}: the batch is on {batch.device} but the TorchSim model was built on "
                f"{here} (TorchSim models cannot move); build it with device={str(batch.device)!r}"
            )

    def forward(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        """Energies ``[B, 1]``, forces ``[V, 3]`` and, when asked, stress ``[B, 3, 3]`` (eV, Å),
        in the positions' dtype."""
        groups = self._groups_for(batch)
        dtype, like = self.dtype, batch.positions.dtype
        pos = batch.positions.detach().to(dtype)
        # TorchSim holds cell vectors as columns: a transposed view of alchemi's rows.
        cell = batch.cell.detach().view(-1, 3, 3).to(dtype).mT if "cell" in batch else None
        if len(groups) == 1:  # one periodicity: the SimState's tensors are the batch's own
            state = groups[0].state
            state.positions = pos
            if cell is not None:
                state.cell = cell
            out = self.model(state)
            energy, forces = out["energy"], out["forces"]
            stress = out["stress"] if compute_stress else None
        else:
            n = batch.num_graphs
            energy, forces = pos.new_empty(n), torch.empty_like(pos)
            stress = pos.new_empty((n, 3, 3)) if compute_stress else None
            for g in groups:
                assert g.atoms is not None and g.systems is not None  # set whenever there are several
                g.state.positions = pos.index_select(0, g.atoms)
                if cell is not None:
                    g.state.cell = cell.index_select(0, g.systems)
                out = self.model(g.state)
                energy.index_copy_(0, g.systems, out["energy"])
                forces.index_copy_(0, g.atoms, out["forces"])
                if stress is not None:
                    stress.index_copy_(0, g.systems, out["stress"])
        result = {"energy": energy.to(like).view(-1, 1), "forces": forces.to(like)}
        if stress is not None:
            result["stress"] = stress.to(like)
        return result

    def _groups_for(self, batch: Batch) -> list[_Group]:
        """One :class:`_Group` per periodicity in ``batch``: built when the batch or its set of
        systems changed (TorchSim checks the system index there, reading back), else those held."""
        held = self._batch() if self._batch is not None else None
        if self._groups and held is batch and batch.version == self._version:
            return self._groups
        n = batch.num_graphs
        pbc = batch.pbc.view(n, 3).bool() if "pbc" in batch else torch.zeros((n, 3), dtype=torch.bool)
        rows = pbc.cpu()
        kinds = sorted({tuple(r) for r in rows.tolist()}) if n else [(False,) * 3]
        if len(kinds) == 1:
            groups = [_Group(self._state(batch, None, pbc[0] if n else pbc.new_zeros(3)), None, None)]
        else:  # a SimState holds one pbc: one state per periodicity, systems in batch order
            groups = []
            system_of, on = batch.batch_idx.cpu(), batch.positions.device
            for kind in kinds:
                systems = torch.nonzero((rows == torch.tensor(kind)).all(dim=1)).view(-1)
                atoms = torch.nonzero(torch.isin(system_of, systems)).view(-1).to(on)
                systems = systems.to(on)
                groups.append(_Group(self._state(batch, (atoms, systems), torch.tensor(kind)), atoms, systems))
        self._groups, self._batch, self._version = groups, weakref.ref(batch), batch.version
        return groups

    def _state(self, batch: Batch, part: tuple[torch.Tensor, torch.Tensor] | None, pbc: torch.Tensor) -> SimState:
        """A ``SimState`` of ``batch``'s systems (of ``part``: their atoms and systems)."""
        import torch_sim as ts

        from alchemi_core.data.elements import masses_for

        dtype, n, device = self.dtype, batch.num_graphs, batch.positions.device
        fields: dict[str, torch.Tensor] = {
            "positions": batch.positions.detach().to(dtype),
            "masses": batch.atomic_masses if "atomic_masses" in batch else masses_for(batch.atomic_numbers, dtype),
            "atomic_numbers": batch.atomic_numbers.long(),
            "system_idx": batch.batch_idx,
        }
        system: dict[str, torch.Tensor] = {
            "cell": batch.cell.detach().view(n, 3, 3) if "cell" in batch else torch.zeros((n, 3, 3), device=device),
        }
        # Total charge (e) and spin multiplicity (2S + 1) per system, where TorchSim wrappers read them.
        system.update({k: getattr(batch, k).detach().view(n) for k in ("charge", "spin") if k in batch})
        if part is not None:
            atoms, systems = part
            fields = {k: v.index_select(0, atoms) for k, v in fields.items()}
            fields["system_idx"] = torch.searchsorted(systems, fields["system_idx"])  # 0, 1, ... in the part
            system = {k: v.index_select(0, systems) for k, v in system.items()}
        cell = system.pop("cell").to(dtype).mT
        return ts.SimState(
            positions=fields["positions"], masses=fields["masses"].detach().to(dtype), cell=cell,
            pbc=pbc.to(device), atomic_numbers=fields["atomic_numbers"], system_idx=fields["system_idx"],
            _system_extras={k: v.to(dtype) for k, v in system.items()},
        )

    def __getstate__(self) -> dict[str, Any]:
        # A weak reference does not pickle; a copy builds its SimState at its first call.
        state = dict(super().__getstate__())
        state.update(_groups=[], _batch=None, _version=-1)
        return state

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}, device={self.device}, stress={self.card.stress}"
