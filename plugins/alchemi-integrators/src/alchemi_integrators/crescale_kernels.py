"""C-rescale's NPT step as Warp kernels (``integrator:npt-crescale``).

A specialised set of kernels (a generic torch step is about a hundred small operations on 3x3
matrices and per-atom copies of them): a step is three kernels per system and five per atom,
each atom pass also writing its share of the kinetic tensor where the next system kernel needs it
(:mod:`~alchemi_integrators.npt_common`):

* before the forces: shares of ``m v v^T``, summed; per system, the thermostat's factor; per atom,
  the factor, the half-kick, the half-drift and the new shares, summed; per system, the strain
  step ``d`` (drift by the pressure difference, noise by the barostat's amplitude), ``exp(d)``,
  ``exp(-d)`` and the cell; per atom, ``x exp(d)``, ``v exp(-d)`` and the second half-drift.
* after the forces: per atom, the half-kick and its shares, summed; per system, the thermostat's
  factor; per atom, the scaling.

**Random numbers.** Each system draws its own, keyed by ``random_seed``, the integrator's draw
counter (a device integer the step advances, so a replayed CUDA graph draws fresh numbers; it is
part of :meth:`NPTCRescale.state_dict`) and ``system_id``, so a system's numbers do not depend on
where it sits in the batch. The thermostat (stochastic velocity rescaling) needs the sum of
``N_f`` squared normal numbers: it draws the first normal and a chi-squared variate of ``N_f - 1``
degrees of freedom (twice a gamma variate, Marsaglia and Tsang's method), one draw per system
whatever its size. The test oracle (three normals per atom from a torch generator) agrees with it
in distribution, not step by step.

Example:
    >>> from alchemi_core import registry
    >>> npt = registry.build("integrator:npt-crescale", model=model, dt=5.0, temperature=50.0,
    ...                      compressibility=60.0)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import warp as wp

from alchemi_core.units import KB
from alchemi_integrators.kernel_funcs import (
    declare_overloads,
    half_kick,
    idle,
    keyed_state,
    launches_of,
    rescaling_factor,
    sum_of_squared_normals,
)
from alchemi_integrators.npt_common import (
    expm3,
    eye3,
    in_dtype,
    kinetic_parts,
    kinetic_share,
    kinetic_sums,
    kinetic_tensor,
    maps,
    matmul3,
    parts,
    scale_buffer,
    trace3,
    volume3,
)
from alchemi_integrators.warp_kernels import active_flags, advance_counter, common, scale_by_system, typed, warp_seed

if TYPE_CHECKING:
    from alchemi_core.data import Batch

# ---------------------------------------------------------------------------------------------
# random numbers
# ---------------------------------------------------------------------------------------------


@wp.func
def _system_state(seed: wp.int32, draw: wp.int32, system_id: wp.int64, stream: wp.int32):
    # A generator state keyed by (seed, draw number, system, purpose).
    return wp.rand_init(wp.int32(keyed_state(seed, draw, wp.int32(system_id))), stream)


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------


@wp.kernel
def _thermostat(
    kd: wp.array(dtype=Any),
    system_id: wp.array(dtype=wp.int64),
    temperature: wp.array(dtype=Any),
    tau_t: wp.array(dtype=Any),
    nf: wp.array(dtype=Any),
    dt: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
    seed: wp.int32,
    counter: wp.array(dtype=wp.int32),
    kb: Any,
    scale: wp.array(dtype=Any),
):
    # Stochastic velocity rescaling over dt/2 (Bussi, Donadio & Parrinello 2007; the formula of
    # NPTCRescale._thermostat): the kinetic energy jumps to a sample of its canonical relaxation.
    b = wp.tid()
    one = type(kb)(1.0)
    scale[b] = one
    if idle(active, b):
        return
    ke = type(kb)(0.5) * (kd[b][0] + kd[b][1] + kd[b][2])
    c = wp.exp(-type(kb)(0.5) * dt[b] / tau_t[b])
    n = nf[b]
    target = type(kb)(0.5) * n * kb * temperature[b]
    state = _system_state(seed, counter[0], system_id[b], 0)
    r1 = type(kb)(wp.randn(state))
    chi2 = sum_of_squared_normals(_system_state(seed, counter[0], system_id[b], 1), r1, n)
    scale[b] = rescaling_factor(ke, target, n, c, r1, chi2)


@wp.kernel
def _rescale(
    kd: wp.array(dtype=Any),
    ko: wp.array(dtype=Any),
    system_id: wp.array(dtype=wp.int64),
    cell: wp.array(dtype=Any),
    stress: wp.array(dtype=Any),
    temperature: wp.array(dtype=Any),
    pressure: wp.array(dtype=Any),
    tau_p: wp.array(dtype=Any),
    compressibility: wp.array(dtype=Any),
    dt: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
    seed: wp.int32,
    counter: wp.array(dtype=wp.int32),
    kb: Any,
    anisotropic: wp.int32,
    grow: wp.array(dtype=Any),
    shrink: wp.array(dtype=Any),
):
    # One step of the cell's stochastic equation (NPTCRescale._rescale): the strain step d, the
    # maps exp(d) of positions and cell and exp(-d) of velocities.
    b = wp.tid()
    cb = cell[b]
    eye = eye3(cb)
    if idle(active, b):
        grow[b] = eye
        shrink[b] = eye
        return
    volume = volume3(cb)
    kt = kb * temperature[b]
    mobility = compressibility[b] / tau_p[b]
    drive = kinetic_tensor(kd[b], ko[b], cb) / volume - stress[b] - eye * pressure[b]
    state = _system_state(seed, counter[0], system_id[b], 2)
    d = eye * type(kb)(0.0)
    if anisotropic != 0:
        # Per component: mobility / 3; sym() of unit normals gives the off-diagonal strains half
        # the variance of the diagonal ones, as their doubled force requires.
        n0 = type(kb)(wp.randn(state))
        n1 = type(kb)(wp.randn(state))
        n2 = type(kb)(wp.randn(state))
        n3 = type(kb)(wp.randn(state))
        n4 = type(kb)(wp.randn(state))
        n5 = type(kb)(wp.randn(state))
        n6 = type(kb)(wp.randn(state))
        n7 = type(kb)(wp.randn(state))
        n8 = type(kb)(wp.randn(state))
        noise = type(cb)(n0, n1, n2, n3, n4, n5, n6, n7, n8)
        half = type(kb)(0.5)
        third = type(kb)(1.0) / type(kb)(3.0)
        amplitude = wp.sqrt(type(kb)(2.0) * kt * compressibility[b] * dt[b] / (type(kb)(3.0) * volume * tau_p[b]))
        d = (drive + wp.transpose(drive)) * (half * mobility * third * dt[b])
        d = d + (noise + wp.transpose(noise)) * (half * amplitude)
    else:
        amplitude = wp.sqrt(type(kb)(2.0) * kt * compressibility[b] * dt[b] / (volume * tau_p[b]))
        d_eps = mobility * (trace3(drive) / type(kb)(3.0)) * dt[b] + amplitude * type(kb)(wp.randn(state))
        d = eye * (d_eps / type(kb)(3.0))
    e = expm3(d)
    grow[b] = e
    shrink[b] = expm3(-d)
    cell[b] = matmul3(cb, e)


@wp.kernel
def _scale_kick_drift(
    x: wp.array(dtype=Any),
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    active: wp.array(dtype=Any),
    scale: wp.array(dtype=Any),
    dt: wp.array(dtype=Any),
    diag: wp.array(dtype=Any),
    off: wp.array(dtype=Any),
):
    # The thermostat's factor, the half-kick and the first half-drift; the new kinetic shares.
    i = wp.tid()
    b = system[i]
    vi = v[i]
    if not idle(active, b):
        vi = half_kick(vi * scale[b], f[i], inv_mass[i], dt[b])
        v[i] = vi
        x[i] = x[i] + vi * (type(dt[b])(0.5) * dt[b])
    d, o = kinetic_share(vi, inv_mass[i])
    diag[i] = d
    off[i] = o


@wp.kernel
def _rescale_drift(
    x: wp.array(dtype=Any),
    v: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    active: wp.array(dtype=Any),
    grow: wp.array(dtype=Any),
    shrink: wp.array(dtype=Any),
    dt: wp.array(dtype=Any),
):
    # x exp(d), v exp(-d), then the second half-drift.
    i = wp.tid()
    b = system[i]
    if idle(active, b):
        return
    vi = wp.mul(v[i], shrink[b])
    v[i] = vi
    x[i] = wp.mul(x[i], grow[b]) + vi * (type(dt[b])(0.5) * dt[b])


@wp.kernel
def _kick(
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    active: wp.array(dtype=Any),
    dt: wp.array(dtype=Any),
    diag: wp.array(dtype=Any),
    off: wp.array(dtype=Any),
):
    # The second half-kick and the new kinetic shares.
    i = wp.tid()
    b = system[i]
    vi = v[i]
    if not idle(active, b):
        vi = half_kick(vi, f[i], inv_mass[i], dt[b])
        v[i] = vi
    d, o = kinetic_share(vi, inv_mass[i])
    diag[i] = d
    off[i] = o


declare_overloads([_thermostat, _rescale, _scale_kick_drift, _rescale_drift, _kick],)


# ---------------------------------------------------------------------------------------------
# the step
# ---------------------------------------------------------------------------------------------


def _draws(dyn: Any, batch: Batch) -> tuple[int, torch.Tensor]:
    """The seed as a Warp int and this device's draw counter (advanced after each use)."""
    return warp_seed(dyn.random_seed), dyn.noise_counter(batch.device)


