"""``D3Dispersion`` (``model:d3``): Grimme's DFT-D3 dispersion with Becke-Johnson damping.

torch-dftd's batched D3 (``torch_dftd.functions.dftd3.edisp``) on alchemi's edges: pairs closer
than ``cutoff`` (default 95 bohr, as SevenNet's D3) for the two-body energy, within ``cn_cutoff``
(40 bohr) for coordination numbers; no three-body terms. Padding edges go to an extra, discarded
system. torch-dftd reads back (``torch.nonzero``): ``cuda_graphs = False``. Install it with
``pip install --no-deps torch-dftd`` (its pymatgen dependency is not needed).

Example:
    >>> model = D3Dispersion(functional="pbe")
    >>> round(model.card.cutoff, 2)
    50.27
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch

from alchemi_core.errors import ConfigurationError, MissingDependencyError
from alchemi_potentials.edge_model import EdgeModel

if TYPE_CHECKING:
    from alchemi_potentials.edge_model import Systems
    from alchemi_potentials.neighbors.edges import Edges

#: Bohr radius in Å and Hartree in eV, the values of the D3 program (and torch-dftd).
BOHR = 0.52917726
HARTREE = 27.21138505
#: Dampings this model offers (torch-dftd names).
DAMPINGS = ("bj", "bjm")


def _dftd3() -> tuple[Any, Any]:
    try:
        from torch_dftd.dftd3_xc_params import get_dftd3_default_params
        from torch_dftd.functions.dftd3 import edisp
    except ImportError as exc:
        raise MissingDependencyError(
            f"model:d3 needs torch-dftd: pip install --no-deps torch-dftd ({exc})"
        ) from exc
    return get_dftd3_default_params, edisp


class D3Dispersion(EdgeModel):
    """DFT-D3(BJ) dispersion (see the module docstring).

    Args:
        functional: Exchange-correlation functional whose D3 parameters to use (``"pbe"``,
            ``"pbesol"``, ``"r2scan"``, ...; torch-dftd's names).
        damping: ``"bj"`` (Becke-Johnson) or ``"bjm"`` (modified BJ).
        cutoff: Two-body cutoff in Å (default 95 bohr).
        cn_cutoff: Coordination-number cutoff in Å (default 40 bohr).
        dtype: Precision (None: the positions').
        skin: Verlet skin (Å) of the neighbour list under the edges.
        max_edges: Fixed edge capacity (None: sized from the structures).
        chunk_atoms: Evaluate batches of more atoms in chunks of whole systems of at most this
            many atoms, one chunk's activations held at a time (None: whole batches).

    Raises:
        ConfigurationError: An unknown damping or functional, or cn_cutoff above cutoff.
        MissingDependencyError: torch-dftd is not installed.
    """

    cuda_graphs: ClassVar[bool] = False
    #: Per-atom device bytes of a step in float32 (about 45,000 edges per atom within 50 Å).
    BYTES_PER_ATOM: ClassVar[float] = 8e6

    def __init__(self, functional: str = "pbe", damping: str = "bj", *, cutoff: float = 95.0 * BOHR,
                 cn_cutoff: float = 40.0 * BOHR, dtype: torch.dtype | None = None, skin: float = 1.0,
                 max_edges: int | None = None, chunk_atoms: int | None = None) -> None:
        params_for, self._edisp = _dftd3()
        if damping not in DAMPINGS:
            raise ConfigurationError(f"model:d3: damping must be one of {DAMPINGS}, got {damping!r}")
        if not 0 < cn_cutoff <= cutoff:
            raise ConfigurationError(f"model:d3: need 0 < cn_cutoff <= cutoff, got {cn_cutoff} and {cutoff} Å")
        try:
            params = params_for(damping, functional.lower())
        except Exception as exc:  # noqa: BLE001 - torch-dftd raises plain errors for unknown names
            raise ConfigurationError(
                f"model:d3: no D3({damping}) parameters for functional {functional!r} ({exc})"
            ) from None
        super().__init__(cutoff=cutoff, name=f"d3-{damping}:{functional.lower()}", species=tuple(range(1, 95)),
                         dtype=dtype, skin=skin, max_edges=max_edges, padding_length=cutoff + 1.0,
                         chunk_atoms=chunk_atoms)
        self.functional, self.damping, self.cn_cutoff = functional.lower(), damping, float(cn_cutoff)
        self.cutoff = float(cutoff)
        self.params = dict(params)
        from pathlib import Path

        import numpy as np
        import torch_dftd

        table = np.load(Path(torch_dftd.__file__).parent / "nn" / "params" / "dftd3_params.npz")
        for name in ("c6ab", "r0ab", "rcov", "r2r4"):
            self.register_buffer(name, torch.as_tensor(table[name], dtype=torch.float64), persistent=False)
        self._graphs: dict[tuple[int, torch.device], torch.Tensor] = {}

    def energies(self, batch: Systems, positions: torch.Tensor, cell: torch.Tensor, edges: Edges) -> torch.Tensor:
        if self.c6ab.device != positions.device or self.c6ab.dtype != positions.dtype:
            self.to(device=positions.device, dtype=positions.dtype)
        n = batch.num_graphs
        key = (n, positions.device)
        graphs = self._graphs.get(key)
        if graphs is None:
            graphs = self._graphs[key] = torch.zeros(n + 1, device=positions.device)  # only its length is read
        live = torch.arange(edges.capacity, device=positions.device) < edges.count
        system = torch.where(live, edges.system, n)  # padding goes to a system that is dropped
        r = torch.linalg.vector_norm(edges.vectors(positions, cell), dim=1) / BOHR
        hartree = self._edisp(
            batch.atomic_numbers, r, edges.index, c6ab=self.c6ab, r0ab=self.r0ab, rcov=self.rcov, r2r4=self.r2r4,
            params=self.params, cutoff=self.cutoff / BOHR, cnthr=self.cn_cutoff / BOHR, batch=batch.batch_idx,
            batch_edge=system, cell=graphs, damping=self.damping, bidirectional=True,
        )
        return (hartree[:n] * HARTREE).to(positions.dtype)

    def extra_repr(self) -> str:
        return (f"{self.functional}, damping={self.damping}, cutoff={self.cutoff:.3f}, "
                f"cn_cutoff={self.cn_cutoff:.3f}")
