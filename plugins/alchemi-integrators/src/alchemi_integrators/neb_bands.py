"""Bands as data: :func:`band_data` turns a band's images into systems that
:class:`~alchemi_integrators.neb.NEB` steps (each with its ``neb_band`` and ``neb_image``);
:class:`BandSampler` hands out whole bands for inflight batching (a band that converges leaves the
batch with all its images and the next band that fits takes their slots); :func:`band_results`
reads each band's images, energies and barrier from a finished batch.

Example:
    >>> from ase.build import bulk
    >>> from alchemi_integrators.neb_bands import band_data
    >>> cell = bulk("Ar", "fcc", a=5.26, cubic=True)
    >>> [int(d.neb_image) for d in band_data([cell, cell, cell], band=0)]
    [0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

from alchemi_core.data import AtomicData, Batch, register_field
from alchemi_core.data.datapipes import as_atomic_data
from alchemi_core.dynamics import SizeAwareSampler
from alchemi_core.errors import ConfigurationError, InvalidDataError

if TYPE_CHECKING:
    import ase


#: ``[B]`` int64: the band a system (image) belongs to; distinct per band.
NEB_BAND = "neb_band"
#: ``[B]`` int64: the image's place along its band, 0 (initial end point) to N-1 (final).
NEB_IMAGE = "neb_image"
#: ``[B]`` float state: the largest NEB force on an atom of the system's band (eV/Å).
NEB_FMAX = "neb_fmax"

register_field(NEB_BAND, "system")
register_field(NEB_IMAGE, "system")


def band_data(images: Sequence[ase.Atoms | AtomicData], band: int, first_system_id: int | None = 0,
              dtype: torch.dtype = torch.float64) -> list[AtomicData]:
    """The images of one band as systems: ``neb_band = band``, ``neb_image`` 0..N-1 and
    ``system_id`` ``first_system_id`` + 0..N-1 (None: the images keep theirs).

    Raises:
        InvalidDataError: Fewer than 3 images, or images with other atoms than the first.
    """
    if len(images) < 3:
        raise InvalidDataError(f"band {band}: a band needs at least 3 images (2 end points), got {len(images)}")
    out = []
    for i, image in enumerate(images):
        data = image if isinstance(image, AtomicData) else AtomicData.from_atoms(image, dtype=dtype)
        data = data.to() if first_system_id is None else data.with_system_id(first_system_id + i)
        data.neb_band = torch.tensor([int(band)], dtype=torch.long)
        data.neb_image = torch.tensor([i], dtype=torch.long)
        out.append(data)
    first = out[0].atomic_numbers
    for i, data in enumerate(out[1:], 1):
        if data.atomic_numbers.shape != first.shape or bool((data.atomic_numbers != first).any()):
            raise InvalidDataError(
                f"band {band}: image {i} has other atoms than image 0; every image of a band must have the same "
                "atoms in the same order"
            )
    return out


class BandDataset:
    """A list of bands (each a list of :func:`band_data` systems) as a sampler's dataset: item
    ``i`` is band ``i``; its metadata are all its images' atoms and, in the place of edges, its
    images (so the sampler's bins fit bands to free atoms and free system slots at once)."""

    def __init__(self, bands: Sequence[Sequence[AtomicData]], device: torch.device | str | None = None) -> None:
        self.bands = [list(b) for b in bands]
        #: Where the sampler puts the bands it hands out (None: where they are).
        self.device = device

    def __len__(self) -> int:
        return len(self.bands)

    def __getitem__(self, i: int) -> list[AtomicData]:
        return self.bands[i]

    def get_metadata(self, i: int) -> tuple[int, int]:
        return sum(d.num_nodes for d in self.bands[i]), len(self.bands[i])


class BandSampler(SizeAwareSampler):
    """A :class:`~alchemi_core.dynamics.SizeAwareSampler` of whole bands: each request takes the
    largest bands that fit the free atoms and free slots and hands out all their images
    (``max_batch_size`` counts images). No prefetch, no worker processes.

    Args:
        bands: Bands, each a list of :func:`band_data` systems.
        device: Where the bands it hands out go (None: where they are).
        **kwargs: ``max_atoms``, ``max_batch_size``, ``bin_width``, ``shuffle``, ``seed``.
    """

    def __init__(self, bands: Sequence[Sequence[AtomicData]], device: torch.device | str | None = None,
                 **kwargs: Any) -> None:
        dataset = BandDataset(bands, device)
        self.most_images = max((len(b) for b in dataset.bands), default=0)
        super().__init__(dataset, prefetch=0, workers=0, **kwargs)
        if self.max_batch_size is not None and self.max_batch_size < self.most_images:
            raise ConfigurationError(
                f"BandSampler: max_batch_size ({self.max_batch_size}) is smaller than a band's images "
                f"({self.most_images}); raise it to at least {self.most_images}"
            )
        #: Each band's images' ``system_id``s: checkpoints count images, as the engine does.
        self.image_ids = [[int(d.system_id.view(-1)[0]) for d in band] for band in dataset.bands]

    @classmethod
    def from_images(cls, dataset: Any, device: torch.device | str | None = None, **kwargs: Any) -> BandSampler:
        """A sampler of the bands in ``dataset``, a dataset of images (e.g. a workflow's input) each
        with its band and place along it: ``neb_band`` and ``neb_image`` fields, or
        ``atoms.info["neb_band"]`` and ``atoms.info["neb_image"]`` of ASE structures. Every image is
        loaded now; each keeps its ``system_id`` (or takes its position in ``dataset``).

        Raises:
            InvalidDataError: An image without its band or place, or a band that is not whole.
        """
        grouped: dict[int, list[tuple[int, AtomicData]]] = {}
        for index in range(len(dataset)):
            data = as_atomic_data(dataset[index], index)
            if "system_id" not in data:
                data = data.with_system_id(index)
            keys = [next((k for k in (name, f"info_{name}") if k in data), None) for name in (NEB_BAND, NEB_IMAGE)]
            if None in keys:
                raise InvalidDataError(
                    f"structure {index} has no band and image index: give every image of a band "
                    "atoms.info['neb_band'] (one number per band) and atoms.info['neb_image'] (0..N-1 along it)"
                )
            band, image = (int(getattr(data, k).view(-1)[0]) for k in keys)  # type: ignore[arg-type]
            grouped.setdefault(band, []).append((image, data))
        bands = []
        for band, members in sorted(grouped.items()):
            images = [d for _, d in sorted(members, key=lambda m: m[0])]
            if sorted(i for i, _ in members) != list(range(len(members))):
                raise InvalidDataError(
                    f"band {band} has images {sorted(i for i, _ in members)}; a band needs images 0..N-1, each once"
                )
            bands.append(band_data(images, band, None))
        return cls(bands, device, **kwargs)

    def batch_capacity(self) -> tuple[int, int]:
        """Room for ``max_batch_size`` images (or as many of the smallest images as ``max_atoms``
        holds); no edges (models build their own neighbours)."""
        smallest = min((d.num_nodes for band in self.dataset.bands for d in band), default=1)
        images = sum(len(band) for band in self.dataset.bands)
        return min(self.max_batch_size or images, self.max_atoms // max(1, smallest)), 0

    def state_dict(self) -> dict[str, Any]:
        """The images handed out (positions in the list of all images, and ``system_id``s)."""
        flat = [i for band in self.image_ids for i in band]
        where = {sid: n for n, sid in enumerate(flat)}
        ids = [sid for b in self._handed for sid in self.image_ids[b]]
        return {"handed_out": [where[i] for i in ids], "handed_out_ids": ids, "seed": self.seed,
                "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s images: the bands whose images were handed out."""
        self.seed = int(state["seed"])
        self.shuffle = bool(state["shuffle"])
        ids = {int(i) for i in state["handed_out_ids"]}
        handed = [b for b, band in enumerate(self.image_ids) if band[0] in ids]
        self._reset_bins(np.asarray(handed, dtype=np.int64))

    def _many(self, max_systems: int, num_atoms: int, num_edges: int | None, stored: bool) -> list[AtomicData]:
        # The largest bands within the free atoms and the free slots (a band's "edges" are its
        # images); the batch's edge budget plays no part (band images are stored without edges).
        out: list[AtomicData] = []
        while True:
            i = self._take(num_atoms, max_systems - len(out))
            if i is None:
                return out
            images = self.dataset[i]
            out.extend(images)
            num_atoms -= sum(d.num_nodes for d in images)


@attrs.frozen
class BandResult:
    """One relaxed band.

    Attributes:
        images: The images, end points included, with their energies and (model) forces.
        energies: ``[N]`` eV.
        barrier: Highest energy minus the initial end point's (eV).
        fmax: The band's largest NEB force at the end (eV/Å).
        converged: ``fmax`` reached the threshold.
    """

    images: list[Any]
    energies: np.ndarray
    barrier: float
    fmax: float
    converged: bool


def band_results(batch: Batch, n_bands: int, fmax: float) -> list[BandResult]:
    """Each band of ``batch`` (bands ``0..n_bands-1``, images in any order) as a :class:`BandResult`."""
    atoms = batch.to_atoms()
    band = batch.neb_band.view(-1).tolist()
    image = batch.neb_image.view(-1).tolist()
    energy = batch.energy.view(-1).tolist()
    band_fmax = getattr(batch, NEB_FMAX).view(-1).tolist()
    rows: dict[int, list[int]] = {}
    for row, b in enumerate(band):
        rows.setdefault(int(b), []).append(row)
    results = []
    for b in range(n_bands):
        if b not in rows:
            raise InvalidDataError(f"band {b} is missing from the finished batch")
        order = sorted(rows[b], key=lambda r: image[r])
        energies = np.asarray([energy[r] for r in order])
        worst = float(band_fmax[order[0]])
        results.append(BandResult([atoms[r] for r in order], energies, float(energies.max() - energies[0]), worst,
                                  worst <= fmax))
    return results


__all__ = ["NEB_BAND", "NEB_FMAX", "NEB_IMAGE", "BandDataset", "BandResult", "BandSampler", "band_data",
           "band_results"]
