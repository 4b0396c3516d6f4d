"""Trajectory analysis: radial distribution functions, mean-squared displacement and diffusion,
velocity autocorrelation and its power spectrum.

A :class:`Trajectory` is one structure's frames as tensors (``[F, N, 3]`` positions, ``[F, 3, 3]``
cells, optional velocities), built from arrays, from a list of ASE atoms or ``AtomicData``, or from
a results store written by ``sink:zarr`` / ``SnapshotHook``. Every function works on the
trajectory's device and batches over frames and atoms (no Python loop per frame in the maths):
move it to the GPU (``trajectory.to("cuda")``) for long trajectories. Units: Å, fs, Å/fs; time
lags in fs, diffusion coefficients in Å²/fs (x 0.1 for cm²/s), frequencies in THz.

* :func:`rdf`: g(r) per element pair and in total, over periodic cells of any shape (minimum image
  where the range allows it, every periodic image within ``r_max`` otherwise).
* :func:`msd`: MSD over all time origins (FFT), from positions unwrapped across the cell;
  :meth:`MSD.diffusion_coefficient` fits its linear regime.
* :func:`vacf`: the velocity autocorrelation over all time origins (FFT);
  :meth:`VACF.diffusion_coefficient` is its Green-Kubo integral D = (1/3) ∫ VACF dt and
  :meth:`VACF.power_spectrum` its Fourier transform (vibrational density of states).

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> frames = 50 + np.cumsum(rng.normal(0.0, 0.1, (100, 64, 3)), axis=0)   # random walks
    >>> traj = Trajectory.from_arrays(frames, cell=np.eye(3) * 12.0, atomic_numbers=[18] * 64, dt=10.0)
    >>> g = rdf(traj, r_max=5.0, bins=50)
    >>> g.r.shape, sorted(g.g)
    (torch.Size([50]), [(18, 18)])
    >>> d = msd(traj).diffusion_coefficient()   # Å²/fs: 0.1² Å² per 10 fs per axis, / 2
    >>> bool(abs(d - 0.0005) < 0.0001)
    True
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

from alchemi_core.errors import ConfigurationError, InvalidDataError

if TYPE_CHECKING:
    import ase

    from alchemi_core.data import AtomicData

#: Pair-image distances :func:`rdf` holds at once (about 100 bytes each in float64: 0.4 GB).
PAIR_BUDGET = 1 << 22
#: Values one FFT of :func:`msd` / :func:`vacf` transforms at once (complex128: 0.5 GB).
FFT_BUDGET = 1 << 25
#: 1/fs in THz.
THZ_PER_INV_FS = 1000.0


def _tensor(value: Any, dtype: torch.dtype, device: Any) -> torch.Tensor:
    return torch.as_tensor(np.asarray(value) if not isinstance(value, torch.Tensor) else value).to(device, dtype)


@attrs.frozen
class Trajectory:
    """The frames of one structure: ``F`` frames of ``N`` atoms, in time order (evenly spaced for
    :func:`msd` and :func:`vacf`).

    Build one with :meth:`from_arrays`, :meth:`from_frames` or :meth:`from_store`.

    Attributes:
        positions: ``[F, N, 3]`` Å, wrapped into the cell or not.
        cell: ``[F, 3, 3]`` Å, rows are lattice vectors (as in ASE).
        pbc: ``[3]`` bool, the periodic axes.
        atomic_numbers: ``[N]`` int64.
        times: ``[F]`` fs.
        velocities: ``[F, N, 3]`` Å/fs, or None.

    Raises:
        InvalidDataError: Shapes that do not agree, non-finite values, or times that are not
            increasing.
    """

    positions: torch.Tensor
    cell: torch.Tensor
    pbc: torch.Tensor
    atomic_numbers: torch.Tensor
    times: torch.Tensor
    velocities: torch.Tensor | None = None

    def __attrs_post_init__(self) -> None:
        x = self.positions
        if x.ndim != 3 or x.shape[-1] != 3 or x.shape[0] < 1:
            raise InvalidDataError(f"trajectory positions must be [frames, atoms, 3]; got {tuple(x.shape)}")
        f, n = x.shape[:2]
        shapes = {"cell": (self.cell, (f, 3, 3)), "pbc": (self.pbc, (3,)), "atomic_numbers": (self.atomic_numbers, (n,)),
                  "times": (self.times, (f,))}
        if self.velocities is not None:
            shapes["velocities"] = (self.velocities, (f, n, 3))
        for name, (value, shape) in shapes.items():
            if tuple(value.shape) != shape:
                raise InvalidDataError(f"trajectory {name} must have shape {shape} for {f} frames of {n} atoms; "
                                       f"got {tuple(value.shape)}")
        for name in ("positions", "cell", "times", "velocities"):
            value = getattr(self, name)
            if value is not None and not bool(torch.isfinite(value).all()):
                raise InvalidDataError(f"trajectory {name} holds non-finite values (NaN or inf)")
        if f > 1 and not bool((self.times.diff() > 0).all()):
            raise InvalidDataError("trajectory times must increase from frame to frame; sort the frames, or "
                                   "give times")

    @property
    def num_frames(self) -> int:
        return int(self.positions.shape[0])

    @property
    def num_atoms(self) -> int:
        return int(self.positions.shape[1])

    @property
    def device(self) -> torch.device:
        return self.positions.device

    def to(self, device: Any) -> Trajectory:
        """The same trajectory on ``device`` (``"cuda"`` for long trajectories)."""
        return attrs.evolve(self, **{a.name: None if getattr(self, a.name) is None else getattr(self, a.name).to(device)
                                     for a in attrs.fields(Trajectory)})

    @classmethod
    def from_arrays(cls, positions: Any, *, cell: Any = None, pbc: Any = None, atomic_numbers: Any = None,
                    times: Any = None, dt: float = 1.0, velocities: Any = None, device: Any = None,
                    dtype: torch.dtype = torch.float64) -> Trajectory:
        """A trajectory from numpy arrays or tensors.

        Args:
            positions: ``[F, N, 3]`` Å.
            cell: ``[3, 3]`` (every frame) or ``[F, 3, 3]`` Å; None for no cell (then ``pbc``
                must be False: only :func:`msd` and :func:`vacf` apply).
            pbc: A bool or three (default: periodic where a cell is given).
            atomic_numbers: ``[N]``; None counts every atom as one element, 0.
            times: ``[F]`` fs; None: ``dt`` apart from 0.
            dt: Time between frames in fs, when ``times`` is None.
            velocities: ``[F, N, 3]`` Å/fs (needed by :func:`vacf`).
            device: Where the tensors go (default: that of ``positions`` if a tensor, else CPU).
            dtype: Float dtype (float64 keeps MSDs of long runs exact).
        """
        if device is None:
            device = positions.device if isinstance(positions, torch.Tensor) else "cpu"
        x = _tensor(positions, dtype, device)
        if x.ndim != 3:
            raise InvalidDataError(f"trajectory positions must be [frames, atoms, 3]; got {tuple(x.shape)}")
        f, n = x.shape[:2]
        c = torch.zeros(3, 3, dtype=dtype, device=device) if cell is None else _tensor(cell, dtype, device)
        c = c.expand(f, 3, 3).clone() if c.ndim == 2 else c
        p = _tensor(cell is not None if pbc is None else pbc, torch.bool, device).expand(3).clone()
        z = torch.zeros(n, dtype=torch.long, device=device) if atomic_numbers is None else _tensor(
            atomic_numbers, torch.long, device)
        t = torch.arange(f, dtype=dtype, device=device) * float(dt) if times is None else _tensor(times, dtype, device)
        v = None if velocities is None else _tensor(velocities, dtype, device)
        return cls(positions=x, cell=c, pbc=p, atomic_numbers=z, times=t, velocities=v)

    @classmethod
    def from_frames(cls, frames: Sequence[ase.Atoms | AtomicData], *, times: Any = None, dt: float = 1.0,
                    device: Any = None, dtype: torch.dtype = torch.float64) -> Trajectory:
        """A trajectory from ASE atoms or ``AtomicData`` of one structure, one per frame; velocities
        come along when every frame has them (ASE momenta).

        Raises:
            InvalidDataError: No frames, or frames of other atoms.
        """
        from alchemi_core.data import AtomicData

        if len(frames) == 0:
            raise InvalidDataError("a trajectory needs at least one frame; got an empty list")
        data = [f if isinstance(f, AtomicData) else AtomicData.from_atoms(f, dtype=dtype) for f in frames]
        numbers = data[0].atomic_numbers
        for k, d in enumerate(data):
            if d.num_nodes != len(numbers) or not torch.equal(d.atomic_numbers.cpu(), numbers.cpu()):
                raise InvalidDataError(f"frame {k} holds other atoms than frame 0: a trajectory is one structure")
        has_v = all("velocities" in d for d in data)
        return cls.from_arrays(
            torch.stack([d.positions for d in data]), cell=torch.stack([d.cell.reshape(3, 3) for d in data]),
            pbc=data[0].pbc.reshape(3), atomic_numbers=numbers, times=times, dt=dt,
            velocities=torch.stack([d.velocities for d in data]) if has_v else None, device=device, dtype=dtype)

    @classmethod
    def from_store(cls, store: Any, system_id: int | None = None, *, dt: float, device: Any = None,
                   dtype: torch.dtype = torch.float64) -> Trajectory:
        """One structure's frames from a results store (``sink:zarr`` fed by ``SnapshotHook``).

        The structure's records are taken in stored order, quarantined ones (negative status)
        left out. Frame times are ``stage_steps * dt``; where ``stage_steps`` goes back (a later
        stage began), the frames of the last stage are used, and a record at the same step as the
        one before it (a final record written after the last snapshot) is skipped.

        Args:
            store: A store path or URL, or an open reader.
            system_id: The structure; None when the store holds one.
            dt: The run's time step in fs.
            device: Where the tensors go.
            dtype: Float dtype.

        Raises:
            InvalidDataError: No such structure, several and no ``system_id``, or no frames.
        """
        from alchemi_core.workflow.results import open_store

        reader = open_store(store)
        ids = np.asarray(reader.get_all_system_ids()).reshape(-1)
        if system_id is None:
            unique = np.unique(ids)
            if len(unique) != 1:
                raise InvalidDataError(f"{reader.where} holds {len(unique)} structures; pick one with "
                                       f"system_id= (ids {unique[:10].tolist()}{' ...' if len(unique) > 10 else ''})")
            system_id = int(unique[0])
        keep = ids == int(system_id)
        if "status" in reader.fields:
            keep &= np.asarray(reader.column("status")).reshape(-1) >= 0
        records = np.nonzero(keep)[0]
        if len(records) == 0:
            raise InvalidDataError(f"{reader.where} has no (unquarantined) records of system_id {system_id}")
        steps = (np.asarray(reader.column("stage_steps")).reshape(-1)[records] if "stage_steps" in reader.fields
                 else np.arange(len(records)))
        back = np.nonzero(np.diff(steps) < 0)[0]
        start = int(back[-1]) + 1 if len(back) else 0
        records, steps = records[start:], steps[start:]
        fresh = np.concatenate(([True], np.diff(steps) > 0))
        records, times = records[fresh], steps[fresh] * float(dt)
        return cls.from_frames([reader[int(i)] for i in records], times=times, device=device, dtype=dtype)


def _types(numbers: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """The elements present (sorted) and each atom's index among them."""
    elements, index = torch.unique(numbers, sorted=True, return_inverse=True)
    return [int(z) for z in elements.tolist()], index


