"""``MaceModel`` (``model:mace``): a MACE network evaluated on whole batches.

The network (a ``mace-torch`` module: MACE, ScaleShiftMACE, foundation models such as MACE-MP-0)
reads alchemi's COO edges (:class:`~alchemi_potentials.neighbors.EdgeList`) and Cartesian shifts
that carry the strain, so forces and stress come from one backward pass
(:class:`~alchemi_potentials.edge_model.EdgeModel`). Padding edges are ``1.5 r_max`` long, beyond
MACE's ``r < r_max`` mask. The step reads nothing back, so it can replay as a CUDA graph. A
``.model`` file is a pickle: ``model_path=`` needs ``trust_model_file=True``.

Example:
    >>> from alchemi_mace import MaceModel
    >>> net = small_mace()                       # any mace-torch module
    >>> model = MaceModel(net, dtype="float64")
    >>> model.card.cutoff
    6.0
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from alchemi_core.errors import ConfigurationError
from alchemi_mace.imports import import_mace
from alchemi_potentials.cueq import KernelChoice, missing_cueq, runs_on_cueq
from alchemi_potentials.edge_model import EdgeModel

if TYPE_CHECKING:
    from alchemi_core.models import KnownModel
    from alchemi_potentials.edge_model import Systems
    from alchemi_potentials.neighbors.edges import Edges

#: Padding edges' length as a multiple of r_max (beyond it: MACE masks r >= r_max).
PADDING_FACTOR = 1.5

_DTYPES = {"float32": torch.float32, "float64": torch.float64, torch.float32: torch.float32,
           torch.float64: torch.float64}


def resolve_dtype(dtype: Any, module: torch.nn.Module, who: str) -> torch.dtype:
    """``dtype`` as a torch dtype (None: the dtype of ``module``'s parameters).

    Raises:
        ConfigurationError: Anything but float32 / float64 (as strings or torch dtypes).
    """
    if dtype is None:
        p = next(module.parameters(), None)
        return p.dtype if p is not None and p.dtype in (torch.float32, torch.float64) else torch.float64
    if dtype not in _DTYPES:
        raise ConfigurationError(f"{who}: dtype must be 'float32' or 'float64', got {dtype!r}")
    return _DTYPES[dtype]


def load_model_file(path: str | os.PathLike[str], trust_model_file: bool, who: str) -> Any:
    """Unpickle a model file, only when the caller said it is trusted.

    Raises:
        ConfigurationError: ``trust_model_file`` is not True, or the file does not exist.
    """
    if trust_model_file is not True:
        raise ConfigurationError(
            f"{who}: {os.fspath(path)!r} is a pickle, and loading it runs code from the file; pass "
            "trust_model_file=True if you trust where it came from (or pass the loaded module as model=)"
        )
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigurationError(f"{who}: no model file at {os.fspath(p)!r}")
    return torch.load(p, map_location="cpu", weights_only=False)


def to_cueq(network: torch.nn.Module, device: torch.device, *, required: bool) -> torch.nn.Module:
    """``network`` converted to cuEquivariance kernels with mace-torch's converter (same weights);
    one the converter rejects stays as it is, with a warning, unless ``required``.

    Raises:
        MissingDependencyError: ``required`` and cuequivariance-torch is not installed.
        ConfigurationError: ``required`` and the converter rejects the network.
    """
    missing = missing_cueq("model:mace")
    if missing is not None:
        if required:
            raise missing
        return network
    from mace.cli.convert_e3nn_cueq import run as convert

    previous = torch.get_default_dtype()
    try:
        with warnings.catch_warnings():
            # On a CPU cuequivariance-torch says, once per module, that it runs plain torch code.
            warnings.filterwarnings("ignore", message="cuequivariance_ops_torch is not available")
            converted = convert(network, device=device.type)
    except Exception as exc:  # noqa: BLE001 - third-party converter: unasked, any failure keeps e3nn
        if required:
            raise ConfigurationError(f"model:mace: this network cannot run on cuEquivariance's kernels: {exc}") from exc
        warnings.warn(f"model:mace: staying on e3nn's kernels, cuEquivariance conversion failed: {exc}",
                      stacklevel=3)
        return network
    finally:
        torch.set_default_dtype(previous)
    converted = converted.to(device).eval()
    for p in converted.parameters():
        p.requires_grad_(False)
    return converted


class MaceModel(EdgeModel):
    """A MACE network as an alchemi model (see the module docstring).

    Args:
        model: A mace-torch module (give this or ``model_path``).
        model_path: A ``.model`` file saved with ``torch.save`` (needs ``trust_model_file``), or
            the name of a published foundation model (``"mace-mp-0-small"``, ...:
            :data:`alchemi_mace.names.FOUNDATION_NAMES`), found in ``$ALCHEMI_MODEL_DIR`` or
            mace-torch's download cache.
        download: Let mace-torch download a named MACE-MP-family file that is not on this machine.
        trust_model_file: Confirms that ``model_path`` may be unpickled.
        dtype: ``"float32"`` or ``"float64"`` (None: the network's own).
        head: Head of a multi-head model (None: its only head, or the one named "default").
        enable_cueq: Run the network on cuEquivariance's kernels (converted at its first call).
            None: on a GPU where they are installed; True: always; False: never.
        skin: Verlet skin (Å) of the neighbour list under the edges.
        max_edges: Fixed edge capacity (None: sized from the structures).
        chunk_atoms: Evaluate batches of more atoms in chunks of whole systems of at most this
            many atoms, one chunk's activations held at a time (None: whole batches).

    Raises:
        ConfigurationError: Neither or both of model and model_path, an untrusted or missing
            file, something that is not a MACE network, a bad dtype or an unknown head.
        MissingDependencyError: mace-torch is not installed.
        ModelNotAvailableError: A named model whose file is not here (and download=False) or
            whose download failed; the message says which file to place where.
    """

    #: Per-atom device bytes of a step in float32 (the MACE-MP-0-small shape's peak on W7, + 25 %).
    BYTES_PER_ATOM: ClassVar[float] = 3.4e6

    @staticmethod
    def known_models() -> list[KnownModel]:
        """The foundation models by name, and which are on this machine (``list-components --models``)."""
        import_mace()
        from alchemi_mace.names import known_models

        return known_models()
    #: The same on cuEquivariance's kernels.
    BYTES_PER_ATOM_CUEQ: ClassVar[float] = 1.2e6
    _kernels: KernelChoice

    def __init__(self, model: torch.nn.Module | None = None, *, model_path: str | os.PathLike[str] | None = None,
                 trust_model_file: bool = False, dtype: Any = None, head: str | None = None,
                 enable_cueq: bool | None = None, skin: float = 0.5, max_edges: int | None = None,
                 chunk_atoms: int | None = None, download: bool = False) -> None:
        import_mace()
        if (model is None) == (model_path is None):
            raise ConfigurationError(
                "model:mace: give exactly one of model= (a MACE module) or model_path= (a .model file)"
            )
        if model_path is not None:
            from alchemi_mace.names import model_file

            model = load_model_file(model_file(model_path, download), trust_model_file, "model:mace")
        shaped = hasattr(model, "r_max") and hasattr(model, "atomic_numbers")
        if not isinstance(model, torch.nn.Module) or not shaped:
            raise ConfigurationError(
                f"model:mace: expected a mace-torch network (a torch module with r_max and atomic_numbers), "
                f"got {type(model).__name__}"
            )
        dt = resolve_dtype(dtype, model, "model:mace")
        r_max = float(model.r_max)
        species = tuple(int(z) for z in model.atomic_numbers)
        super().__init__(cutoff=r_max, name="mace", species=species, dtype=dt, skin=skin, max_edges=max_edges,
                         padding_length=PADDING_FACTOR * r_max, chunk_atoms=chunk_atoms)
        self.heads = list(getattr(model, "heads", None) or ["Default"])
        self.head = self._pick_head(head)
        self.network = model.to(dt).eval()
        for p in self.network.parameters():
            p.requires_grad_(False)
        self.enable_cueq = enable_cueq
        self._kernels = KernelChoice(enable_cueq)
        n = len(species)
        lut = torch.full((119,), n, dtype=torch.int64)
        lut[torch.tensor(species)] = torch.arange(n)
        self.register_buffer("element_index", lut, persistent=False)
        self.register_buffer("one_hot", torch.eye(n + 1, n, dtype=dt), persistent=False)  # row n: unknown (zeros)
        self._heads_for: dict[tuple[int, torch.device], torch.Tensor] = {}

    def _pick_head(self, head: str | None) -> int:
        if head is not None:
            if head not in self.heads:
                raise ConfigurationError(f"model:mace: no head {head!r}; the model has {self.heads}")
            return self.heads.index(head)
        if len(self.heads) == 1:
            return 0
        named = [i for i, h in enumerate(self.heads) if h.lower() == "default"]
        if not named:
            raise ConfigurationError(f"model:mace: this model has heads {self.heads}; choose one with head=")
        return named[0]

    def _prepare(self, device: torch.device) -> None:
        """Move to ``device``; at the first call, convert to cuEquivariance (see ``enable_cueq``)."""
        if self.element_index.device != device:
            self.to(device)
        if self._kernels.settle(device):
            self.network = to_cueq(self.network, device, required=self.enable_cueq is True)
            self._kernels.converted = runs_on_cueq(self.network)

    def energies(self, batch: Systems, positions: torch.Tensor, cell: torch.Tensor, edges: Edges) -> torch.Tensor:
        self._prepare(positions.device)
        n = batch.num_graphs
        key = (n, positions.device)
        heads = self._heads_for.get(key)
        if heads is None:
            heads = self._heads_for[key] = torch.full((n,), self.head, dtype=torch.int64, device=positions.device)
        data = {
            "positions": positions,
            "node_attrs": self.one_hot[self.element_index[batch.atomic_numbers]],
            "edge_index": edges.index,
            "shifts": edges.cartesian_shifts(cell),
            "unit_shifts": edges.unit_shifts,
            "cell": cell.reshape(-1, 3),
            "batch": batch.batch_idx,
            "ptr": batch.batch_ptr,
            "head": heads,
        }
        out = self.network(data, training=False, compute_force=False, compute_virials=False, compute_stress=False)
        return out["energy"]

    def extra_repr(self) -> str:
        kernels = ", cuequivariance" if self.uses_cueq else ""
        return f"r_max={self.card.cutoff}, dtype={self.dtype}, head={self.heads[self.head]!r}{kernels}, {self.edge_list!r}"
