"""``OrbModel`` (``model:orb``): an ORB network (orb-models) evaluated on whole batches.

ORB's networks take their edges from ORB's own graph: the nearest ``max_num_neighbors`` atoms
within its radius (6 Å; 20 or 120 neighbours), chosen by orb-models' batched neighbour search
(``batch_compute_pbc_radius_graph``, on nvalchemi-toolkit-ops). alchemi's radius edges would
differ wherever an atom has more neighbours than that, so each call builds ORB's graph of the
whole batch from alchemi's positions, cells and pbc (periodic systems wrapped into their cells
first, as ORB's calculator does) and calls the network's own ``predict``:

* conservative models (orb-v3 ``conservative``): forces ``-dE/dx`` and stress from the strain
  derivative, ORB's autograd (its ``grad_forces`` / ``grad_stress``);
* direct models (orb-v3 ``direct``, orb-v2): forces and stress from the network's heads.

Stress is ``dE/d(eps) / V``, positive under tension (alchemi's and ASE's sign). The neighbour
search reads sizes back from the device, so the step runs eagerly (``cuda_graphs = False``), and
the graph is built again every call (no skin). Weights files are state dicts, read with
``torch.load(weights_only=True)``: no code runs from them.

Example:
    >>> from alchemi_orb import OrbModel
    >>> model = OrbModel("orb-v3-conservative-inf-omat")    # file in $ALCHEMI_MODEL_DIR
    >>> model.card.cutoff, model.max_num_neighbors, model.conservative
    (6.0, 120, True)
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_core.models.base import BaseModel, ModelCard
from alchemi_orb.names import known_models, loader, model_names, pretrained, weights_file

if TYPE_CHECKING:
    from alchemi_core.data import Batch

_DTYPES = {"float32": torch.float32, "float64": torch.float64, torch.float32: torch.float32,
           torch.float64: torch.float64}
#: ORB's atom embedding is a one-hot of 118 classes (atomic numbers 0 to 117).
_SPECIES = tuple(range(1, 118))


def _load(name: str, path: str, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    """``(network, atoms adapter)`` from orb-models' own loader of ``name`` with weights ``path``,
    on the CPU, uncompiled. The loader sets torch's default dtype and float32 matmul precision
    for the whole process; both are put back."""
    default, matmul = torch.get_default_dtype(), torch.get_float32_matmul_precision()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Setting global torch default dtype", precision advice
            return loader(name)(weights_path=path, device="cpu", compile=False,
                                precision="float64" if dtype == torch.float64 else "float32-highest")
    finally:
        torch.set_default_dtype(default)
        torch.set_float32_matmul_precision(matmul)


class OrbModel(BaseModel):
    """An ORB network as an alchemi model (see the module docstring).

    Args:
        model: A published name (``"orb-v3-conservative-inf-omat"``, ...:
            :func:`alchemi_orb.names.model_names`), whose weights are found in
            ``$ALCHEMI_MODEL_DIR`` or cached-path's cache; a weights file (``.ckpt``, a state
            dict) of the architecture ``architecture`` names; or an ORB network
            (``ConservativeForcefieldRegressor`` / ``DirectForcefieldRegressor``) with its
            ``atoms_adapter``.
        architecture: For a weights file: the published name whose architecture it has.
        atoms_adapter: For a network: its ``ForcefieldAtomsAdapter`` (radius, neighbours).
        download: Let cached-path download a named model's weights that are not on this machine.
        dtype: ``"float32"`` or ``"float64"``.
        max_num_neighbors: Override the adapter's neighbours per atom (None: the model's).

    Raises:
        ConfigurationError: An unknown name, a file without ``architecture``, a network without
            ``atoms_adapter``, something that is not an ORB forcefield, or a bad dtype.
        MissingDependencyError: orb-models is not installed.
        ModelNotAvailableError: A named model whose weights are not here (and download=False)
            or whose download failed; the message says which file to place where.
    """

    cuda_graphs: ClassVar[bool] = False
    #: Device bytes per atom of a step in float32: orb-v3 conservative saves 5.7 MB per atom for
    #: its backward in W7's Cu (78 edges per atom; counted with saved-tensor hooks on a CPU),
    #: doubled for the backward's own peak; to be replaced by a GPU measurement.
    BYTES_PER_ATOM: ClassVar[float] = 1.2e7
    species_hint: ClassVar[str] = "ORB embeds atomic numbers 1 to 117"
    #: The published names, their files and where they are here (``alchemi list-components --models``).
    known_models = staticmethod(known_models)

    def __init__(self, model: str | os.PathLike[str] | torch.nn.Module = "orb-v3-conservative-inf-omat", *,
                 architecture: str | None = None, atoms_adapter: Any = None, download: bool = False,
                 dtype: Any = "float32", max_num_neighbors: int | None = None) -> None:
        super().__init__()
        if dtype not in _DTYPES:
            raise ConfigurationError(f"model:orb: dtype must be 'float32' or 'float64', got {dtype!r}")
        dt = _DTYPES[dtype]
        network, adapter = self._network(model, architecture, atoms_adapter, download, dt)
        from orb_models.forcefield.models.conservative_regressor import ConservativeForcefieldRegressor
        from orb_models.forcefield.models.direct_regressor import DirectForcefieldRegressor

        if not isinstance(network, (ConservativeForcefieldRegressor, DirectForcefieldRegressor)):
            raise ConfigurationError(
                f"model:orb: expected an ORB forcefield (ConservativeForcefieldRegressor or "
                f"DirectForcefieldRegressor), got {type(network).__name__}"
            )
        self.conservative = isinstance(network, ConservativeForcefieldRegressor)
        if self.conservative:
            network.prepare_for_inference()  # stress by autograd, always available
        self.network = network.to(dt).eval()
        for p in self.network.parameters():
            p.requires_grad_(False)
        self.dtype = dt
        self.radius = float(adapter.radius)
        self.max_num_neighbors = int(max_num_neighbors or adapter.max_num_neighbors)
        from orb_models.common.models.nn_util import ChargeSpinConditioner

        charged = isinstance(getattr(self.network.model, "conditioner", None), ChargeSpinConditioner)
        has_stress = "stress" in self._output_names()
        self.card = ModelCard(name="orb", cutoff=self.radius, periodic=True, stress=has_stress, species=_SPECIES,
                              needs_charge=charged, needs_spin=charged)

    @staticmethod
    def _network(model: Any, architecture: str | None, atoms_adapter: Any, download: bool,
                 dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
        """``(network, adapter)`` from a name, a weights file or a network."""
        if isinstance(model, torch.nn.Module):
            if atoms_adapter is None:
                raise ConfigurationError(
                    "model:orb: a network needs its atoms_adapter (the ForcefieldAtomsAdapter orb-models' "
                    "pretrained functions return with it)"
                )
            return model, atoms_adapter
        pretrained()  # orb-models is installed
        name = os.fspath(model)
        names = model_names()
        if os.path.isfile(name):
            if architecture not in names:
                raise ConfigurationError(
                    f"model:orb: {name!r} is a weights file; name its architecture with architecture= one of "
                    f"{sorted(names)} (got {architecture!r})"
                )
            return _load(architecture, name, dtype)
        if name not in names:
            raise ConfigurationError(
                f"model:orb: {name!r} is neither a published ORB model ({', '.join(sorted(names))}) nor a file"
            )
        return _load(name, weights_file(name, download), dtype)

    def _output_names(self) -> dict[str, str]:
        """The network's output key of each of energy, forces and (where it has one) stress."""
        net = self.network
        if self.conservative:
            out = {"energy": "energy", "forces": net.grad_forces_name}
            if net.has_stress:
                out["stress"] = net.grad_stress_name
            return out
        return {k: k for k in ("energy", "forces", "stress") if k in net.heads}

    def check_batch(self, batch: Batch) -> None:
        """Also refuse systems periodic along some axes only (ORB's own calculator refuses them:
        its networks know fully periodic and open systems; one read-back).

        Raises:
            InvalidDataError: Names the partly periodic systems and the fix.
        """
        super().check_batch(batch)
        pbc = periodic_axes(batch)
        index = torch.nonzero(pbc.any(1) & ~pbc.all(1)).view(-1).cpu()
        if len(index):
            raise InvalidDataError(
                f"model 'orb': systems {index[:10].tolist()} are periodic along some axes only; ORB takes "
                f"systems periodic along all three axes or none: make a slab periodic in all three with at "
                f"least {self.radius} Å of vacuum"
            )

    def bytes_per_atom(self) -> float:
        """Device bytes one atom needs in a step (the class's estimate, doubled in float64)."""
        return self.BYTES_PER_ATOM * (2 if self.dtype == torch.float64 else 1)

    def forward(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        """Energies ``[B, 1]``, forces ``[V, 3]`` and, when asked, stress ``[B, 3, 3]``."""
        from orb_models.forcefield.models.forcefield_utils import torch_voigt_6_to_full_3x3_stress

        out_dtype = batch.positions.dtype
        if batch.num_nodes == 0:  # ORB's neighbour search needs atoms
            out = {"energy": batch.positions.new_zeros((batch.num_graphs, 1)), "forces": batch.positions.new_zeros((0, 3))}
            if compute_stress:
                out["stress"] = batch.positions.new_zeros((batch.num_graphs, 3, 3))
            return out
        if next(self.network.parameters()).device != batch.positions.device:
            self.network.to(batch.positions.device)
        graph = atom_graphs(batch, self.radius, self.max_num_neighbors, self.dtype, self.card.needs_charge)
        with torch.enable_grad():  # conservative forces and stress are ORB's autograd
            predicted = self.network.predict(graph)
        names = self._output_names()
        out = {"energy": predicted[names["energy"]].detach().to(out_dtype).view(-1, 1),
               "forces": predicted[names["forces"]].detach().to(out_dtype)}
        if compute_stress:
            stress = predicted[names["stress"]].detach().view(-1, 6)
            out["stress"] = torch_voigt_6_to_full_3x3_stress(stress).to(out_dtype)
        return out

    def extra_repr(self) -> str:
        kind = "conservative" if self.conservative else "direct"
        return f"{kind}, radius={self.radius}, max_num_neighbors={self.max_num_neighbors}, dtype={self.dtype}"


def periodic_axes(batch: Batch) -> torch.Tensor:
    """``[B, 3]`` bool: the periodic axes of each system (none where the batch has no pbc)."""
    if "pbc" in batch:
        return batch.pbc.view(-1, 3).bool()
    return torch.zeros((batch.num_graphs, 3), dtype=torch.bool, device=batch.positions.device)


def wrapped_positions(batch: Batch, cell: torch.Tensor) -> torch.Tensor:
    """``[V, 3]`` positions in float64 with fractional coordinates along periodic axes brought
    into ``[0, 1)`` (as ORB's calculator does before its neighbour search); open axes and
    systems stay as they are."""
    pos = batch.positions.detach().double()
    idx = batch.batch_idx
    pbc = periodic_axes(batch)
    cell = cell.double()
    # open systems may have no cell: the identity keeps the solve regular (their result is unused)
    solvable = torch.where(pbc.any(1).view(-1, 1, 1), cell, torch.eye(3, dtype=cell.dtype, device=cell.device))
    frac = torch.linalg.solve(solvable.transpose(1, 2)[idx], pos)
    frac = torch.where(pbc[idx], frac % 1.0, frac)
    wrapped = torch.bmm(frac.unsqueeze(1), solvable[idx]).squeeze(1)
    return torch.where(pbc[idx].any(1, keepdim=True), wrapped, pos)


def atom_graphs(batch: Batch, radius: float, max_num_neighbors: int, dtype: torch.dtype, charged: bool) -> Any:
    """ORB's ``AtomGraphs`` of every system in ``batch``: ORB's neighbour search
    (``batch_compute_pbc_radius_graph``) on the wrapped positions, in ``dtype``; total charge
    and spin multiplicity as system features when ``charged``."""
    from orb_models.common.atoms import graph_featurization
    from orb_models.common.atoms.batch.graph_batch import AtomGraphs

    device = batch.positions.device
    n_node = batch.node_counts.long()
    cell = batch.cell.detach().view(-1, 3, 3).to(dtype) if "cell" in batch else \
        torch.zeros((batch.num_graphs, 3, 3), dtype=dtype, device=device)
    pbc = periodic_axes(batch)
    positions = wrapped_positions(batch, cell).to(dtype)
    cap = torch.full_like(n_node, max_num_neighbors)
    edge_index, vectors, unit_shifts, n_edge = graph_featurization.batch_compute_pbc_radius_graph(
        positions=positions.contiguous(), cells=cell, pbcs=pbc, radius=torch.tensor([radius], device=device),
        max_number_neighbors=cap, n_node=n_node, node_batch_index=batch.batch_idx, device=device,
        float_dtype=dtype,
    )
    numbers = batch.atomic_numbers.long()
    system: dict[str, torch.Tensor] = {"cell": cell, "pbc": pbc}
    if charged:
        system["total_charge"] = batch.charge.view(-1).to(dtype)
        system["spin_multiplicity"] = batch.spin.view(-1).to(dtype)
    return AtomGraphs(
        senders=edge_index[0].long(), receivers=edge_index[1].long(), n_node=n_node, n_edge=n_edge,
        node_features={"positions": positions, "atomic_numbers": numbers,
                       "atomic_numbers_embedding": torch.nn.functional.one_hot(numbers, 118).to(dtype)},
        edge_features={"vectors": vectors.to(dtype), "unit_shifts": unit_shifts.to(dtype)},
        system_features=system, node_targets={}, edge_targets={}, system_targets={}, system_id=None,
        fix_atoms=None, tags=None, radius=radius, max_num_neighbors=cap,
    )