# --------------------------------------------------------------------------------------- RDF


@attrs.frozen
class RDF:
    """Radial distribution functions averaged over frames.

    ``g[(a, b)]`` counts the ordered pairs of an atom of element ``a`` and one of ``b`` (every
    periodic image within range, an atom's own images included) at distance r, per frame, over
    the ideal-gas count ``N_a N_b / V`` times the shell volume. So g tends to 1 at large r (to
    ``1 - 1/N_a`` for ``a = b`` and ``1 - 1/N`` for ``total`` below half the cell width, where an
    atom's own images are not yet in range).

    Attributes:
        edges: ``[bins + 1]`` Å.
        r: ``[bins]`` bin centres, Å.
        g: Per element pair ``(a, b)``, ``a <= b``: ``[bins]``.
        total: Every atom with every atom: ``[bins]``.
        frames: Frames averaged.
    """

    edges: torch.Tensor
    r: torch.Tensor
    g: dict[tuple[int, int], torch.Tensor]
    total: torch.Tensor
    frames: int


def _widths(cell: torch.Tensor) -> torch.Tensor:
    """``[F, 3]``: each frame's width across each axis (the distance between opposite faces)."""
    volume = torch.linalg.det(cell).abs()
    cross = torch.stack([torch.linalg.cross(cell[:, (a + 1) % 3], cell[:, (a + 2) % 3]) for a in range(3)], dim=1)
    return volume[:, None] / torch.linalg.vector_norm(cross, dim=-1)


