"""Nudged elastic bands (``integrator:neb``): minimum energy paths of many bands in one batch.

A band of N images is N systems of the batch with the same ``neb_band`` (an integer, distinct per
band) and ``neb_image`` 0..N-1 along the path (:func:`alchemi_integrators.neb_bands.band_data`
builds them); all images of a band have the same atoms in the same order. Images 0 and N-1 are the
end points: they stay where they are, or relax with the band (``relax_endpoints``). After each
forward pass, the force on every other image is replaced by the NEB force
(:mod:`~alchemi_integrators.neb_kernels`, as ASE's
``NEB(method="improvedtangent")``): the true force perpendicular to the improved tangent of
Henkelman and Jónsson plus the spring force ``k (|x_next - x| - |x - x_prev|)`` along it, and with
``climb`` the highest image feels the true force with its component along the tangent inverted
(Henkelman, Uberuaga and Jónsson 2000), from the start or once the band's largest force is below
``climb_fmax``. Neighbour differences take the minimum image on periodic axes. FIRE
(:class:`~alchemi_integrators.fire.FIRE`, each image its own state) then steps the images on
those forces.

A band converges when its largest NEB force on an atom (``neb_fmax``, every image of the band
carries the band's value, ASE's criterion) is at most ``fmax``: all its images leave together, and
under a :class:`~alchemi_integrators.neb_bands.BandSampler` a whole new band takes their slots.
Everything is computed on the device, with no host synchronisation in a step. :func:`neb` relaxes
a list of bands (one batch, or inflight with ``max_images``) and gives each band's images,
energies and barrier.

Example:
    >>> from ase.build import bulk
    >>> from alchemi_integrators.neb import neb
    >>> from alchemi_integrators.neb_paths import interpolate
    >>> from alchemi_potentials import LennardJones
    >>> initial = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(2)
    >>> vacancy = initial.positions[0].copy()
    >>> del initial[0]
    >>> final = initial.copy()
    >>> final.positions[0] = vacancy
    >>> band = interpolate(initial, final, 5, method="idpp")
    >>> model = LennardJones(0.0104, 3.405, 8.0, shift_energy=True)
    >>> [result] = neb([band], model, climb=True, fmax=0.01, dt=10.0, dt_max=100.0)
    >>> result.converged, round(result.barrier, 3)
    (True, 0.068)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.data import Batch
from alchemi_core.dynamics.convergence import ConvergenceHook
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_integrators.cell_filter import reading_fmax_from
from alchemi_integrators.fire import FIRE
from alchemi_integrators.neb_bands import (
    NEB_BAND,
    NEB_FMAX,
    NEB_IMAGE,
    BandResult,
    BandSampler,
    band_data,
    band_results,
)
from alchemi_integrators.neb_kernels import neb_forces
from alchemi_integrators.parameters import ParameterValue

if TYPE_CHECKING:
    import ase

#: Images per band at most (the sort key of a band's images is ``band * MAX_IMAGES + image``).
MAX_IMAGES = 1 << 20


class NEB(FIRE):
    """Nudged elastic bands relaxed by FIRE (see the module docstring).

    Args:
        model: Returns ``energy`` ``[B, 1]`` and ``forces`` ``[V, 3]``.
        k: Spring constant in eV/Å² (ASE's default 0.1): a number, ``[B]`` tensor or field name.
        climb: The highest image of each band climbs (a bool, or per system as a ``[B]`` tensor or
            field name of 0/1).
        climb_fmax: With ``climb``, a band's highest image climbs only once the band's largest NEB
            force is below this (eV/Å); 0 (the default) climbs from the start, as ASE does.
        relax_endpoints: The end points feel their true forces and relax with the band (FIRE, as a
            relaxation of each alone); their forces count in the band's ``fmax``. False: they stay.
        fmax: A band converges when its largest NEB force is at most this (eV/Å); ignored when
            ``convergence_hook`` is given (whose ``fmax`` criteria then read ``neb_fmax``).
        n_steps: Most steps of each band.
        dt: FIRE's initial time step in fs (masses count: see :class:`~alchemi_integrators.fire.FIRE`).
        **kwargs: FIRE's (``dt_max``, ``maxstep``, ...) and ``BaseDynamics``'s arguments
            (``sampler``, ``sinks``, ...).

    Raises:
        ConfigurationError: ``k`` negative, ``fmax`` not a finite non-negative number, or a cell filter
            (variable-cell NEB is not implemented); at a run's start, no band fields.
        InvalidDataError: At a run's start, a band that is not whole (:func:`check_bands`).
    """

    def __init__(
        self,
        model: Any,
        k: ParameterValue = 0.1,
        climb: bool | ParameterValue = False,
        fmax: float = 0.05,
        climb_fmax: ParameterValue = 0.0,
        relax_endpoints: bool | ParameterValue = False,
        n_steps: int = 1000,
        dt: ParameterValue = 1.0,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("cell_filter") is not None:
            raise ConfigurationError(
                "NEB: a cell filter is not supported (variable-cell NEB is not implemented); "
                "drop cell_filter and keep each band's cell fixed"
            )
        hook = kwargs.pop("convergence_hook", None)
        if hook is None:
            hook = ConvergenceHook(criteria=[{"key": NEB_FMAX, "threshold": fmax, "reduce_op": "max"}])
        else:
            hook = reading_fmax_from(hook, NEB_FMAX)
        super().__init__(model, n_steps, dt, convergence_hook=hook, **kwargs)
        self.declare("k", k, unit="eV/Å²", low=0.0)
        self.declare("climb", float(climb) if isinstance(climb, bool) else climb, low=0.0, high=1.0)
        self.declare("climb_fmax", climb_fmax, unit="eV/Å", low=0.0)
        relax = float(relax_endpoints) if isinstance(relax_endpoints, bool) else relax_endpoints
        self.declare("relax_endpoints", relax, low=0.0, high=1.0)

    def make_sampler(self, dataset: Any, device: Any = None, **kwargs: Any) -> Any:
        """The sampler a workflow gives this stage when it comes first: whole bands of ``dataset``'s
        images (:meth:`~alchemi_integrators.neb_bands.BandSampler.from_images`; ``kwargs``:
        ``max_atoms``, ``max_batch_size``, ``bin_width``)."""
        if kwargs.pop("workers", 0):
            raise ConfigurationError("NEB: a band sampler builds no structures in worker processes; drop workers")
        return BandSampler.from_images(dataset, device, **kwargs)

    @property
    def fmax_field(self) -> str | None:  # type: ignore[override]
        """The band's largest NEB force, which convergence and logs read."""
        return NEB_FMAX

    # ------------------------------------------------------------------ state
    def create_state(self, batch: Batch) -> None:
        missing = [name for name in (NEB_BAND, NEB_IMAGE) if name not in batch]
        if missing:
            raise ConfigurationError(
                f"NEB: the batch has no {' or '.join(missing)} field; build the bands' images with "
                "alchemi_integrators.neb_bands.band_data (or give each system its band and image index)"
            )
        check_bands(batch)
        super().create_state(batch)
        self.ensure_field(batch, NEB_FMAX, (), batch.positions.dtype, "system")

    def init_state(self, batch: Batch, entering: torch.Tensor) -> None:
        super().init_state(batch, entering)
        getattr(batch, NEB_FMAX).masked_fill_(entering, float("inf"))

    # ------------------------------------------------------------------ the step
    def pre_update(self, batch: Batch) -> None:
        # The forces of the current positions are the model's: FIRE steps on their NEB forces.
        neb_forces(self, batch, batch.forces)
        super().pre_update(batch)

    def post_update(self, batch: Batch) -> None:
        # The new positions' NEB forces, for the convergence check (batch.forces keeps the model's).
        dtype, dev = batch.positions.dtype, batch.device
        out = self.work.get("neb_post_forces", batch.num_nodes, batch.node_capacity, (3,), dtype, dev)
        neb_forces(self, batch, out, getattr(batch, NEB_FMAX))

    # ------------------------------------------------------------------ what the kernels read
    def band_fmax(self, batch: Batch) -> torch.Tensor:
        """``[B]``: each band's largest NEB force of the last step (infinite for entering bands)."""
        return getattr(batch, NEB_FMAX)

    def neighbours(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B]`` int64 each: the system before and after each image in its band (-1: none)."""

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            band = getattr(batch, NEB_BAND).view(-1).to(torch.int64)
            order = torch.argsort(band * MAX_IMAGES + getattr(batch, NEB_IMAGE).view(-1), stable=True)
            same = band[order[1:]] == band[order[:-1]]
            none = torch.full_like(order[1:], -1)
            prev = torch.full_like(band, -1)
            nxt = torch.full_like(band, -1)
            prev[order[1:]] = torch.where(same, order[:-1], none)
            nxt[order[:-1]] = torch.where(same, order[1:], none)
            return prev, nxt

        return self.cached("neb_neighbours", batch, build, reads_fields=False, masks=False)

    def cells(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each system's cell ``[B, 3, 3]``, its inverse and ``[B, 3]`` 1.0 on periodic axes (for
        the minimum image of the differences between images; a zero row is taken as a unit row)."""

        def build() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            dtype, nb = batch.positions.dtype, batch.num_graphs
            eye = torch.eye(3, dtype=dtype, device=batch.device).expand(nb, 3, 3)
            if "cell" not in batch:
                return eye.contiguous(), eye.contiguous(), torch.zeros(nb, 3, dtype=dtype, device=batch.device)
            cell = batch.cell.to(dtype).reshape(nb, 3, 3)
            empty = (cell.abs().sum(-1, keepdim=True) == 0)
            cell = torch.where(empty, eye, cell).contiguous()
            pbc = batch.pbc.reshape(nb, 3) if "pbc" in batch else torch.zeros(nb, 3, dtype=torch.bool)
            wrap = (pbc.to(batch.device) & ~empty.squeeze(-1)).to(dtype).contiguous()
            return cell, torch.linalg.inv(cell).contiguous(), wrap

        return self.cached("neb_cells", batch, build, reads_fields=False, masks=False)


def check_bands(batch: Batch) -> None:
    """Refuse bands the kernels cannot step (once per run, on the host): fewer than 3 images,
    image indices other than 0..N-1, or images with other atoms than the band's first.

    Raises:
        InvalidDataError: Names the band and what is wrong with it.
    """
    band = getattr(batch, NEB_BAND).view(-1).cpu().tolist()
    image = getattr(batch, NEB_IMAGE).view(-1).cpu().tolist()
    counts = batch.num_nodes_per_system
    numbers = batch.atomic_numbers.cpu()
    ptr = batch.batch_ptr.cpu().tolist()
    rows: dict[int, list[int]] = {}
    for row, b in enumerate(band):
        rows.setdefault(int(b), []).append(row)
    for b, members in rows.items():
        members.sort(key=lambda r: image[r])
        if len(members) < 3 or [image[r] for r in members] != list(range(len(members))):
            raise InvalidDataError(
                f"NEB: band {b} has images {sorted(image[r] for r in members)}; a band needs images 0..N-1, "
                "each once, N >= 3 (alchemi_integrators.neb_bands.band_data numbers them)"
            )
        first = numbers[ptr[members[0]]:ptr[members[0] + 1]]
        for r in members[1:]:
            if counts[r] != counts[members[0]] or not bool((numbers[ptr[r]:ptr[r + 1]] == first).all()):
                raise InvalidDataError(
                    f"NEB: image {image[r]} of band {b} has other atoms than its image 0; every image of a "
                    "band must have the same atoms in the same order"
                )


def neb(bands: Sequence[Sequence[ase.Atoms]], model: Any, *, k: float = 0.1, climb: bool = False,
        fmax: float = 0.05, n_steps: int = 1000, max_images: int | None = None, max_atoms: int | None = None,
        dtype: torch.dtype = torch.float64, device: torch.device | str | None = None,
        **fire: Any) -> list[BandResult]:
    """Relax nudged elastic bands (:class:`~alchemi_integrators.neb.NEB`) and return one
    :class:`BandResult` per band, in the order given.

    Args:
        bands: Each a list of ``ase.Atoms`` images, end points first and last (e.g. from
            :func:`~alchemi_integrators.neb_paths.interpolate`).
        model: An alchemi model.
        k: Spring constant (eV/Å²).
        climb: Climbing image.
        fmax: Convergence of a band: its largest NEB force (eV/Å).
        n_steps: Most steps of each band.
        max_images: Images in the batch at once (None: every band at once); fewer than all bands'
            runs inflight: converged bands leave, the next take their slots.
        max_atoms: Atoms in the batch at once (inflight; None: ``max_images`` of the largest image).
        dtype: Precision of positions.
        device: Where to run (None: the CPU).
        **fire: FIRE's arguments (``dt``, ``dt_max``, ``maxstep``, ...).
    """
    data, first = [], 0
    for b, images in enumerate(bands):
        data.append(band_data(images, b, first, dtype))
        first += len(images)
    stage_kwargs: dict[str, Any] = {"k": k, "climb": climb, "fmax": fmax, "n_steps": n_steps, **fire}
    if max_images is None:
        batch = Batch.from_data_list([d for band in data for d in band], device=device)
        NEB(model, **stage_kwargs).run(batch)
    else:
        largest = max(d.num_nodes for band in data for d in band)
        sampler = BandSampler(data, device, max_batch_size=max_images, max_atoms=max_atoms or max_images * largest)
        out = NEB(model, sampler=sampler, **stage_kwargs).run()
        assert out is not None
        batch = out
    return band_results(batch, len(bands), fmax)


__all__ = ["MAX_IMAGES", "NEB", "NEB_BAND", "NEB_FMAX", "NEB_IMAGE", "check_bands", "neb"]
