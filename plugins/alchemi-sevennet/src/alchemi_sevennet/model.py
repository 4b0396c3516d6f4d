"""``SevenNetModel`` (``model:sevennet``): a SevenNet network evaluated on whole batches.

alchemi computes edge vectors from its own COO edges (:class:`~alchemi_potentials.neighbors.EdgeList`)
with the strain applied, runs the network's layers up to the atomic energies, sums those itself and
takes forces and stress from one backward pass (:class:`~alchemi_potentials.edge_model.EdgeModel`).
SevenNet's cutoff functions have no ``r < cutoff`` mask: the edges hold exactly the pairs closer
than the cutoff, and padding edges are exactly ``cutoff`` long, where its cutoffs and their
derivatives vanish. SevenNet's own reduction, stress output and input preparation read back or copy
from the host every call; alchemi does them itself, so a step can replay as a CUDA graph. On a GPU
with cuEquivariance's kernels the network is rebuilt on them at its first call (``enable_cueq``).
SevenNet computes in float32 only.

Example:
    >>> from alchemi_sevennet import SevenNetModel
    >>> model = SevenNetModel("7net-0")
    >>> model.card.cutoff
    5.0
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from alchemi_core.errors import ConfigurationError, MissingDependencyError
from alchemi_core.models import KnownModel
from alchemi_potentials.cueq import KernelChoice, missing_cueq, runs_on_cueq
from alchemi_potentials.edge_model import EdgeModel
from alchemi_potentials.model_files import find_file, local_file

if TYPE_CHECKING:
    from alchemi_potentials.edge_model import Systems
    from alchemi_potentials.neighbors.edges import Edges

#: Layers alchemi does itself: the total-energy reduction and the force/stress output.
_REPLACED = ("reduce_total_enegy", "reduce_total_energy", "force_output")


def _sevenn() -> Any:
    try:
        import sevenn
        import sevenn.util
    except ImportError as exc:
        raise MissingDependencyError(f"model:sevennet needs SevenNet: pip install sevenn ({exc})") from exc
    return sevenn


def checkpoint_file(model: str | os.PathLike[str], download: bool = False) -> str:
    """The checkpoint that ``model`` names: a file, a name whose checkpoint ships with sevenn
    (``"7net-0"``), or one sevenn downloads (``"7net-omat"``). A downloaded name is looked for as
    ``$ALCHEMI_MODEL_DIR/<file>`` and where sevenn keeps it (its package, ``~/.cache/sevennet``);
    only with ``download=True`` does sevenn fetch a missing one
    (:func:`alchemi_potentials.model_files.local_file`).

    Raises:
        ModelNotAvailableError: The name's file is not here (which file to place where, or
            ``download=True``), or its download failed (no network).

    Example:
        >>> checkpoint_file("7net-0")   # ships with sevenn: its loader resolves the name
        '7net-0'
    """
    sevenn = _sevenn()
    name = os.fspath(model)
    place = None if os.path.isfile(name) else _download_place(name)
    if place is None:  # a file, a checkpoint that ships with sevenn, or not a name: sevenn's loader says which
        return name
    file, url, where = place
    return local_file("model:sevennet", name, file, url, where,
                      lambda: str(sevenn.util.pretrained_name_to_path(name)), download)


#: The checkpoints sevenn downloads rather than ships: folder under its ``pretrained_potentials``
#: and URL, by file. sevenn keeps this table only under a private name, so alchemi keeps its own
#: copy (a test compares the two, so a sevenn release that changes it is noticed).
DOWNLOADS: dict[str, tuple[str, str]] = {
    f"checkpoint_sevennet_{stem}.pth": (folder, f"https://github.com/MDIL-SNU/SevenNet/releases/download/{tag}/"
                                        f"checkpoint_sevennet_{stem}.pth")
    for stem, folder, tag in (
        ("mf_ompa", "SevenNet_MF_ompa", "v0.11.0.cp"),
        ("omat", "SevenNet_omat", "v0.11.0.cp"),
        ("omni", "SevenNet_omni", "v0.12.0.cp"),
        ("omni_i8", "SevenNet_omni_i8", "v0.12.1.cp"),
        ("omni_i12", "SevenNet_omni_i12", "v0.12.1.cp"),
    )
}


#: The names of the checkpoints that ship inside sevenn's wheel.
SHIPPED = ("7net-0", "7net-0_22may2024", "7net-l3i5", "7net-mf-0")


def known_models() -> list[KnownModel]:
    """Every checkpoint name sevenn knows, with its file and where it is on this machine (if it is)."""
    sevenn = _sevenn()
    known = []
    for name in SHIPPED:
        try:  # shipped: sevenn's loader finds it in its package (it has no URL to download from)
            path: str | None = str(sevenn.util.pretrained_name_to_path(name))
        except (FileNotFoundError, ValueError):
            path = None
        known.append(KnownModel(name, os.path.basename(path) if path else f"(inside sevenn's wheel: {name})", path))
    for file in DOWNLOADS:
        name = "7net-" + file[len("checkpoint_sevennet_"):-len(".pth")].replace("_", "-")
        place = _download_place(name)
        assert place is not None, name
        known.append(KnownModel(name, file, find_file(file, place[2])))
    return known


def _download_place(name: str) -> tuple[str, str, list[str]] | None:
    """``(file, url, paths)`` of a name sevenn downloads, ``paths`` where sevenn looks for it (its
    package, then its cache); None for any other name."""
    lower = name.lower()
    stem = next((lower[len(p):] for p in ("7net-", "sevennet-") if lower.startswith(p)), None)
    if stem is None:
        return None
    file = f"checkpoint_sevennet_{stem.replace('-', '_')}.pth"  # how sevenn names every download
    if file not in DOWNLOADS:
        return None
    folder, url = DOWNLOADS[file]
    package = os.path.join(os.path.dirname(_sevenn().__file__), "pretrained_potentials")
    cache = os.path.expanduser("~/.cache/sevennet")
    return file, url, [os.path.join(root, folder, file) for root in (package, cache)]


class SevenNetModel(EdgeModel):
    """A SevenNet network as an alchemi model (see the module docstring).

    Args:
        model: A pretrained name (``"7net-0"`` ships with sevenn; others, such as
            ``"7net-omat"``, are files in ``$ALCHEMI_MODEL_DIR`` or where sevenn keeps its
            downloads: :func:`checkpoint_file`) or the path of a SevenNet checkpoint (``.pth``).
        download: Let sevenn download a named checkpoint that is not on this machine.
        modal: Fidelity of a multi-fidelity model (e.g. ``"mpa"`` for 7net-mf-ompa).
        dtype: Only ``"float32"`` (SevenNet's precision).
        enable_cueq: Run on cuEquivariance's kernels (sevenn's conversion). None: from the first
            call on a GPU where they are installed; True: always (needs CUDA); False: never.
        skin: Verlet skin (Å) of the neighbour list under the edges.
        max_edges: Fixed edge capacity (None: sized from the structures).
        chunk_atoms: Evaluate batches of more atoms in chunks of whole systems of at most this
            many atoms, one chunk's activations held at a time (None: whole batches).

    Raises:
        ConfigurationError: An unknown name or missing file, a modal the model lacks (or none
            for a multi-fidelity model), a dtype other than float32, or ``enable_cueq`` without
            CUDA.
        MissingDependencyError: sevenn is not installed, or cuequivariance-torch with enable_cueq.
        ModelNotAvailableError: A named checkpoint that is not here (and download=False) or whose
            download failed; the message says which file to place where.
    """

    #: Per-atom device bytes of a step in float32 (7net-0's peak on W7, + 25 %).
    BYTES_PER_ATOM: ClassVar[float] = 7.2e6
    #: The checkpoints by name, and which are on this machine (``list-components --models``).
    known_models = staticmethod(known_models)
    #: The same on cuEquivariance's kernels.
    BYTES_PER_ATOM_CUEQ: ClassVar[float] = 1.5e6
    _kernels: KernelChoice

    def __init__(self, model: str | os.PathLike[str] = "7net-0", *, modal: str | None = None, dtype: Any = "float32",
                 enable_cueq: bool | None = None, skin: float = 0.5, max_edges: int | None = None,
                 chunk_atoms: int | None = None, download: bool = False) -> None:
        if dtype not in ("float32", torch.float32, None):
            raise ConfigurationError(f"model:sevennet computes in float32 only, got dtype={dtype!r}")
        sevenn = _sevenn()
        import sevenn._keys as KEY

        path = checkpoint_file(model, download)
        try:
            checkpoint = sevenn.util.load_checkpoint(path)
        except (ValueError, FileNotFoundError) as exc:
            raise ConfigurationError(
                f"model:sevennet: {model!r} is neither a pretrained name nor a checkpoint file ({exc})"
            ) from None
        missing = missing_cueq("model:sevennet") if enable_cueq else None
        if missing is not None:
            raise missing  # sevenn itself would warn and quietly stay on e3nn
        config = checkpoint.config
        cutoff = float(config[KEY.CUTOFF])
        type_map = dict(config[KEY.TYPE_MAP])
        super().__init__(cutoff=cutoff, name="sevennet", species=tuple(sorted(int(z) for z in type_map)),
                         dtype=torch.float32, skin=skin, max_edges=max_edges, padding_length=cutoff, chunk_atoms=chunk_atoms)
        self._checkpoint = checkpoint  # unasked, the network is rebuilt on cuEquivariance at a first GPU call
        self.enable_cueq = enable_cueq
        self._kernels = KernelChoice(enable_cueq)
        network = checkpoint.build_model(enable_cueq=bool(enable_cueq))
        if enable_cueq:  # sevenn converts as it builds, and only under CUDA: settled here
            self._kernels.settle(torch.device("cuda"))
            self._kernels.converted = runs_on_cueq(network)
            if not self._kernels.converted:
                raise ConfigurationError(
                    "model:sevennet: sevenn converts to cuEquivariance only where CUDA is available; "
                    "leave enable_cueq unset here"
                )
        self._adopt(network)
        modal_map = dict(getattr(self.network, "modal_map", None) or {})
        if modal_map:
            if modal is None or modal not in modal_map:
                raise ConfigurationError(
                    f"model:sevennet: {model!r} is a multi-fidelity model; choose modal= one of {sorted(modal_map)}"
                )
            self._modal: int | None = int(modal_map[modal])
        elif modal is not None:
            raise ConfigurationError(f"model:sevennet: {model!r} has one fidelity; leave modal unset")
        else:
            self._modal = None
        self.modal = modal
        self._keys = KEY
        self._modal_for: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._onehot_tables: dict[torch.device, torch.Tensor] = {}

    def _adopt(self, network: torch.nn.Module) -> None:
        """Run ``network``: alchemi sums the energies and takes the derivatives itself."""
        network.set_is_batch_data(True)
        network.eval_modal_map = False  # alchemi sets the modal index itself
        self.network = network.float().eval()
        for p in self.network.parameters():
            p.requires_grad_(False)
        self._layers = [m for name, m in self.network._modules.items() if name not in _REPLACED]
        reduce = self.network._modules.get("reduce_total_enegy") or self.network._modules.get("reduce_total_energy")
        self._energy_scale = float(getattr(reduce, "constant", 1.0))

    def _prepare(self, device: torch.device) -> None:
        """Move to ``device``; unasked, at a first GPU call, rebuild the network on cuEquivariance."""
        if self._kernels.settle(device):
            try:
                network = self._checkpoint.build_model(enable_cueq=True)
            except Exception as exc:  # noqa: BLE001 - third-party converter: unasked, any failure keeps e3nn
                warnings.warn(f"model:sevennet: staying on e3nn's kernels, cuEquivariance conversion failed: {exc}",
                              stacklevel=3)
            else:
                if runs_on_cueq(network):
                    self._adopt(network)
                    self._kernels.converted = True
        if next(self.network.parameters()).device != device:
            self.network.to(device)

    def energies(self, batch: Systems, positions: torch.Tensor, cell: torch.Tensor, edges: Edges) -> torch.Tensor:
        KEY = self._keys
        self._prepare(positions.device)
        data: dict[str, torch.Tensor] = {
            KEY.ATOMIC_NUMBERS: batch.atomic_numbers,
            KEY.POS: positions,
            KEY.EDGE_IDX: edges.index,
            KEY.EDGE_VEC: edges.vectors(positions, cell),
            KEY.BATCH: batch.batch_idx,
        }
        if self._modal is not None:
            key = (batch.num_graphs, positions.device)
            modal = self._modal_for.get(key)
            if modal is None:
                modal = self._modal_for[key] = torch.full((batch.num_graphs,), self._modal, dtype=torch.int64,
                                                          device=positions.device)
            data[KEY.MODAL_TYPE] = modal
        net = self.network
        if net.eval_type_map:  # SevenNet's own _preprocess copies its CPU table to the device every call
            data[net.key_node_feature] = self._onehot_table(positions.device).index_select(0, batch.atomic_numbers)
        for layer in self._layers:
            data = layer(data)
        atomic = data[KEY.ATOMIC_ENERGY].reshape(-1)
        total = torch.zeros(batch.num_graphs, dtype=atomic.dtype, device=atomic.device)
        return total.index_add(0, batch.batch_idx, atomic) * self._energy_scale

    def _onehot_table(self, device: torch.device) -> torch.Tensor:
        """SevenNet's atomic-number-to-type table, on ``device`` (copied once)."""
        table = self._onehot_tables.get(device)
        if table is None:
            table = self._onehot_tables[device] = self.network.z_to_onehot_tensor.to(device)
        return table

    def extra_repr(self) -> str:
        kernels = ", cuequivariance" if self.uses_cueq else ""
        return f"cutoff={self.card.cutoff}, modal={self.modal!r}{kernels}, {self.edge_list!r}"
