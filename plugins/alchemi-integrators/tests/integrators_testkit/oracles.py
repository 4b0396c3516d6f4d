"""Torch oracles of the integrators: each step written as plain torch operations, to test the one
production implementation (Warp kernels) against, step by step.

Each oracle is a subclass of the production class whose ``pre_update``/``post_update`` are the
torch steps the package once shipped as its ``backend="torch"``; parameters, state fields,
masks and constraints are the production class's. Values derived from the masks are rebuilt at
every step (an oracle need not be fast). Langevin and C-rescale draw their noise from the
integrator's torch generator, so they agree with production in distribution, or exactly with
the noise switched off (zero friction, a temperature near 0 K). CSVR takes its two random numbers
per system and step from production's keyed draws (:func:`csvr_draws`), so it agrees step by step.

Example:
    >>> from alchemi_integrators import Langevin
    >>> oracle(Langevin).__name__
    'TorchLangevin'
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import warp as wp

from alchemi_core.units import KB
from alchemi_integrators import (
    CSVR,
    FIRE,
    FIRE2,
    NPH,
    NPTMTK,
    Langevin,
    NoseHooverChain,
    NPTCRescale,
    VelocityVerlet,
)
from alchemi_integrators.cell_filter import CELL_VELOCITY
from alchemi_integrators.cell_math import expm
from alchemi_integrators.csvr import THERMOSTAT_ENERGY
from alchemi_integrators.fire import FIRE_ALPHA, FIRE_DT, FIRE_POSITIVE_STEPS, FIRE_STEPS
from alchemi_integrators.kernel_funcs import sum_of_squared_normals, system_stream
from alchemi_integrators.nose_hoover import CHAIN_POSITIONS, CHAIN_VELOCITIES, YOSHIDA_WEIGHTS
from alchemi_integrators.npt_common import (
    BAROSTAT_CHAIN_POSITIONS,
    BAROSTAT_CHAIN_VELOCITIES,
    CELL_STRAIN_RATE,
    THERMOSTAT_POSITIONS,
    THERMOSTAT_VELOCITIES,
)
from alchemi_integrators.thermo import degrees_of_freedom, kinetic_energy, masses_and_totals
from alchemi_integrators.warp_kernels import warp_seed

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Per-system coefficient columns of one FIRE step: v' = A_V v + A_F F + A_KICK F/m; dx = B_V v' + B_OLD v.
A_V, A_F, A_KICK, B_V, B_OLD, CAP = range(6)


class _Oracle:
    """What every oracle shares: no cache (every derived value is built afresh each step)."""

    def cached(self, name: str, batch: Batch, build: Any, reads_fields: bool = True, masks: bool = True) -> Any:
        return build()

    def per_atom(self: Any, batch: Batch, values: torch.Tensor) -> torch.Tensor:
        """``[B]`` values of each atom's system as ``[V, 1]``."""
        return values.index_select(0, batch.batch_idx).unsqueeze(-1)

    def step_sizes(self: Any, batch: Batch, fraction: float) -> torch.Tensor:
        """``[B]`` ``fraction * dt``, 0 for systems this stage does not integrate now."""
        h = self.per_system("dt", batch) * fraction
        active = self.active(batch)
        return h if active is None else h * active


# ---------------------------------------------------------------------------------------------
# velocity Verlet, Langevin, Nose-Hoover chains
# ---------------------------------------------------------------------------------------------


