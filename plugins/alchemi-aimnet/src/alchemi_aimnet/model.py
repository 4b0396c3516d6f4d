"""``AIMNet2Model`` (``model:aimnet2``): an AIMNet2 network evaluated on whole batches through
aimnet's own calculator.

Each system's total charge (the system field ``charge``, ``atoms.info["charge"]``) goes in, and,
for spin-polarised (NSE) models, its spin multiplicity (``spin``, ``atoms.info["spin"]``);
energies, forces, stress (periodic systems) and the predicted partial charges (atom field
``charges``, e) come out. The batch goes to ``AIMNet2Calculator.eval`` as one flat set of atoms
with a molecule index, so the network, its long-range Coulomb and its DFT-D3 run exactly as the
package computes them, on the neighbour matrices the calculator builds itself (nvalchemi-toolkit-ops
cell lists): AIMNet2 reads its own padded neighbour-matrix layout with one list for the network
and others for Coulomb (every pair of a molecule) and D3, which alchemi's COO edges do not give.
Molecules take the full Coulomb sum ("simple"); periodic systems take ``periodic_coulomb``
(DSF by default, what aimnet's ASE calculator switches to for a cell), so a batch that mixes
both is evaluated in two calls. The calculator reads values back from the device and allocates
per call: ``cuda_graphs = False``. aimnet computes in float32; results come back in the positions'
dtype.

Example:
    >>> import os, tempfile
    >>> from alchemi_aimnet.random_model import random_aimnet2_file
    >>> model = AIMNet2Model(random_aimnet2_file(os.path.join(tempfile.mkdtemp(), "r.pt")))
    >>> model.card.needs_charge, model.card.periodic, model.card.species[:3]
    (True, True, (1, 6, 7))
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from alchemi_core.errors import ConfigurationError, InvalidDataError, MissingDependencyError
from alchemi_core.models.base import BaseModel, ModelCard
from alchemi_potentials.model_files import local_file

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Coulomb methods aimnet offers for periodic systems.
PERIODIC_COULOMB = ("dsf", "ewald", "pme")


def _calculators() -> Any:
    try:
        import aimnet.calculators
        import aimnet.calculators.model_registry
        import aimnet.models.base
    except ImportError as exc:
        raise MissingDependencyError(f"model:aimnet2 needs aimnet: pip install aimnet ({exc})") from exc
    return aimnet.calculators


def model_file(model: str | os.PathLike[str], download: bool = False) -> tuple[str, str | None]:
    """The file ``model`` names and its registry family: a file is itself (family None); a name in
    aimnet's model registry (``"aimnet2"``, ``"aimnet2-wb97m-d3_0"``, ...) is looked for as
    ``$ALCHEMI_MODEL_DIR/<file>`` and in aimnet's cache (``$AIMNET_CACHE_DIR``, else
    ``~/.cache/aimnet``); only with ``download=True`` does aimnet fetch a missing one.

    Raises:
        ConfigurationError: Neither a file nor a name aimnet knows.
        ModelNotAvailableError: The name's file is not here (which file to place where, or
            ``download=True``), or its download failed (no network).

    Example:
        >>> from alchemi_core.errors import ConfigurationError
        >>> try:
        ...     model_file("no-such-model")
        ... except ConfigurationError as err:
        ...     print(str(err)[:59])
        model:aimnet2: 'no-such-model' is neither a file nor a name
    """
    registry = _calculators().model_registry
    name = os.fspath(model)
    if os.path.isfile(name):
        return name, None
    key = registry.try_resolve_registry_model_name(name)
    if key is None:
        raise ConfigurationError(
            f"model:aimnet2: {name!r} is neither a file nor a name in aimnet's model registry "
            "(e.g. 'aimnet2', 'aimnet2-wb97m-d3_0')"
        )
    entry = registry.load_model_registry()["models"][key]
    cached = os.path.join(registry.get_cache_dir(), entry["file"])
    path = local_file("model:aimnet2", name, entry["file"], entry["url"], [cached],
                      lambda: registry.get_registry_model_path(key), download)
    return path, registry.get_registry_model_family(key)


def _periodic(batch: Batch) -> torch.Tensor:
    """``[B]`` bool: the systems periodic in some direction."""
    if "pbc" not in batch:
        return torch.zeros(batch.num_graphs, dtype=torch.bool, device=batch.positions.device)
    return batch.pbc.reshape(batch.num_graphs, 3).any(dim=1)


class AIMNet2Model(BaseModel):
    """An AIMNet2 network as an alchemi model (see the module docstring).

    Args:
        model: A name in aimnet's model registry (its file in ``$ALCHEMI_MODEL_DIR`` or aimnet's
            cache: :func:`model_file`) or the path of an aimnet model file (``.pt``, the format
            ``aimnet export`` writes; ``.jpt`` TorchScript with ``trust_model_file=True``).
        download: Let aimnet download a named model that is not on this machine.
        periodic_coulomb: Long-range Coulomb of periodic systems: ``"dsf"``, ``"ewald"`` or
            ``"pme"`` (molecules always take the full pairwise sum).
        trust_model_file: Allow a ``.jpt`` file (TorchScript runs code from the file).

    Raises:
        ConfigurationError: An unknown name or missing file, an unknown ``periodic_coulomb``, or a
            ``.jpt`` file without ``trust_model_file=True``.
        MissingDependencyError: aimnet is not installed.
        ModelNotAvailableError: A named model that is not here (and download=False) or whose
            download failed; the message says which file to place where.
    """

    cuda_graphs: ClassVar[bool] = False
    #: aimnet's calculators (built by ``_build``): for molecules and for periodic systems.
    _molecules: Any
    _cells: Any
    species_hint: ClassVar[str] = "AIMNet2 models cover organic elements; see the model's implemented_species"

    def __init__(self, model: str | os.PathLike[str] = "aimnet2", *, download: bool = False,
                 periodic_coulomb: str = "dsf", trust_model_file: bool = False) -> None:
        super().__init__()
        _calculators()
        from aimnet.models.base import load_model

        if periodic_coulomb not in PERIODIC_COULOMB:
            raise ConfigurationError(
                f"model:aimnet2: periodic_coulomb must be one of {PERIODIC_COULOMB}, got {periodic_coulomb!r}")
        path, family = model_file(model, download)
        if path.lower().endswith(".jpt") and not trust_model_file:
            raise ConfigurationError(
                f"model:aimnet2: {path} is TorchScript, which runs code from the file; pass trust_model_file=True "
                "for a file you trust (aimnet's .pt files load as data)"
            )
        try:
            network, metadata = load_model(path, device="cpu")
        except (ValueError, KeyError, RuntimeError) as exc:
            raise ConfigurationError(f"model:aimnet2: {path} is not an aimnet model file ({exc})") from None
        if family is not None and metadata.get("family") is None:
            metadata["family"] = family  # the registry's family policy (e.g. rxn's D3), as aimnet applies it
        self.network = network
        self.path, self.periodic_coulomb = path, periodic_coulomb
        self._device: torch.device | None = None
        self._build(torch.device("cpu"))
        meta = self._molecules.metadata or {}
        species = meta.get("implemented_species") or None
        self.card = ModelCard(name="aimnet2", cutoff=None, periodic=True, stress=True,
                              species=tuple(int(z) for z in species) if species else None,
                              needs_charge=True, needs_spin=bool(self._molecules.is_nse))
        self.charged = meta.get("supports_charged_systems") is not False

    def _build(self, device: torch.device) -> None:
        """aimnet's calculators on ``device``, sharing the network: one for molecules, one for
        periodic systems (``periodic_coulomb``)."""
        from aimnet.calculators import AIMNet2Calculator

        self._molecules = AIMNet2Calculator(self.network, device=str(device))
        self._cells = AIMNet2Calculator(self.network, device=str(device))
        if self._cells.external_coulomb is not None:
            self._cells.set_lrcoulomb_method(self.periodic_coulomb)
        self._device = device

    def check_batch(self, batch: Batch) -> None:
        super().check_batch(batch)
        if not self.charged and bool((batch.charge != 0).any()):
            raise InvalidDataError(
                f"model 'aimnet2': {self.path} is trained on neutral systems only (its family does not support "
                "net charges); give charge 0 or use a model for ions (e.g. 'aimnet2')"
            )

    def check_stress(self, batch: Batch) -> None:
        """Stress only of periodic systems: aimnet strains a cell (see :meth:`BaseModel.check_stress`).

        Raises:
            InvalidDataError: Systems without a cell or with no periodic direction.
        """
        super().check_stress(batch)
        open_ = torch.nonzero(~_periodic(batch)).view(-1).cpu()
        if len(open_):
            raise InvalidDataError(
                f"model 'aimnet2': stress was asked of systems {open_[:10].tolist()} that are not periodic "
                "(aimnet takes stress only over a periodic cell); ask for energy and forces only"
            )

    def forward(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        """Energies ``[B, 1]``, forces ``[V, 3]``, partial ``charges`` ``[V]`` (e) and, when
        asked, stress ``[B, 3, 3]``, in the positions' dtype."""
        positions = batch.positions
        if self._device != positions.device or next(self.network.parameters()).device != positions.device:
            self._build(positions.device)  # the calculators keep their device; the network moves with them
        n, dtype = batch.num_graphs, positions.dtype
        which = _periodic(batch).cpu()  # the calculator reads back anyway; this picks its Coulomb
        out = {"energy": positions.new_zeros(n, 1), "forces": torch.zeros_like(positions),
               "charges": positions.new_zeros(batch.num_nodes)}
        if compute_stress:
            out["stress"] = positions.new_zeros(n, 3, 3)
        with torch.enable_grad():
            for cells, calc in ((False, self._molecules), (True, self._cells)):
                chosen = which if cells else ~which
                if not bool(chosen.any()):
                    continue
                systems = torch.nonzero(chosen).view(-1).to(positions.device)
                part = self._evaluate(calc, batch, systems, chosen.all().item(), cells, compute_stress and cells)
                atoms = part.pop("atoms")
                out["energy"][systems] = part["energy"].reshape(-1, 1).to(dtype)
                out["forces"][atoms] = part["forces"].to(dtype)
                out["charges"][atoms] = part["charges"].reshape(-1).to(dtype)
                if "stress" in part:
                    out["stress"][systems] = part["stress"].reshape(-1, 3, 3).to(dtype)
        return out

    def _evaluate(self, calc: Any, batch: Batch, systems: torch.Tensor, whole: bool, cells: bool,
                  stress: bool) -> dict[str, torch.Tensor]:
        """``calc.eval`` of ``systems`` of the batch as one flat set of atoms; ``"atoms"``: their rows."""
        device = batch.positions.device
        if whole:
            atoms = torch.arange(batch.num_nodes, device=device)
            mol_idx = batch.batch_idx
        else:
            chosen = torch.zeros(batch.num_graphs, dtype=torch.bool, device=device).index_fill_(0, systems, True)
            atoms = torch.nonzero(chosen[batch.batch_idx]).view(-1)
            rank = torch.cumsum(chosen.long(), 0) - 1  # each chosen system's place among them
            mol_idx = rank[batch.batch_idx[atoms]]
        data: dict[str, torch.Tensor] = {
            "coord": batch.positions.detach()[atoms].float(),
            "numbers": batch.atomic_numbers[atoms],
            "charge": batch.charge[systems].float(),
            "mol_idx": mol_idx,
        }
        if self.card.needs_spin:
            data["mult"] = batch.spin[systems].float()
        if cells:
            data["cell"] = batch.cell.detach().reshape(-1, 3, 3)[systems].float()
            data["pbc"] = batch.pbc.reshape(-1, 3)[systems]
        result = calc.eval(data, forces=True, stress=stress, validate_species=False)  # species: check_batch
        part = {k: v.detach() for k, v in result.items() if isinstance(v, torch.Tensor)}
        part["atoms"] = atoms
        return part

    def extra_repr(self) -> str:
        return f"{self.path!r}, periodic_coulomb={self.periodic_coulomb!r}"
