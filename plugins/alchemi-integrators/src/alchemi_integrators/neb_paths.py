"""Initial paths of nudged elastic bands: linear and IDPP interpolation between two end points.

:func:`interpolate` gives ``n_images`` images from an initial and a final structure (the same atoms
in the same order): straight lines (ASE's ``ase.mep.interpolate``) or, with ``method="idpp"``,
those lines relaxed on the image-dependent pair potential of Smidstrup et al. (J. Chem. Phys. 140,
214106 (2014)), as ASE's ``ase.mep.idpp_interpolate(images)`` does: each image's target pair
distances are interpolated between the end points' and a NEB of the IDPP energies (ASE's default
NEB: the improved tangent, ``k = 0.1``, no climbing; :func:`neb_forces`) is relaxed by MDMin (``dt = 0.2``,
``maxstep = 0.2`` Å) for at most ``steps`` steps or until its largest force is below ``fmax``.
The images are relaxed together as one batch of tensors (float64, on ``device``); the loop reads
one number back per step, which is fine for a set-up that runs once per band.

With ``mic=True`` differences (the straight line, the pair distances) take the minimum image in
the end points' cell, through ASE's ``find_mic``: pairs half a cell apart are ties, and ASE's
search decides their sign, which the IDPP forces follow.

Example:
    >>> from ase.build import bulk
    >>> from alchemi_integrators.neb_paths import interpolate
    >>> initial = bulk("Cu", cubic=True).repeat(2)
    >>> del initial[0]
    >>> final = initial.copy()
    >>> final.positions[0] = (0.0, 0.0, 0.0)
    >>> images = interpolate(initial, final, 5, method="idpp")
    >>> len(images), bool(abs(images[2].positions[0] - initial.positions[0] / 2).max() < 0.2)
    (5, True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.errors import ConfigurationError, InvalidDataError

if TYPE_CHECKING:
    import ase

METHODS = ("linear", "idpp")


def interpolate(
    initial: ase.Atoms, final: ase.Atoms, n_images: int, method: str = "linear", *, mic: bool = False,
    fmax: float = 0.1, steps: int = 100, device: torch.device | str = "cpu",
) -> list[ase.Atoms]:
    """``n_images`` images from ``initial`` to ``final`` (copies of ``initial`` with new positions;
    the end points are copies of the two given).

    Args:
        initial: The first end point.
        final: The last end point: the same atoms in the same order.
        n_images: Images in all, end points included (at least 3).
        method: ``"linear"`` or ``"idpp"``.
        mic: Minimum-image differences in the end points' cell.
        fmax: IDPP: stop when the largest IDPP NEB force is below this (ASE's 0.1).
        steps: IDPP: most MDMin steps (ASE's 100).
        device: Where the IDPP relaxation runs.

    Raises:
        ConfigurationError: An unknown method or fewer than 3 images.
        InvalidDataError: The end points have other atoms.
    """
    if method not in METHODS:
        raise ConfigurationError(f"interpolate: method must be one of {METHODS}, got {method!r}")
    if int(n_images) < 3:
        raise ConfigurationError(f"interpolate: a band needs at least 3 images (2 end points), got {n_images}")
    if len(initial) != len(final) or (initial.numbers != final.numbers).any():
        raise InvalidDataError(
            "interpolate: the end points must have the same atoms in the same order "
            f"(got {initial.get_chemical_formula()} and {final.get_chemical_formula()})"
        )
    cell = torch.as_tensor(np.asarray(initial.cell), dtype=torch.float64, device=device)
    pbc = torch.as_tensor(initial.pbc & mic, device=device)
    start = torch.as_tensor(initial.positions, dtype=torch.float64, device=device)
    step = _minimum_image(torch.as_tensor(final.positions, dtype=torch.float64, device=device) - start, cell, pbc)
    fraction = torch.arange(n_images, dtype=torch.float64, device=device).view(-1, 1, 1) / (n_images - 1)
    path = start + fraction * step
    if method == "idpp":
        path = idpp(path, cell, pbc, fmax=fmax, steps=steps)
    images = [initial.copy()]
    for x in path[1:-1].cpu().numpy():
        image = initial.copy()
        image.set_positions(x, apply_constraint=False)
        images.append(image)
    return [*images, final.copy()]


def idpp(path: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor, *, fmax: float = 0.1, steps: int = 100,
         k: float = 0.1, dt: float = 0.2, maxstep: float = 0.2) -> torch.Tensor:
    """The IDPP relaxation of ``path`` (``[N, n, 3]``: N images of n atoms, end points first and
    last), returned as a new tensor; ``pbc`` (``[3]`` bool) says on which axes of ``cell``
    differences take the minimum image. See the module docstring."""
    if path.shape[0] < 3:
        return path.clone()
    targets = _distances(path[0], cell, pbc)[0]
    targets = targets + torch.linspace(0, 1, path.shape[0], dtype=path.dtype, device=path.device).view(-1, 1, 1) * (
        _distances(path[-1], cell, pbc)[0] - targets)
    x = path.clone()
    v: torch.Tensor | None = None
    for n in range(steps + 1):
        energies, forces = _idpp_energies_forces(x, targets, cell, pbc)
        forces = neb_forces(x, energies, forces[1:-1], cell, pbc, k)
        if float(forces.norm(dim=-1).max()) < fmax or n == steps:
            break
        # MDMin (ASE's): half kicks around a projection of v on F, v reset when it opposes F.
        if v is None:
            v = torch.zeros_like(forces)
        else:
            v = v + 0.5 * dt * forces
            vf = (v * forces).sum()
            v = torch.zeros_like(v) if vf < 0 else forces * (vf / (forces * forces).sum())
        v = v + 0.5 * dt * forces
        dx = dt * v
        dx = dx * min(1.0, maxstep / (1e-6 + float(dx.norm(dim=-1).max())))
        x[1:-1] += dx
    return x


def _minimum_image(d: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor) -> torch.Tensor:
    """``d`` in the minimum image on the periodic axes, by ASE's ``find_mic`` (a difference of half
    a cell is a tie whose sign ASE's search decides; the IDPP forces of such pairs follow it)."""
    if not bool(pbc.any()):
        return d
    from ase.geometry import find_mic

    vectors, _ = find_mic(d.reshape(-1, 3).cpu().numpy(), cell.cpu().numpy(), pbc.cpu().numpy())
    return torch.as_tensor(vectors, dtype=d.dtype, device=d.device).reshape(d.shape)


def _distances(x: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair distances ``[..., n, n]`` and differences ``D[..., i, j] = x_j - x_i``."""
    diff = _minimum_image(x.unsqueeze(-3) - x.unsqueeze(-2), cell, pbc)
    return diff.norm(dim=-1), diff


def _idpp_energies_forces(x: torch.Tensor, targets: torch.Tensor, cell: torch.Tensor,
                          pbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Energies ``[M]`` and forces ``[M, n, 3]`` of the IDPP ``0.5 sum (d - target)^2 / d^4``."""
    d, diff = _distances(x, cell, pbc)
    dd = d - targets
    eye = torch.eye(d.shape[-1], dtype=torch.bool, device=d.device)
    d = torch.where(eye, torch.ones_like(d), d)
    energies = 0.5 * (dd**2 / d**4).sum((-1, -2))
    forces = -2 * ((dd * (1 - 2 * dd / d) / d**5).unsqueeze(-1) * diff).sum(-3)
    return energies, forces


def neb_forces(x: torch.Tensor, energies: torch.Tensor, forces: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor,
               k: float, climb: bool = False) -> torch.Tensor:
    """The NEB forces ``[N-2, n, 3]`` of one band ``x`` (``[N, n, 3]``) with ``energies`` ``[N]``
    and the interior images' true ``forces`` ``[N-2, n, 3]``: ASE's ``method="improvedtangent"``
    (the tangent of Henkelman and Jónsson's eqs. 8-11, the spring force of their eq. 12 along it,
    the climbing image's component along it inverted)."""
    t = _minimum_image(x[1:] - x[:-1], cell, pbc)  # t[i]: from image i to image i + 1
    t1, t2 = t[:-1], t[1:]
    e = energies.view(-1, 1, 1)
    before, here, after = e[:-2], e[1:-1], e[2:]
    big = torch.maximum((after - here).abs(), (before - here).abs())
    small = torch.minimum((after - here).abs(), (before - here).abs())
    rising = (after > here) & (here > before)
    falling = (after < here) & (here < before)
    w1 = torch.where(rising, 0.0, torch.where(falling, 1.0, torch.where(after > before, small, big)))
    w2 = torch.where(rising, 1.0, torch.where(falling, 0.0, torch.where(after > before, big, small)))
    tangent = w1 * t1 + w2 * t2
    norm = tangent.norm(dim=(-1, -2), keepdim=True)
    tangent = tangent / torch.where(norm > 0, norm, torch.ones_like(norm))
    along = (forces * tangent).sum((-1, -2), keepdim=True)
    spring = k * (t2.norm(dim=(-1, -2), keepdim=True) - t1.norm(dim=(-1, -2), keepdim=True))
    out = forces - along * tangent + spring * tangent
    if climb:
        top = int(torch.argmax(energies[1:-1]))
        out[top] = forces[top] - 2 * along[top] * tangent[top]
    return out


__all__: list[Any] = ["METHODS", "idpp", "interpolate", "neb_forces"]