def _thermostat_factors(dyn: Any, batch: Batch, kd: torch.Tensor) -> torch.Tensor:
    seed, counter = _draws(dyn, batch)
    per = dyn.per_system
    scale = scale_buffer(dyn, batch)
    args = (kd, batch.system_id, per("temperature", batch), per("tau_t", batch), dyn.system_dof(batch),
            per("dt", batch), active_flags(dyn, batch), seed, counter, typed(KB, batch), scale)
    launches_of(dyn).launch("thermostat", _thermostat, batch.num_graphs, args, batch.device)
    advance_counter(launches_of(dyn), "thermostat", counter)
    return scale


def crescale_pre(dyn: Any, batch: Batch) -> None:
    """``NPTCRescale``'s update before the forces (see the module docstring)."""
    launches = launches_of(dyn)
    _, v, f, inv_mass, system, _, active = common(dyn, batch)
    dt = dyn.per_system("dt", batch)
    diag, off = parts(dyn, batch)
    launches.launch("parts", kinetic_parts, batch.num_nodes, (v, inv_mass, diag, off), batch.device)
    kd, _ = kinetic_sums(dyn, batch, diag, off)
    scale = _thermostat_factors(dyn, batch, kd)
    args = (batch.positions, v, f, inv_mass, system, active, scale, dt, diag, off)
    launches.launch("scale_kick_drift", _scale_kick_drift, batch.num_nodes, args, batch.device)
    kd, ko = kinetic_sums(dyn, batch, diag, off)
    per = dyn.per_system
    seed, counter = _draws(dyn, batch)
    cell = in_dtype(dyn, batch, "cell")
    grow, shrink = maps(dyn, batch, ("grow", "shrink"))
    args = (kd, ko, batch.system_id, cell, in_dtype(dyn, batch, "stress"), per("temperature", batch),
            per("pressure", batch), per("tau_p", batch), per("compressibility", batch), dt, active, seed, counter,
            typed(KB, batch), int(dyn.anisotropic), grow, shrink)
    launches.launch("rescale", _rescale, batch.num_graphs, args, batch.device)
    advance_counter(launches, "rescale", counter)
    if cell is not batch.cell:
        batch.cell.copy_(cell)
    args = (batch.positions, v, system, active, grow, shrink, dt)
    launches.launch("rescale_drift", _rescale_drift, batch.num_nodes, args, batch.device)


def crescale_post(dyn: Any, batch: Batch) -> None:
    """``NPTCRescale``'s update after the forces (see the module docstring)."""
    launches = launches_of(dyn)
    _, v, f, inv_mass, system, _, active = common(dyn, batch)
    diag, off = parts(dyn, batch)
    args = (v, f, inv_mass, system, active, dyn.per_system("dt", batch), diag, off)
    launches.launch("kick", _kick, batch.num_nodes, args, batch.device)
    kd, _ = kinetic_sums(dyn, batch, diag, off)
    scale = _thermostat_factors(dyn, batch, kd)
    launches.launch("scale", scale_by_system, batch.num_nodes, (v, system, scale), batch.device)