def _verlet_coefficients(dyn: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per atom ``[V, 1]``: the half-kick factor ``dt/2 / m`` and the drift ``dt`` (0 where idle)."""
    drift = dyn.per_atom(batch, dyn.per_system("dt", batch))
    weight = dyn.context.node_weight
    drift = drift * weight if weight is not None else drift
    return dyn.inv_mass * drift * 0.5, drift


def kick_and_drift(dyn: Any, batch: Batch) -> None:
    """``v += dt/2 F/m; x += dt v``."""
    half_kick, drift = _verlet_coefficients(dyn, batch)
    batch.velocities.addcmul_(batch.forces, half_kick)
    batch.positions.addcmul_(batch.velocities, drift)


def kick(dyn: Any, batch: Batch) -> None:
    """``v += dt/2 F/m``."""
    batch.velocities.addcmul_(batch.forces, _verlet_coefficients(dyn, batch)[0])


class TorchVelocityVerlet(_Oracle, VelocityVerlet):
    def pre_update(self, batch: Batch) -> None:
        kick_and_drift(self, batch)

    def post_update(self, batch: Batch) -> None:
        kick(self, batch)


class TorchLangevin(_Oracle, Langevin):
    """BAOAB with the noise of the integrator's torch generator."""

    def _coefficients(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        """Per atom ``[V, 1]``: half-kick ``dt/2 / m``, half-drift ``dt/2``, decay ``c1`` and
        noise amplitude ``c2 sqrt(kB T / m)`` (dt = 0 for idle systems: every part the identity)."""
        dt = self.step_sizes(batch, 1.0)
        dt_a = self.per_atom(batch, dt)
        gamma_a = self.per_atom(batch, self.per_system("friction", batch))
        temp_a = self.per_atom(batch, self.per_system("temperature", batch))
        c1 = torch.exp(-gamma_a * dt_a)
        sigma = torch.sqrt((1.0 - c1 * c1) * KB * temp_a * self.inv_mass)
        return self.inv_mass * dt_a * 0.5, dt_a * 0.5, c1, sigma

    def pre_update(self, batch: Batch) -> None:
        half_kick, half_dt, c1, sigma = self._coefficients(batch)
        v, x = batch.velocities, batch.positions
        v.addcmul_(batch.forces, half_kick)
        x.addcmul_(v, half_dt)
        noise = torch.randn(v.shape, generator=self.generator(v.device), dtype=v.dtype, device=v.device) * sigma
        if self.fix_com:
            mass, total = masses_and_totals(batch, self.inv_mass)
            momentum = torch.zeros(batch.num_graphs, 3, dtype=v.dtype, device=v.device)
            momentum.index_add_(0, batch.batch_idx, noise * mass)
            noise = noise - (momentum / total).index_select(0, batch.batch_idx)
        v.mul_(c1).add_(noise)
        x.addcmul_(v, half_dt)
        counter = getattr(batch, self.noise_field)
        mask = self.context.system_mask
        counter.add_(1 if mask is None else mask.to(counter.dtype))

    def post_update(self, batch: Batch) -> None:
        batch.velocities.addcmul_(batch.forces, self._coefficients(batch)[0])


def rescaling_factor(
    ke: torch.Tensor, target: torch.Tensor, nf: torch.Tensor, c: torch.Tensor, r1: torch.Tensor, chi2: torch.Tensor,
) -> torch.Tensor:
    """``[B]`` stochastic velocity rescaling factors (Bussi, Donadio & Parrinello 2007, appendix):
    kinetic energy ``ke`` of ``nf`` degrees of freedom relaxes towards ``target`` with
    ``c = exp(-time / tau)``; ``r1`` is the first normal, ``chi2`` the sum of all ``nf`` squared."""
    safe_ke = ke.clamp(min=torch.finfo(ke.dtype).tiny)
    new_ke = c * ke + (1.0 - c) * target * chi2 / nf + 2.0 * r1 * torch.sqrt(c * (1.0 - c) * ke * target / nf)
    alpha = torch.sqrt(new_ke.clamp(min=0.0) / safe_ke)
    flip = (r1 + torch.sqrt(c * nf * ke / ((1.0 - c).clamp(min=1e-300) * target))) < 0
    alpha = torch.where(flip, -alpha, alpha)
    return torch.where(ke > 0, alpha, torch.ones_like(alpha))


@wp.kernel
def _csvr_draws(seed: wp.int32, system_id: wp.array(dtype=wp.int64), step: wp.array(dtype=wp.int32),
                nf: wp.array(dtype=wp.float64), out: wp.array2d(dtype=wp.float64)):
    b = wp.tid()
    first = system_stream(seed, system_id[b], step[b], 0)
    r1 = wp.float64(wp.randn(first))
    out[b, 0] = r1
    out[b, 1] = sum_of_squared_normals(system_stream(seed, system_id[b], step[b], 1), r1, nf[b])


def csvr_draws(seed: int, batch: Batch, step: torch.Tensor, nf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Production CSVR's two random numbers of each system at its ``step``: ``R_1`` and the sum
    of ``nf`` squared normals (float64, drawn by a Warp kernel with the kernels' keys)."""
    out = torch.zeros(batch.num_graphs, 2, dtype=torch.float64, device=nf.device)
    args = [warp_seed(seed), wp.from_torch(batch.system_id), wp.from_torch(step.contiguous()),
            wp.from_torch(nf.to(torch.float64).contiguous()), wp.from_torch(out)]
    if nf.is_cuda:  # on torch's current stream, ordered with the oracle's torch operations
        wp.launch(_csvr_draws, batch.num_graphs, args, stream=wp.stream_from_torch(torch.cuda.current_stream()))
    else:
        wp.launch(_csvr_draws, batch.num_graphs, args, device="cpu")
    dtype = nf.dtype
    return out[:, 0].to(dtype), out[:, 1].to(dtype)


class TorchCSVR(_Oracle, CSVR):
    """Velocity Verlet, then each system's Bussi rescaling over dt, in torch; the random numbers
    are production's (:func:`csvr_draws`)."""

    def pre_update(self, batch: Batch) -> None:
        kick_and_drift(self, batch)

    def post_update(self, batch: Batch) -> None:
        kick(self, batch)
        counter = getattr(batch, self.noise_field)
        nf = degrees_of_freedom(batch)
        r1, chi2 = csvr_draws(self.random_seed, batch, counter, nf)
        ke = kinetic_energy(batch)
        target = 0.5 * nf * KB * self.per_system("temperature", batch)
        c = torch.exp(-self.per_system("dt", batch) / self.per_system("tau", batch))
        alpha = rescaling_factor(ke, target, nf, c, r1, chi2)
        mask = self.context.system_mask
        if mask is not None:
            alpha = torch.where(mask, alpha, torch.ones_like(alpha))
        getattr(batch, THERMOSTAT_ENERGY).add_(ke * (1.0 - alpha * alpha))
        batch.velocities.mul_(self.per_atom(batch, alpha))
        counter.add_(1 if mask is None else mask.to(counter.dtype))


def nhc_half_step(
    ke: torch.Tensor, xi: torch.Tensor, vxi: torch.Tensor, q: torch.Tensor, kt: torch.Tensor, nf: torch.Tensor,
    half_dt: torch.Tensor, weights: tuple[float, ...], chain_steps: int,
) -> torch.Tensor:
    """Integrate ``[B, M]`` chains over ``half_dt`` ``[B]`` in place; return the velocity scale.

    Each sub-step of length h (``w half_dt / chain_steps``) is the symmetric Trotter factorisation
    of MTK 1996: the last thermostat's velocity gets h/2 of its force, each lower one is scaled
    by exp(-h/4 v_{j+1}), kicked by h/2 of its force and scaled again, the particle velocities are
    scaled by exp(-h v_1), the positions move by h v_j, and the same updates run back up the chain.
    """
    m = xi.shape[1]
    scale = torch.ones_like(ke)
    ke = ke.clone()

    def force(j: int) -> torch.Tensor:
        if j == 0:
            return (2.0 * ke - nf * kt) / q[:, 0]
        return (q[:, j - 1] * vxi[:, j - 1] ** 2 - kt) / q[:, j]

    def kick_chain(j: int, h: torch.Tensor) -> None:
        if j + 1 < m:
            damp = torch.exp(-0.25 * h * vxi[:, j + 1])
            vxi[:, j] *= damp
            vxi[:, j] += 0.5 * h * force(j)
            vxi[:, j] *= damp
        else:
            vxi[:, j] += 0.5 * h * force(j)

    for _ in range(chain_steps):
        for w in weights:
            h = half_dt * (w / chain_steps)
            for j in reversed(range(m)):
                kick_chain(j, h)
            s = torch.exp(-h * vxi[:, 0])
            scale *= s
            ke *= s * s
            xi += h.unsqueeze(-1) * vxi
            for j in range(m):
                kick_chain(j, h)
    return scale


class TorchNoseHooverChain(_Oracle, NoseHooverChain):
    def _half_step_chain(self, batch: Batch) -> torch.Tensor:
        kt = self.per_system("temperature", batch) * KB
        return nhc_half_step(
            kinetic_energy(batch), getattr(batch, CHAIN_POSITIONS), getattr(batch, CHAIN_VELOCITIES),
            self.chain_masses(batch), kt, degrees_of_freedom(batch), self.step_sizes(batch, 0.5),
            YOSHIDA_WEIGHTS[self.yoshida_order], self.chain_steps,
        )

    def pre_update(self, batch: Batch) -> None:
        batch.velocities.mul_(self.per_atom(batch, self._half_step_chain(batch)))
        kick_and_drift(self, batch)

    def post_update(self, batch: Batch) -> None:
        kick(self, batch)
        batch.velocities.mul_(self.per_atom(batch, self._half_step_chain(batch)))


# ---------------------------------------------------------------------------------------------
# FIRE and FIRE 2.0 (with the cell filters)
# ---------------------------------------------------------------------------------------------


def _full_like(t: torch.Tensor, value: float | torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, value) if isinstance(value, float) else value


class _TorchFire(_Oracle):
    """FIRE's step over atoms (and, with a cell filter, the cell's three rows). ``post_update``
    is production's: with a cell filter, the filter's fmax for the convergence check."""

    def _parameter_values(self: Any, batch: Batch) -> dict[str, Any]:
        dtype = batch.positions.dtype
        return {name: p.scalar if p.scalar is not None else p.per_system(batch, dtype)
                for name, p in self.parameters.items() if name != "dt"}

    def _state(self: Any, batch: Batch) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(batch, n) for n in (FIRE_DT, FIRE_ALPHA, FIRE_POSITIVE_STEPS, FIRE_STEPS))

    def _keep_inactive(self: Any, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        mask = self.context.system_mask
        return new if mask is None else torch.where(mask, new, old)

    @staticmethod
    def _steer(sums: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """``a |v| / |F|`` per system (0 where F = 0)."""
        vv, ff = sums[:, 1], sums[:, 2]
        ratio = torch.where(ff > 0, vv / torch.where(ff > 0, ff, 1.0), 0.0)
        return alpha * ratio.sqrt()

    def system_update(self, batch: Batch, sums: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _coefficients(self: Any, batch: Batch, sums: torch.Tensor) -> torch.Tensor:
        coeff = self.system_update(batch, sums)
        active = self.context.system_mask
        if active is not None:
            still = torch.zeros_like(coeff[0])
            still[A_V] = 1.0
            coeff = torch.where(active.unsqueeze(-1), coeff, still)
        return coeff

    def pre_update(self: Any, batch: Batch) -> None:
        if self.cell_filter is not None:
            self._cell_step(batch)
            return
        v, f = batch.velocities, batch.forces
        sums = torch.zeros(batch.num_graphs, 3, dtype=v.dtype, device=v.device).index_add_(
            0, batch.batch_idx, torch.stack([(f * v).sum(-1), (v * v).sum(-1), (f * f).sum(-1)], dim=-1))
        c = self._coefficients(batch, sums).index_select(0, batch.batch_idx)
        dx = v * c[:, B_OLD : B_OLD + 1]
        v.mul_(c[:, A_V : A_V + 1]).addcmul_(f, c[:, A_F : A_F + 1])
        v.addcmul_(f, c[:, A_KICK : A_KICK + 1] * self.inv_mass)
        dx.addcmul_(v, c[:, B_V : B_V + 1])
        self._cap(batch, dx, None, c[:, CAP : CAP + 1], None)
        batch.positions.add_(dx)

    def _cap(self: Any, batch: Batch, dx: torch.Tensor, d_cell: torch.Tensor | None, cap: torch.Tensor,
             cell_cap: torch.Tensor | None) -> None:
        """The step cap over atoms (and cell rows): each row, or each system's whole step."""
        tiny = torch.finfo(dx.dtype).tiny
        if self.maxstep_scope == "atom":
            dx.mul_(torch.clamp(cap / torch.linalg.vector_norm(dx, dim=-1, keepdim=True).clamp(min=tiny), max=1.0))
            if d_cell is not None:
                norm = torch.linalg.vector_norm(d_cell, dim=-1, keepdim=True)
                d_cell.mul_(torch.clamp(cell_cap / norm.clamp(min=tiny), max=1.0))
            return
        sq = torch.zeros(batch.num_graphs, dtype=dx.dtype, device=dx.device).index_add_(
            0, batch.batch_idx, (dx * dx).sum(-1))
        if d_cell is None:
            norm = sq.sqrt().index_select(0, batch.batch_idx).unsqueeze(-1)
            dx.mul_(torch.clamp(cap / norm.clamp(min=tiny), max=1.0))
            return
        sq.add_((d_cell * d_cell).sum((1, 2)))
        scale = torch.clamp(cell_cap.view(-1) / sq.sqrt().clamp(min=tiny), max=1.0)
        dx.mul_(scale.index_select(0, batch.batch_idx).unsqueeze(-1))
        d_cell.mul_(scale.view(-1, 1, 1))

    def _cell_step(self: Any, batch: Batch) -> None:
        f_atoms = torch.empty_like(batch.positions)
        _, f_cell = self.cell_filter.forces(batch, self.per_system("scalar_pressure", batch), f_atoms)
        v, vc = batch.velocities, getattr(batch, CELL_VELOCITY)
        sums = torch.zeros(batch.num_graphs, 3, dtype=v.dtype, device=v.device).index_add_(
            0, batch.batch_idx,
            torch.stack([(f_atoms * v).sum(-1), (v * v).sum(-1), (f_atoms * f_atoms).sum(-1)], dim=-1))
        sums[:, 0] += (f_cell * vc).sum((1, 2))
        sums[:, 1] += (vc * vc).sum((1, 2))
        sums[:, 2] += (f_cell * f_cell).sum((1, 2))
        coeff = self._coefficients(batch, sums)
        c = coeff.index_select(0, batch.batch_idx)
        dx = v * c[:, B_OLD : B_OLD + 1]
        v.mul_(c[:, A_V : A_V + 1]).addcmul_(f_atoms, c[:, A_F : A_F + 1])
        v.addcmul_(f_atoms, c[:, A_KICK : A_KICK + 1] * self.inv_mass)
        dx.addcmul_(v, c[:, B_V : B_V + 1])
        cs = coeff.view(-1, 6, 1, 1)
        d_cell = vc * cs[:, B_OLD]
        vc.mul_(cs[:, A_V]).addcmul_(f_cell, cs[:, A_F])
        vc.addcmul_(f_cell, cs[:, A_KICK] * self._cell_inv_mass(batch).view(-1, 1, 1))
        d_cell.addcmul_(vc, cs[:, B_V])
        self._cap(batch, dx, d_cell, c[:, CAP : CAP + 1], cs[:, CAP])
        self.cell_filter.move(batch, dx, d_cell, self.context.system_mask)


class TorchFIRE(_TorchFire, FIRE):
    def system_update(self, batch: Batch, sums: torch.Tensor) -> torch.Tensor:
        p = self._parameter_values(batch)
        dt, alpha, positive_steps, steps = self._state(batch)
        first = positive_steps < 0
        uphill_or_first = sums[:, 0] <= 0
        downhill = ~uphill_or_first & ~first
        grow = downhill & (positive_steps > p["n_min"])
        keep = downhill | first
        grown = torch.minimum(dt * p["f_inc"], _full_like(dt, p["dt_max"]))
        new_dt = torch.where(grow, grown, torch.where(keep, dt, dt * p["f_dec"]))
        reset = _full_like(alpha, p["alpha_start"])
        new_alpha = torch.where(grow, alpha * p["f_alpha"], torch.where(keep, alpha, reset))
        coeff = torch.zeros(batch.num_graphs, 6, dtype=dt.dtype, device=dt.device)
        coeff[:, A_V] = torch.where(downhill, 1.0 - alpha, first.to(dt.dtype))
        coeff[:, A_F] = torch.where(downhill, self._steer(sums, alpha), 0.0)
        coeff[:, A_KICK] = new_dt
        coeff[:, B_V] = new_dt
        coeff[:, CAP] = p["maxstep"]
        dt.copy_(self._keep_inactive(new_dt, dt))
        alpha.copy_(self._keep_inactive(new_alpha, alpha))
        positive_steps.copy_(self._keep_inactive(torch.where(downhill, positive_steps + 1, 0), positive_steps))
        steps.add_(1 if self.context.system_mask is None else self.context.system_mask.to(steps.dtype))
        return coeff


class TorchFIRE2(_TorchFire, FIRE2):
    def system_update(self, batch: Batch, sums: torch.Tensor) -> torch.Tensor:
        p = self._parameter_values(batch)
        dt, alpha, positive_steps, steps = self._state(batch)
        downhill = sums[:, 0] > 0
        new_positive = torch.where(downhill, positive_steps + 1, 0)
        grow = downhill & (new_positive > p["n_delay"])
        cut = ~downhill
        if self.initial_delay:
            cut = cut & (steps + 1 >= p["n_delay"])
        cut_dt = dt * p["f_dec"]
        new_dt = torch.where(
            grow, torch.minimum(dt * p["f_inc"], _full_like(dt, p["dt_max"])),
            torch.where(cut & (cut_dt >= p["dt_min"]), cut_dt, dt),
        )
        reset = _full_like(alpha, p["alpha_start"])
        new_alpha = torch.where(grow, alpha * p["f_alpha"], torch.where(cut, reset, alpha))
        mix = torch.where(downhill, 1.0 - alpha, 1.0)
        coeff = torch.zeros(batch.num_graphs, 6, dtype=dt.dtype, device=dt.device)
        # v' = mix (v + dt F/m) + steer F when downhill; v' = dt F/m (from rest) when not.
        coeff[:, A_V] = torch.where(downhill, mix, 0.0)
        coeff[:, A_F] = torch.where(downhill, self._steer(sums, alpha), 0.0)
        coeff[:, A_KICK] = mix * new_dt
        coeff[:, B_V] = new_dt
        if self.half_step_back:
            coeff[:, B_OLD] = torch.where(downhill, 0.0, -0.5 * new_dt)
        coeff[:, CAP] = p["maxstep"]
        dt.copy_(self._keep_inactive(new_dt, dt))
        alpha.copy_(self._keep_inactive(new_alpha, alpha))
        positive_steps.copy_(self._keep_inactive(new_positive, positive_steps))
        steps.add_(1 if self.context.system_mask is None else self.context.system_mask.to(steps.dtype))
        return coeff


# ---------------------------------------------------------------------------------------------
# NPT: MTK and C-rescale
# ---------------------------------------------------------------------------------------------


def phi1(x: torch.Tensor, order: int = 10) -> torch.Tensor:
    """``(exp(x) - 1) / x = sum_k x^k / (k + 1)!`` for ``[..., n, n]`` matrices with ``|x| <~ 0.1``.

    Under a constant strain rate ``g``, ``dr/dt = v + g r`` integrates over ``t`` to
    ``r(t) = exp(g t) r + t phi1(g t) v``.
    """
    eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device).expand_as(x)
    out = eye / float(math.factorial(order + 1))
    for k in range(order - 1, -1, -1):
        out = eye / float(math.factorial(k + 1)) + x @ out
    return out


def sym(a: torch.Tensor) -> torch.Tensor:
    """The symmetric part ``(a + a^T) / 2`` of ``[..., n, n]`` matrices."""
    return 0.5 * (a + a.transpose(-1, -2))


class _TorchNPT(_Oracle):
    def _project(self: Any, g: torch.Tensor) -> torch.Tensor:
        """The part of a ``[B, 3, 3]`` cell force the cell follows: symmetric, or isotropic."""
        if self.anisotropic:
            return sym(g)
        eye = torch.eye(3, dtype=g.dtype, device=g.device)
        return g.diagonal(dim1=-2, dim2=-1).mean(-1).view(-1, 1, 1) * eye

    @staticmethod
    def _rows_times(batch: Batch, rows: torch.Tensor, mats: torch.Tensor) -> torch.Tensor:
        """``rows[i] @ mats[system of i]`` for ``[V, 3]`` rows and ``[B, 3, 3]`` matrices."""
        return torch.bmm(rows.unsqueeze(1), mats.index_select(0, batch.batch_idx)).squeeze(1)

    def _accelerations(self: Any, batch: Batch) -> torch.Tensor:
        return batch.forces * self.inv_mass


class TorchNPTMTK(_TorchNPT, NPTMTK):
    def _chains(self, batch: Batch) -> None:
        """Both chains over dt/2: the barostat's scales g, the particles' scales v (NPH: none)."""
        if not self.thermostatted:
            return
        kt = self.kt(batch)
        weights = YOSHIDA_WEIGHTS[self.yoshida_order]
        g = getattr(batch, CELL_STRAIN_RATE)
        nf = degrees_of_freedom(batch)
        chains = (
            (self._barostat_ke(batch), BAROSTAT_CHAIN_POSITIONS, BAROSTAT_CHAIN_VELOCITIES, "tau_p",
             torch.full_like(kt, self.cell_dof)),
            (kinetic_energy(batch), THERMOSTAT_POSITIONS, THERMOSTAT_VELOCITIES, "tau_t", nf),
        )
        half = self.step_sizes(batch, 0.5)
        scales = [
            nhc_half_step(ke, getattr(batch, xi), getattr(batch, vxi), self._chain_masses(batch, dof, tau), kt, dof,
                          half, weights, self.chain_steps)
            for ke, xi, vxi, tau, dof in chains
        ]
        g.mul_(scales[0].view(-1, 1, 1))
        batch.velocities.mul_(self.per_atom(batch, scales[1]))

    def _kick_cell(self, batch: Batch) -> None:
        """``g += dt/2 G / W`` with ``G = V (P - p I) + (2 KE / N_f) I``."""
        half = self.step_sizes(batch, 0.5)
        volume = self.volume(batch).view(-1, 1, 1)
        eye = torch.eye(3, dtype=volume.dtype, device=volume.device)
        nf = degrees_of_freedom(batch).view(-1, 1, 1)
        two_ke = 2.0 * kinetic_energy(batch).view(-1, 1, 1)
        p_ext = self.per_system("pressure", batch).view(-1, 1, 1)
        force = volume * (self.pressure_tensor(batch) - p_ext * eye) + (two_ke / nf) * eye
        g = getattr(batch, CELL_STRAIN_RATE)
        g.add_(self._project(force) * (half / self.barostat_mass(batch)).view(-1, 1, 1))

    def _kick_atoms(self, batch: Batch) -> None:
        """``v <- exp(-B h) v + h phi1(-B h) F/m`` with ``B = g + tr(g)/N_f I``, h = dt/2."""
        half = self.step_sizes(batch, 0.5).view(-1, 1, 1)
        g = getattr(batch, CELL_STRAIN_RATE)
        eye = torch.eye(3, dtype=g.dtype, device=g.device)
        trace = g.diagonal(dim1=-2, dim2=-1).sum(-1).view(-1, 1, 1)
        damp = -(g + trace / degrees_of_freedom(batch).view(-1, 1, 1) * eye) * half
        v = batch.velocities
        new_v = self._rows_times(batch, v, expm(damp, squarings=2, order=8))
        new_v += self._rows_times(batch, self._accelerations(batch), phi1(damp) * half)
        v.copy_(new_v)

    def _drift(self, batch: Batch) -> None:
        """``x <- exp(g dt) x + dt phi1(g dt) v``; ``h <- exp(g dt) h`` (as rows: ``x @ exp``)."""
        dt = self.step_sizes(batch, 1.0).view(-1, 1, 1)
        strain = getattr(batch, CELL_STRAIN_RATE) * dt
        grow = expm(strain, squarings=2, order=8)
        x = batch.positions
        new_x = self._rows_times(batch, x, grow)
        new_x += self._rows_times(batch, batch.velocities, phi1(strain) * dt)
        x.copy_(new_x)
        batch.cell.copy_((batch.cell.to(grow.dtype) @ grow).to(batch.cell.dtype))

    def pre_update(self, batch: Batch) -> None:
        self._chains(batch)
        self._kick_cell(batch)
        self._kick_atoms(batch)
        self._drift(batch)

    def post_update(self, batch: Batch) -> None:
        self._kick_atoms(batch)
        self._kick_cell(batch)
        self._chains(batch)


class TorchNPTCRescale(_TorchNPT, NPTCRescale):
    """C-rescale with three normals per atom from a torch generator of its own (seeded by
    ``random_seed``, kept apart from the one that draws initial velocities, so systems that
    enter later get the velocities production gives them), saved by ``state_dict``."""

    def _noise_generator(self, device: torch.device) -> torch.Generator:
        generators = self.__dict__.setdefault("_oracle_noise", {})
        if device not in generators:
            generators[device] = torch.Generator(device=device).manual_seed(self.random_seed + 1)
        return generators[device]

    def _normals(self, out: torch.Tensor) -> None:
        out.normal_(generator=self._noise_generator(out.device))

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["oracle_noise"] = {str(d): g.get_state() for d, g in self.__dict__.get("_oracle_noise", {}).items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.__dict__["_oracle_noise"] = {}
        for device, generator_state in state.get("oracle_noise", {}).items():
            self._noise_generator(torch.device(device)).set_state(generator_state)

    def _thermostat(self, batch: Batch) -> None:
        """Stochastic velocity rescaling over dt/2 (Bussi, Donadio & Parrinello 2007)."""
        half = self.step_sizes(batch, 0.5)
        c = torch.exp(-half / self.per_system("tau_t", batch))
        nf = degrees_of_freedom(batch)
        ke = kinetic_energy(batch)
        target = 0.5 * nf * self.kt(batch)
        noise = torch.empty(batch.num_nodes, 3, dtype=ke.dtype, device=ke.device)
        self._normals(noise)
        # N_f = 3N - 3 of the 3N normals of each system: all but the first atom's y, z and the
        # second atom's x; the first atom's x is the thermostat's correlated one.
        weights = torch.ones_like(noise)
        first = batch.batch_ptr[:-1]
        weights[first, 1] = 0.0
        weights[first, 2] = 0.0
        weights[(first + 1).clamp(max=batch.num_nodes - 1), 0] = 0.0
        chi2 = torch.zeros_like(ke).index_add_(0, batch.batch_idx, (noise * noise * weights).sum(-1))
        r1 = noise.view(-1).index_select(0, first * 3)
        batch.velocities.mul_(self.per_atom(batch, rescaling_factor(ke, target, nf, c, r1, chi2)))

    def _rescale(self, batch: Batch) -> None:
        """One step of the cell's stochastic equation; atoms and cell scale with it."""
        dt = self.step_sizes(batch, 1.0).view(-1, 1, 1)
        volume = self.volume(batch).view(-1, 1, 1)
        kt = self.kt(batch).view(-1, 1, 1)
        beta = self.per_system("compressibility", batch).view(-1, 1, 1)
        tau = self.per_system("tau_p", batch).view(-1, 1, 1)
        eye = torch.eye(3, dtype=volume.dtype, device=volume.device)
        p_ext = self.per_system("pressure", batch).view(-1, 1, 1)
        drive = self.pressure_tensor(batch) - p_ext * eye
        noise = torch.empty(batch.num_graphs, 3, 3, dtype=volume.dtype, device=volume.device)
        self._normals(noise)
        if self.anisotropic:
            # Per component: mobility beta/(3 tau); sym() of unit normals gives the off-diagonal
            # strains half the variance of the diagonal ones, as their doubled force requires.
            d_strain = (beta / (3.0 * tau)) * sym(drive) * dt
            d_strain = d_strain + torch.sqrt(2.0 * kt * beta * dt / (3.0 * volume * tau)) * sym(noise)
        else:
            p_int = drive.diagonal(dim1=-2, dim2=-1).mean(-1).view(-1, 1, 1)
            d_eps = (beta / tau) * p_int * dt + torch.sqrt(2.0 * kt * beta * dt / (volume * tau)) * noise[:, :1, :1]
            d_strain = d_eps / 3.0 * eye
        grow = expm(d_strain, squarings=2, order=8)
        shrink = expm(-d_strain, squarings=2, order=8)
        x, v = batch.positions, batch.velocities
        x.copy_(self._rows_times(batch, x, grow))
        v.copy_(self._rows_times(batch, v, shrink))
        batch.cell.copy_((batch.cell.to(grow.dtype) @ grow).to(batch.cell.dtype))

    def _half_drift(self, batch: Batch) -> None:
        batch.positions.addcmul_(batch.velocities, self.per_atom(batch, self.step_sizes(batch, 0.5)))

    def _half_kick(self, batch: Batch) -> None:
        batch.velocities.addcmul_(self._accelerations(batch), self.per_atom(batch, self.step_sizes(batch, 0.5)))

    def pre_update(self, batch: Batch) -> None:
        self._thermostat(batch)
        self._half_kick(batch)
        self._half_drift(batch)
        self._rescale(batch)
        self._half_drift(batch)

    def post_update(self, batch: Batch) -> None:
        self._half_kick(batch)
        self._thermostat(batch)


class TorchNPH(TorchNPTMTK, NPH):
    """MTK's oracle with its chains off."""


ORACLES: dict[type, type] = {
    VelocityVerlet: TorchVelocityVerlet, Langevin: TorchLangevin, NoseHooverChain: TorchNoseHooverChain,
    CSVR: TorchCSVR, FIRE: TorchFIRE, FIRE2: TorchFIRE2, NPTMTK: TorchNPTMTK, NPH: TorchNPH,
    NPTCRescale: TorchNPTCRescale,
}


def oracle(cls: type) -> type:
    """The torch oracle of the production integrator class ``cls``."""
    return ORACLES[cls]


def implementation(cls: type, which: str) -> type:
    """``cls`` itself for ``which="warp"`` (production), its torch oracle for ``"torch"``."""
    if which not in ("warp", "torch"):
        raise ValueError(f"which must be 'warp' (production) or 'torch' (the oracle), got {which!r}")
    return cls if which == "warp" else ORACLES[cls]