def _image_shifts(cell: torch.Tensor, pbc: torch.Tensor, r_max: float) -> torch.Tensor:
    """Integer shifts ``[K, 3]`` of every periodic image that can hold a pair within ``r_max`` once
    fractional displacements are rounded to [-1/2, 1/2]: along axis a, ``|k| < r_max / w_a + 1/2``
    (``w_a`` the cell's width across axis a, smallest over frames). Below half the smallest width
    only ``(0, 0, 0)``: the minimum image, exact in any cell."""
    widths = _widths(cell).min(0).values.cpu()
    reach = [int(math.ceil(r_max / float(w) + 0.5)) - 1 if bool(p) else 0 for w, p in zip(widths, pbc.cpu(), strict=True)]
    ranges = [torch.arange(-k, k + 1) for k in reach]
    return torch.cartesian_prod(*ranges).reshape(-1, 3).to(cell.device, cell.dtype)


def rdf(trajectory: Trajectory, r_max: float, bins: int = 200, frames: slice | None = None,
        pair_budget: int = PAIR_BUDGET) -> RDF:
    """Radial distribution functions of a periodic trajectory, per element pair and in total.

    Distances are exact in cells of any shape: the minimum image while ``r_max`` is below half the
    cell's smallest width, every periodic image within ``r_max`` beyond it. Frames and rows of
    atoms go through in chunks of at most ``pair_budget`` pair distances; the cell may change
    from frame to frame (NPT), each frame normalised by its own volume.

    Args:
        trajectory: Periodic along all three axes.
        r_max: Largest distance, Å.
        bins: Bins of equal width from 0 to ``r_max``.
        frames: The frames to average (default: all).
        pair_budget: Pair distances held at once (memory: about 100 bytes each).

    Returns:
        An :class:`RDF`.

    Raises:
        ConfigurationError: ``r_max`` or ``bins`` not positive.
        InvalidDataError: A trajectory not periodic along all three axes.

    Example:
        >>> traj = Trajectory.from_arrays(np.random.default_rng(1).uniform(0, 10, (4, 100, 3)), cell=np.eye(3) * 10)
        >>> g = rdf(traj, r_max=4.0, bins=8)
        >>> bool(abs(g.total[-3:].mean() - 1) < 0.2)
        True
    """
    if not r_max > 0 or int(bins) < 1:
        raise ConfigurationError(f"rdf needs r_max > 0 and bins >= 1; got r_max={r_max}, bins={bins}")
    if not bool(trajectory.pbc.all()):
        raise InvalidDataError("rdf needs a trajectory periodic along all three axes (a cell and pbc=True): "
                               "g(r) is normalised by the cell's volume")
    if not bool((torch.linalg.det(trajectory.cell).abs() > 1e-9).all()):
        raise InvalidDataError("rdf needs a cell of nonzero volume in every frame; give cell= (rows are lattice "
                               "vectors, Å)")
    sel = frames if frames is not None else slice(None)
    x, cell = trajectory.positions[sel], trajectory.cell[sel]
    f, n = x.shape[:2]
    if f == 0:
        raise InvalidDataError("rdf: no frames selected")
    elements, types = _types(trajectory.atomic_numbers)
    nt, bins = len(elements), int(bins)
    dev, dt_ = x.device, x.dtype
    edges = torch.linspace(0.0, float(r_max), bins + 1, dtype=dt_, device=dev)
    shifts = _image_shifts(cell, trajectory.pbc, float(r_max))
    volume = torch.linalg.det(cell).abs()
    inv = torch.linalg.inv(cell)
    rows = max(1, min(n, pair_budget // max(1, n * len(shifts))))
    chunk = max(1, pair_budget // max(1, rows * n * len(shifts)))
    # Sum over frames of V_f * counts_f, per (ordered element pair, bin).
    weighted = torch.zeros(nt * nt * bins, dtype=dt_, device=dev)
    zero_shift = shifts.abs().sum(-1) == 0  # [K]
    for f0 in range(0, f, chunk):
        cs = cell[f0:f0 + chunk]
        frac = torch.einsum("fnk,fkl->fnl", x[f0:f0 + chunk], inv[f0:f0 + chunk])  # [m, N, 3]
        m = frac.shape[0]
        image_vectors = torch.einsum("sk,fkl->fsl", shifts, cs)[:, None, None, :, :]  # [m, 1, 1, K, 3]
        for i0 in range(0, n, rows):
            i1 = min(n, i0 + rows)
            ds = frac[:, None, :, :] - frac[:, i0:i1, None, :]  # [m, rows, N, 3]: s_j - s_i
            d = torch.einsum("fijk,fkl->fijl", ds - torch.round(ds), cs)
            r = torch.linalg.vector_norm(d[:, :, :, None, :] + image_vectors, dim=-1)  # [m, rows, N, K]
            # An atom with itself only through a nonzero shift.
            same = torch.arange(i0, i1, device=dev)[:, None] == torch.arange(n, device=dev)[None, :]
            inside = (r < r_max) & ~(same[None, :, :, None] & zero_shift)
            # Bin only the distances in range; each one's (frame, ordered element pair) from broadcasts.
            pair_type = types[i0:i1, None] * nt + types[None, :]  # [rows, N]
            base = (torch.arange(m, device=dev)[:, None, None, None] * (nt * nt)
                    + pair_type[None, :, :, None]) * bins  # [m, rows, N, 1]
            key = base.expand_as(r)[inside] + torch.bucketize(r[inside], edges, right=True) - 1
            counts = torch.bincount(key, minlength=m * nt * nt * bins)
            weighted += (counts.reshape(m, -1).to(dt_) * volume[f0:f0 + chunk, None]).sum(0)
    shell = (4.0 / 3.0) * math.pi * (edges[1:] ** 3 - edges[:-1] ** 3)
    per_pair = weighted.reshape(nt, nt, bins) / (f * shell)
    counts_of = torch.bincount(types, minlength=nt).to(dt_)
    g = {}
    for a in range(nt):
        for b in range(a, nt):
            g[(elements[a], elements[b])] = (per_pair[a, b] + per_pair[b, a]) / (2.0 * counts_of[a] * counts_of[b])
    total = per_pair.sum((0, 1)) / float(n * n)
    return RDF(edges=edges, r=0.5 * (edges[1:] + edges[:-1]), g=g, total=total, frames=f)


# ------------------------------------------------------------------------- correlations in time


def _check_even(trajectory: Trajectory) -> float:
    """The time between frames (fs), after checking the frames are evenly spaced."""
    t = trajectory.times
    if trajectory.num_frames < 2:
        raise InvalidDataError("a time correlation needs at least two frames")
    steps = t.diff()
    dt = float(steps.mean())
    if not bool(((steps - dt).abs() <= 1e-6 * abs(dt)).all()):
        raise InvalidDataError("time correlations need evenly spaced frames; these are "
                               f"{sorted(set(np.round(steps.cpu().numpy(), 6).tolist()))[:5]} fs apart")
    return dt


def _autocorrelation(a: torch.Tensor, lags: int) -> torch.Tensor:
    """``sum_t a[t] . a[t+m] / (F - m)`` for m < lags, per row: ``a`` is ``[R, F, 3]``, result ``[R, lags]``
    (FFT, zero-padded so it is not circular; rows in chunks of at most :data:`FFT_BUDGET` values)."""
    f = a.shape[1]
    size = 1 << (2 * f - 1).bit_length()
    rows = max(1, FFT_BUDGET // (3 * size))
    out = []
    for r0 in range(0, a.shape[0], rows):
        spectrum = torch.fft.rfft(a[r0:r0 + rows], n=size, dim=1)
        out.append(torch.fft.irfft(spectrum * spectrum.conj(), n=size, dim=1)[:, :lags].sum(-1))
    corr = torch.cat(out) if out else a.new_zeros(0, lags)
    return corr / torch.arange(f, f - lags, -1, device=a.device, dtype=a.dtype)


def _lags(trajectory: Trajectory, max_lag: int | None) -> int:
    f = trajectory.num_frames
    lags = f if max_lag is None else int(max_lag) + 1
    if not 2 <= lags <= f:
        raise ConfigurationError(f"max_lag must be from 1 to frames - 1 = {f - 1}; got {max_lag}")
    return lags


def unwrap(trajectory: Trajectory) -> torch.Tensor:
    """Positions ``[F, N, 3]`` continuous in time: each frame-to-frame displacement taken as its
    minimum image along the periodic axes (so an atom must move less than half the cell's width
    between frames). Positions that were never wrapped come back unchanged."""
    x, cell, pbc = trajectory.positions, trajectory.cell, trajectory.pbc
    if trajectory.num_frames < 2 or not bool(pbc.any()):
        return x
    step = x.diff(dim=0)  # [F-1, N, 3]
    c = cell[1:]
    # Whole lattice vectors along periodic axes only (pinv: a slab's missing axis has no row).
    s = torch.einsum("fik,fkl->fil", step, torch.linalg.pinv(c))
    k = torch.where(pbc, torch.round(s), torch.zeros_like(s))
    step = step - torch.einsum("fik,fkl->fil", k, c)
    return torch.cat([x[:1], x[:1] + step.cumsum(0)])


@attrs.frozen
class TimeCorrelation:
    """A per-atom function of the time lag, averaged over time origins (:class:`MSD`, :class:`VACF`).

    Attributes:
        lag_times: ``[L]`` fs.
        per_atom: ``[N, L]``, one row per atom.
        atomic_numbers: ``[N]``.
    """

    lag_times: torch.Tensor
    per_atom: torch.Tensor
    atomic_numbers: torch.Tensor

    @property
    def mean(self) -> torch.Tensor:
        """``[L]``, averaged over atoms."""
        return self.per_atom.mean(0)

    def by_element(self) -> dict[int, torch.Tensor]:
        """``{atomic number: [L]}``: the average over each element's atoms."""
        elements, types = _types(self.atomic_numbers)
        return {z: self.per_atom[types == k].mean(0) for k, z in enumerate(elements)}

    def of(self, element: int | None) -> torch.Tensor:
        """``[L]``: the average over every atom (None) or over one element's atoms.

        Raises:
            ConfigurationError: No atoms of that element.
        """
        if element is None:
            return self.mean
        keep = self.atomic_numbers == int(element)
        if not bool(keep.any()):
            present = sorted(set(self.atomic_numbers.tolist()))
            raise ConfigurationError(f"no atoms of element {element} in the trajectory (it has {present})")
        return self.per_atom[keep].mean(0)


@attrs.frozen
class MSD(TimeCorrelation):
    """Mean-squared displacement over all time origins: ``per_atom`` in Å², ``mean`` over atoms."""

    def diffusion_coefficient(self, start: float | None = None, stop: float | None = None,
                              element: int | None = None) -> float:
        """D = slope / 6 (Å²/fs; x 0.1 for cm²/s) of a least-squares line through the MSD between
        lag times ``start`` and ``stop`` (fs): its linear regime, after the ballistic start and
        before the few-origin end. Default: from 20 % to 60 % of the longest lag.

        Raises:
            ConfigurationError: Fewer than two lags in the window, or an element not present.
        """
        values = self.of(element)
        return _linear_slope(self.lag_times, values, start, stop) / 6.0


def _linear_slope(t: torch.Tensor, y: torch.Tensor, start: float | None, stop: float | None) -> float:
    t_max = float(t[-1])
    lo = 0.2 * t_max if start is None else float(start)
    hi = 0.6 * t_max if stop is None else float(stop)
    window = (t >= lo) & (t <= hi)
    if int(window.sum()) < 2:
        raise ConfigurationError(f"the fit window {lo:g} to {hi:g} fs holds fewer than two lags "
                                 f"(lags run from 0 to {t_max:g} fs every {float(t[1] - t[0]):g} fs)")
    tw, yw = t[window], y[window]
    tc = tw - tw.mean()
    return float((tc * (yw - yw.mean())).sum() / (tc * tc).sum())


def msd(trajectory: Trajectory, max_lag: int | None = None, unwrapped: bool = False) -> MSD:
    """Mean-squared displacement of every atom over all time origins (O(F log F) by FFT).

    Args:
        trajectory: Evenly spaced frames.
        max_lag: The longest lag, in frames (default: all, ``F - 1``).
        unwrapped: The positions are continuous already (no wrapping back into the cell); by
            default they are unwrapped with :func:`unwrap`.

    Raises:
        InvalidDataError: Fewer than two frames, or frames not evenly spaced.
    """
    dt = _check_even(trajectory)
    lags = _lags(trajectory, max_lag)
    x = trajectory.positions if unwrapped else unwrap(trajectory)
    x = (x - x[:1]).to(torch.float64).transpose(0, 1)  # [N, F, 3], from each atom's start (precision)
    f = x.shape[1]
    sq = (x * x).sum(-1)  # [N, F]
    # S1(m) = sum_{t < F-m} (|x(t+m)|² + |x(t)|²) / (F - m), from prefix sums.
    prefix = torch.cat([torch.zeros_like(sq[:, :1]), sq.cumsum(1)], dim=1)  # prefix[:, k] = sum_{t<k}
    m = torch.arange(lags, device=x.device)
    s1 = (prefix[:, f][:, None] - prefix[:, m] + prefix[:, f - m]) / (f - m).to(x.dtype)
    # Rounding can leave -1e-16 where the MSD is 0 (lag 0).
    per_atom = (s1 - 2.0 * _autocorrelation(x, lags)).clamp_min(0.0)
    return MSD(lag_times=m.to(x.dtype) * dt, per_atom=per_atom.to(trajectory.positions.dtype),
               atomic_numbers=trajectory.atomic_numbers)


@attrs.frozen
class VACF(TimeCorrelation):
    """Velocity autocorrelation ``<v(0) . v(t)>`` over all time origins: ``per_atom`` in Å²/fs²,
    ``mean`` over atoms."""

    def diffusion_coefficient(self, stop: float | None = None, element: int | None = None) -> float:
        """Green-Kubo D = (1/3) ∫_0^stop VACF dt (Å²/fs, trapezoid rule); ``stop`` (fs) defaults
        to half the longest lag, past which few time origins make the tail noisy."""
        values = self.of(element)
        t = self.lag_times
        hi = 0.5 * float(t[-1]) if stop is None else float(stop)
        keep = t <= hi
        return float(torch.trapezoid(values[keep], t[keep])) / 3.0

    def power_spectrum(self, window: str | None = "hann", element: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The VACF's cosine transform ``S(nu) = 2 ∫_0^T w(t) VACF(t) cos(2 pi nu t) dt``, the
        vibrational density of states up to a factor (``S(0) = 6 D``).

        Args:
            window: ``"hann"`` (``w = cos²(pi t / 2T)``, which damps the ripples of cutting the
                VACF at T) or None (``w = 1``).
            element: Only this element's atoms.

        Returns:
            Frequencies ``[K]`` in THz (x 33.356 for cm⁻¹) and ``S`` ``[K]`` in Å²/fs.

        Raises:
            ConfigurationError: An unknown window.
        """
        values = self.of(element)
        t = self.lag_times
        if window == "hann":
            values = values * torch.cos(0.5 * math.pi * t / t[-1]) ** 2
        elif window is not None:
            raise ConfigurationError(f"unknown window {window!r}; use 'hann' or None")
        lags = len(values)
        even = torch.cat([values, values[1:-1].flip(0)])  # the even extension: a real cosine transform
        dt = float(t[1] - t[0])
        spectrum = torch.fft.rfft(even).real * dt
        freq = torch.fft.rfftfreq(len(even), d=dt, device=t.device).to(t.dtype) * THZ_PER_INV_FS
        return freq[: lags], spectrum[: lags]


def vacf(trajectory: Trajectory, max_lag: int | None = None) -> VACF:
    """Velocity autocorrelation of every atom over all time origins (O(F log F) by FFT).

    Args:
        trajectory: Evenly spaced frames with velocities (``SnapshotHook`` stores them).
        max_lag: The longest lag, in frames (default: all, ``F - 1``).

    Raises:
        InvalidDataError: No velocities, fewer than two frames, or frames not evenly spaced.
    """
    if trajectory.velocities is None:
        raise InvalidDataError("vacf needs velocities: give velocities= (Å/fs) or frames that carry them "
                               "(ASE momenta; a store written by SnapshotHook from an MD stage)")
    dt = _check_even(trajectory)
    lags = _lags(trajectory, max_lag)
    v = trajectory.velocities.to(torch.float64).transpose(0, 1)
    per_atom = _autocorrelation(v, lags)
    lag_times = torch.arange(lags, device=v.device, dtype=torch.float64) * dt
    dtype = trajectory.velocities.dtype
    return VACF(lag_times=lag_times.to(dtype), per_atom=per_atom.to(dtype), atomic_numbers=trajectory.atomic_numbers)


# ------------------------------------------------------------------------------------- plots

#: What :func:`plot_store` draws.
ANALYSIS_PLOTS = ("rdf", "msd")
#: Structures :func:`plot_store` draws at most (the first by ``system_id``).
PLOTTED_STRUCTURES = 6


def plot_store(store: Any, outdir: str | os.PathLike[str], kinds: Sequence[str] = ANALYSIS_PLOTS,
               dt: float | None = None) -> list[Path]:
    """``rdf.png`` and ``msd.png`` of the MD trajectories in a results store (frames written by
    ``SnapshotHook``): one line per structure with at least two frames, the first
    :data:`PLOTTED_STRUCTURES` by ``system_id``. The RDF runs to just below half the smallest
    cell width (periodic structures only); MSD lags are in fs given ``dt`` (the run's time step),
    in MD steps otherwise.

    Returns:
        The files written: none where no structure has two frames.

    Raises:
        ConfigurationError: An unknown kind.
        MissingDependencyError: matplotlib is not installed.
    """
    from alchemi_core.errors import MissingDependencyError
    from alchemi_core.workflow.results import open_store

    for kind in kinds:
        if kind not in ANALYSIS_PLOTS:
            raise ConfigurationError(f"unknown analysis plot {kind!r}; choose from {list(ANALYSIS_PLOTS)}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError("plots need matplotlib: pip install matplotlib") from None
    reader = open_store(store)
    ids, records = np.unique(reader.get_all_system_ids(), return_counts=True)  # one read, however large the store
    trajectories = []
    for sid in ids[records >= 2].tolist():
        traj = Trajectory.from_store(reader, int(sid), dt=1.0 if dt is None else dt)
        if traj.num_frames >= 2:
            trajectories.append((int(sid), traj))
        if len(trajectories) == PLOTTED_STRUCTURES:
            break
    outdir = Path(outdir)
    written: list[Path] = []
    for kind in kinds:
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        drawn = False
        for sid, traj in trajectories:
            if kind == "rdf" and bool(traj.pbc.all()):
                g = rdf(traj, r_max=0.499 * float(_widths(traj.cell).min()))
                ax.plot(g.r.cpu(), g.total.cpu(), label=f"system {sid}")
                drawn = True
            elif kind == "msd":
                result = msd(traj)
                ax.plot(result.lag_times.cpu(), result.mean.cpu(), label=f"system {sid}")
                drawn = True
        if not drawn:
            plt.close(fig)
            continue
        if kind == "rdf":
            ax.set(xlabel="r (Å)", ylabel="g(r), all atoms", title="radial distribution function")
        else:
            ax.set(xlabel="lag time (fs)" if dt is not None else "lag (MD steps)", ylabel="MSD (Å²)",
                   title="mean-squared displacement")
        ax.legend(fontsize="small")
        fig.tight_layout()
        outdir.mkdir(parents=True, exist_ok=True)
        fig.savefig(outdir / f"{kind}.png")
        plt.close(fig)
        written.append(outdir / f"{kind}.png")
    return written
