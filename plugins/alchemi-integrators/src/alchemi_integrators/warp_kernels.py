"""Fused Warp kernels for the integrators: their one implementation, on CPUs and GPUs alike.

Each update of an integrator is one to three kernel launches over the batch's tensors, zero-copy
through ``wp.from_torch`` and on torch's current CUDA stream, so they order with the model's torch
work and can be captured in a CUDA graph. Per-system sums of vectors (Langevin's noise momentum,
FIRE's power and norms) go through :mod:`~alchemi_integrators.system_sums` (levels of chunks,
no contention on one address in a large system); the kinetic energy of Nose-Hoover is an atomic
add per atom into a ``[B]`` buffer. Nothing is read back to the host.

Per step, the Python cost is a signature check and a replay of a recorded launch
(recorded once, in ``alchemi_core.warp_runtime``): Warp arrays and launches are rebuilt only when a tensor's
address or shape changes (systems entering or leaving), not every step.

Kernels are generic over float32/float64; both overloads are declared at import
(:func:`~alchemi_integrators.kernel_funcs.declare_overloads`) so the module compiles once (and is
cached by Warp) instead of once per dtype met at run time. Only Warp APIs present in
warp-lang 1.5 are used.

Example:
    >>> from alchemi_integrators import Langevin
    >>> nvt = Langevin(model, dt=5.0, temperature=50.0, friction=0.01)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import warp as wp

from alchemi_core.units import KB
from alchemi_core.warp_runtime import RecordedLaunches
from alchemi_integrators.kernel_funcs import (
    chain_walk,
    declare_overloads,
    gaussian3,
    half_kick,
    idle,
    kick_atom,
    launches_of,
    rescaling_factor,
    sum_of_squared_normals,
    system_stream,
)
from alchemi_integrators.system_sums import system_sums
from alchemi_integrators.thermo import degrees_of_freedom, masses_and_totals

if TYPE_CHECKING:
    from alchemi_core.data import Batch
    from alchemi_integrators.base import Integrator

# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------


@wp.kernel
def _kick_drift(
    x: wp.array(dtype=Any),
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    dt: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
):
    # Velocity Verlet's first half: v += dt/2 F/m; x += dt v.
    i = wp.tid()
    b = system[i]
    if idle(active, b):
        return
    vi = half_kick(v[i], f[i], inv_mass[i], dt[b])
    v[i] = vi
    x[i] = x[i] + vi * dt[b]


@wp.kernel
def _kick(
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    dt: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
):
    # Velocity Verlet's second half: v += dt/2 F/m.
    i = wp.tid()
    b = system[i]
    if idle(active, b):
        return
    v[i] = half_kick(v[i], f[i], inv_mass[i], dt[b])


@wp.kernel
def _langevin_baoa(
    x: wp.array(dtype=Any),
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    mass: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    first_atom: wp.array(dtype=wp.int64),
    system_id: wp.array(dtype=wp.int64),
    noise_step: wp.array(dtype=wp.int32),
    dt: wp.array(dtype=Any),
    friction: wp.array(dtype=Any),
    temperature: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
    kb: Any,
    seed: wp.int32,
    fix_com: wp.int32,
    kicks: wp.array(dtype=Any),
):
    # B, A, O and (without fix_com) the second A of BAOAB. With fix_com each atom's noise
    # momentum goes to kicks[i] (summed per system by system_sums, not by an atomic add per atom
    # onto one address) and the second A waits for _langevin_remove_com_drift. Idle atoms leave
    # their kick unwritten: it only adds to their own (idle, unread) system's total.
    i = wp.tid()
    b = system[i]
    if idle(active, b):
        return
    h = type(kb)(0.5) * dt[b]
    im = inv_mass[i]
    vi = half_kick(v[i], f[i], im, dt[b])
    xi = x[i] + vi * h
    c1 = wp.exp(-friction[b] * dt[b])
    sigma = wp.sqrt((type(kb)(1.0) - c1 * c1) * kb * temperature[b] * im)
    local = wp.int32(wp.int64(i) - first_atom[b])
    noise = gaussian3(seed, system_id[b], noise_step[b], local, vi) * sigma
    vi = vi * c1 + noise
    v[i] = vi
    if fix_com != 0:
        x[i] = xi
        kicks[i] = noise * mass[i]
    else:
        x[i] = xi + vi * h


@wp.kernel
def _langevin_remove_com_drift(
    x: wp.array(dtype=Any),
    v: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    momentum: wp.array(dtype=Any),
    total_mass: wp.array(dtype=Any),
    dt: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
):
    # Take the noise's COM velocity out, then the second A of BAOAB.
    i = wp.tid()
    b = system[i]
    if idle(active, b):
        return
    vi = v[i] - momentum[b] / total_mass[b]
    v[i] = vi
    x[i] = x[i] + vi * (type(dt[b])(0.5) * dt[b])


@wp.kernel
def _langevin_kick_count(
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    first_atom: wp.array(dtype=wp.int64),
    noise_step: wp.array(dtype=wp.int32),
    dt: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
):
    # The last B of BAOAB; each system's first atom also advances the system's noise counter
    # (read by _langevin_baoa in an earlier launch, so there is no race).
    i = wp.tid()
    b = system[i]
    if idle(active, b):
        return
    v[i] = half_kick(v[i], f[i], inv_mass[i], dt[b])
    if wp.int64(i) == first_atom[b]:
        noise_step[b] = noise_step[b] + 1


@wp.kernel
def _kinetic_energy(
    v: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    ke: wp.array(dtype=Any),
):
    # ke[b] += m v² / 2 in eV: m / ACCELERATION = 1 / inv_mass.
    i = wp.tid()
    vi = v[i]
    wp.atomic_add(ke, wp.int32(system[i]), type(inv_mass[i])(0.5) * wp.dot(vi, vi) / inv_mass[i])


@wp.kernel
def _nhc_half_step(
    ke: wp.array(dtype=Any),
    xi: wp.array2d(dtype=Any),
    vxi: wp.array2d(dtype=Any),
    temperature: wp.array(dtype=Any),
    tau: wp.array(dtype=Any),
    nf: wp.array(dtype=Any),
    dt: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
    weights: wp.array(dtype=Any),
    chain_steps: wp.int32,
    kb: Any,
    scale: wp.array(dtype=Any),
):
    # One thread per system: the chain over dt/2 (see nose_hoover.nhc_half_step, the same scheme).
    b = wp.tid()
    if active[b] == type(kb)(0.0):
        scale[b] = type(kb)(1.0)
        return
    scale[b] = chain_walk(b, ke[b], xi, vxi, kb * temperature[b], tau[b], nf[b], dt[b], weights, chain_steps)


@wp.kernel
def _scale_kick_drift(
    x: wp.array(dtype=Any),
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    scale: wp.array(dtype=Any),
    dt: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
):
    # The thermostat's velocity scaling, then velocity Verlet's first half.
    i = wp.tid()
    b = system[i]
    if idle(active, b):
        return
    vi = half_kick(v[i] * scale[b], f[i], inv_mass[i], dt[b])
    v[i] = vi
    x[i] = x[i] + vi * dt[b]


@wp.kernel
def _kick_kinetic_energy(
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    dt: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
    ke: wp.array(dtype=Any),
):
    # Velocity Verlet's second half, summing the new kinetic energy per system.
    i = wp.tid()
    b = system[i]
    vi = kick_atom(v, f, inv_mass, dt, active, i, b)
    wp.atomic_add(ke, wp.int32(b), type(inv_mass[i])(0.5) * wp.dot(vi, vi) / inv_mass[i])


@wp.kernel
def _kick_kinetic_diag(
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    dt: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
    diag: wp.array(dtype=Any),
):
    # Velocity Verlet's second half; each atom's (m vx², m vy², m vz²) in eV, summed per system
    # by system_sums (no atomic add per atom onto one address).
    i = wp.tid()
    vi = kick_atom(v, f, inv_mass, dt, active, i, system[i])
    diag[i] = wp.cw_mul(vi, vi) / inv_mass[i]


@wp.kernel
def _csvr_factors(
    kd: wp.array(dtype=Any),
    system_id: wp.array(dtype=wp.int64),
    noise_step: wp.array(dtype=wp.int32),
    temperature: wp.array(dtype=Any),
    tau: wp.array(dtype=Any),
    nf: wp.array(dtype=Any),
    dt: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
    seed: wp.int32,
    kb: Any,
    heat: wp.array(dtype=Any),
    scale: wp.array(dtype=Any),
):
    # One thread per system: the stochastic velocity-rescaling factor over dt (csvr.py), from
    # draws keyed by (seed, system, its step count); the system's count then advances, and the
    # kinetic energy the thermostat took out is added to heat[b].
    b = wp.tid()
    scale[b] = type(kb)(1.0)
    if idle(active, b):
        return
    step = noise_step[b]
    noise_step[b] = step + 1
    n = nf[b]
    first = system_stream(seed, system_id[b], step, 0)
    r1 = type(kb)(wp.randn(first))
    chi2 = sum_of_squared_normals(system_stream(seed, system_id[b], step, 1), r1, n)
    ke = type(kb)(0.5) * (kd[b][0] + kd[b][1] + kd[b][2])
    c = wp.exp(-dt[b] / tau[b])
    alpha = rescaling_factor(ke, type(kb)(0.5) * n * kb * temperature[b], n, c, r1, chi2)
    heat[b] = heat[b] + ke * (type(kb)(1.0) - alpha * alpha)
    scale[b] = alpha


@wp.kernel
def scale_by_system(v: wp.array(dtype=Any), system: wp.array(dtype=wp.int64), scale: wp.array(dtype=Any)):
    i = wp.tid()
    v[i] = v[i] * scale[system[i]]


@wp.kernel
def _fire_powers(v: wp.array(dtype=Any), f: wp.array(dtype=Any), powers: wp.array(dtype=Any)):
    # Each atom's (F.v, v.v, F.F), summed per system by system_sums.
    i = wp.tid()
    vi = v[i]
    fi = f[i]
    powers[i] = type(vi)(wp.dot(fi, vi), wp.dot(vi, vi), wp.dot(fi, fi))


@wp.kernel
def _fire_system(
    sums: wp.array(dtype=Any),
    dt: wp.array(dtype=Any),
    alpha: wp.array(dtype=Any),
    positive_steps: wp.array(dtype=wp.int32),
    steps: wp.array(dtype=wp.int32),
    active: wp.array(dtype=Any),
    dt_max: wp.array(dtype=Any),
    dt_min: wp.array(dtype=Any),
    maxstep: wp.array(dtype=Any),
    delay: wp.array(dtype=Any),
    f_inc: wp.array(dtype=Any),
    f_dec: wp.array(dtype=Any),
    alpha_start: wp.array(dtype=Any),
    f_alpha: wp.array(dtype=Any),
    fire2: wp.int32,
    initial_delay: wp.int32,
    half_step_back: wp.int32,
    coeff: wp.array2d(dtype=Any),
):
    # One thread per system: FIRE's (fire2 = 0, as ASE) or FIRE 2.0's state update, and the step
    # coefficients v' = c0 v + c1 F + c2 F/m, dx = c3 v' + c4 v, cap c5 (see fire.py).
    b = wp.tid()
    zero = type(dt[b])(0.0)
    one = type(dt[b])(1.0)
    coeff[b, 5] = maxstep[b]
    if active[b] == zero:
        coeff[b, 0] = one
        coeff[b, 1] = zero
        coeff[b, 2] = zero
        coeff[b, 3] = zero
        coeff[b, 4] = zero
        return
    power = sums[b][0]
    vv = sums[b][1]
    ff = sums[b][2]
    a = alpha[b]
    h = dt[b]
    n = positive_steps[b]
    steer = zero
    if ff > zero:
        steer = a * wp.sqrt(vv / ff)
    new_h = h
    new_a = a
    new_n = wp.int32(0)
    c_v = zero
    c_f = zero
    c_kick = one
    c_old = zero
    if fire2 == 0:
        if n < 0:
            c_v = one  # first step: no power test yet (ASE)
        elif power > zero:
            c_v = one - a
            c_f = steer
            if type(zero)(n) > delay[b]:
                new_h = wp.min(h * f_inc[b], dt_max[b])
                new_a = a * f_alpha[b]
            new_n = n + 1
        else:
            new_h = h * f_dec[b]
            new_a = alpha_start[b]
    else:
        if power > zero:
            new_n = n + 1
            if type(zero)(new_n) > delay[b]:
                new_h = wp.min(h * f_inc[b], dt_max[b])
                new_a = a * f_alpha[b]
            c_v = one - a
            c_f = steer
            c_kick = one - a
        else:
            if initial_delay == 0 or type(zero)(steps[b] + 1) >= delay[b]:
                if h * f_dec[b] >= dt_min[b]:
                    new_h = h * f_dec[b]
                new_a = alpha_start[b]
    if fire2 != 0 and half_step_back != 0 and not (power > zero):
        c_old = -type(zero)(0.5) * new_h
    coeff[b, 0] = c_v
    coeff[b, 1] = c_f
    coeff[b, 2] = c_kick * new_h
    coeff[b, 3] = new_h
    coeff[b, 4] = c_old
    dt[b] = new_h
    alpha[b] = new_a
    positive_steps[b] = new_n
    steps[b] = steps[b] + 1


@wp.kernel
def _fire_atoms(
    x: wp.array(dtype=Any),
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    active: wp.array(dtype=Any),
    coeff: wp.array2d(dtype=Any),
    cap_per_atom: wp.int32,
    dx_out: wp.array(dtype=Any),
    dx_sq: wp.array(dtype=Any),
):
    # The per-atom FIRE update; with a per-atom cap it also moves the atom, else it stores the
    # displacement and sums its square per system for _fire_move.
    i = wp.tid()
    b = system[i]
    if idle(active, b):
        return
    vo = v[i]
    fi = f[i]
    vn = vo * coeff[b, 0] + fi * (coeff[b, 1] + coeff[b, 2] * inv_mass[i])
    v[i] = vn
    dx = vn * coeff[b, 3] + vo * coeff[b, 4]
    if cap_per_atom != 0:
        length = wp.length(dx)
        if length > coeff[b, 5]:
            dx = dx * (coeff[b, 5] / length)
        x[i] = x[i] + dx
    else:
        dx_out[i] = dx
        wp.atomic_add(dx_sq, wp.int32(b), wp.dot(dx, dx))


@wp.kernel
def _fire_move(
    x: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    active: wp.array(dtype=Any),
    coeff: wp.array2d(dtype=Any),
    dx: wp.array(dtype=Any),
    dx_sq: wp.array(dtype=Any),
):
    # Move by the stored displacement, scaled so the system's total is at most the cap (ASE).
    i = wp.tid()
    b = system[i]
    if idle(active, b):
        return
    length = wp.sqrt(dx_sq[b])
    d = dx[i]
    if length > coeff[b, 5]:
        d = d * (coeff[b, 5] / length)
    x[i] = x[i] + d


# ---------------------------------------------------------------------------------------------
# overloads: both precisions compiled together, once
# ---------------------------------------------------------------------------------------------

wp.init()
declare_overloads([
    _kick_drift, _kick, _langevin_baoa, _langevin_remove_com_drift, _langevin_kick_count, _kinetic_energy,
    _nhc_half_step, _scale_kick_drift, _kick_kinetic_energy, _kick_kinetic_diag, _csvr_factors, scale_by_system,
    _fire_powers, _fire_system, _fire_atoms, _fire_move,
])

# ---------------------------------------------------------------------------------------------
# launching
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# integrator steps
# ---------------------------------------------------------------------------------------------


def common(dyn: Integrator, batch: Batch) -> tuple[Any, ...]:
    """Atom data the atom kernels read: positions, velocities, forces, 1/m, system of each atom,
    per-system dt and active flags."""
    return (
        batch.positions,
        batch.velocities,
        batch.forces,
        dyn.cached("warp_inv_mass", batch, lambda: dyn.inv_mass.view(-1), reads_fields=False, masks=False),
        batch.batch_idx,
        dyn.per_system("dt", batch),
        active_flags(dyn, batch),
    )


def active_flags(dyn: Integrator, batch: Batch) -> torch.Tensor:
    """``[B]`` 1.0 for systems this stage integrates now, 0.0 for the others (kernels skip those)."""
    active = dyn.active(batch)
    if active is not None:
        return active
    dtype = batch.positions.dtype
    return dyn.cached(
        "warp_all_active", batch, lambda: torch.ones(batch.num_graphs, dtype=dtype, device=batch.device),
        reads_fields=False, masks=False,
    )


def typed(value: float, batch: Batch) -> tuple[float, torch.dtype]:
    """``value`` as a Warp scalar of the batch's precision (for :class:`~.kernel_funcs.Launches`)."""
    return (float(value), batch.positions.dtype)


def largest_system(dyn: Any, batch: Batch) -> int:
    """The most atoms of one system of ``batch`` (host data, kept while its systems last)."""
    return dyn.cached("largest_system", batch, lambda: int(batch.num_nodes_per_system.max(initial=0)),
                      reads_fields=False, masks=False)


def verlet_pre(dyn: Integrator, batch: Batch) -> None:
    x, v, f, im, sys, dt, act = common(dyn, batch)
    launches_of(dyn).launch("kick_drift", _kick_drift, batch.num_nodes, (x, v, f, im, sys, dt, act), batch.device)


def verlet_post(dyn: Integrator, batch: Batch) -> None:
    _, v, f, im, sys, dt, act = common(dyn, batch)
    launches_of(dyn).launch("kick", _kick, batch.num_nodes, (v, f, im, sys, dt, act), batch.device)


def langevin_pre(dyn: Any, batch: Batch) -> None:
    x, v, f, im, sys, dt, act = common(dyn, batch)
    mass, total = dyn.cached(
        "warp_mass", batch, lambda: tuple(t.view(-1) for t in masses_and_totals(batch, dyn.inv_mass)),
        reads_fields=False, masks=False,
    )
    launches = launches_of(dyn)
    seed = int(dyn.random_seed % (2**31 - 1))
    friction, temperature = dyn.per_system("friction", batch), dyn.per_system("temperature", batch)
    noise_step = getattr(batch, dyn.noise_field)
    momentum = dyn.work.get("momentum", batch.num_graphs, batch.system_capacity, (3,), v.dtype, v.device)
    # Each atom's noise momentum, when the centre of mass is held (else never written).
    kicks = (dyn.work.get("kicks", batch.num_nodes, batch.node_capacity, (3,), v.dtype, v.device)
             if dyn.fix_com else momentum)
    args = (
        x, v, f, im, mass, sys, batch.batch_ptr, batch.system_id, noise_step, dt, friction, temperature, act,
        typed(KB, batch), seed, int(dyn.fix_com), kicks,
    )
    launches.launch("baoa", _langevin_baoa, batch.num_nodes, args, batch.device)
    if dyn.fix_com:
        momentum.zero_()
        system_sums(launches, dyn.work, "momentum", kicks, sys, momentum, largest_system(dyn, batch))
        launches.launch(
            "com", _langevin_remove_com_drift, batch.num_nodes, (x, v, sys, momentum, total, dt, act),
            batch.device,
        )


def langevin_post(dyn: Any, batch: Batch) -> None:
    _, v, f, im, sys, dt, act = common(dyn, batch)
    args = (v, f, im, sys, batch.batch_ptr, getattr(batch, dyn.noise_field), dt, act)
    launches_of(dyn).launch("kick_count", _langevin_kick_count, batch.num_nodes, args, batch.device)


def _chain(dyn: Any, batch: Batch, ke: torch.Tensor) -> torch.Tensor:
    positions_field, velocities_field = dyn.chain_fields
    nf = dyn.cached("nhc_dof", batch, lambda: degrees_of_freedom(batch), reads_fields=False)
    return chain_half_step(dyn, batch, "nhc", ke, getattr(batch, positions_field), getattr(batch, velocities_field),
                           dyn.per_system("tau", batch), nf, dyn.yoshida_weights())


def chain_half_step(
    dyn: Any, batch: Batch, name: str, ke: torch.Tensor, xi: torch.Tensor, vxi: torch.Tensor, tau: torch.Tensor,
    nf: torch.Tensor, weights: tuple[float, ...],
) -> torch.Tensor:
    """One Nose-Hoover chain per system over dt/2, one Warp thread each: ``xi``, ``vxi`` ``[B, M]``
    advance in place and the ``[B]`` velocity scales come back (the scheme of
    ``nose_hoover.nhc_half_step``, masses ``Q_1 = nf kB T tau²``, ``Q_j = kB T tau²``).

    ``name`` keeps the launches and the scale buffer of several chains of one integrator apart.
    """
    dtype = batch.positions.dtype
    w = dyn.cached(f"{name}_weights", batch, lambda: torch.tensor(weights, dtype=dtype, device=batch.device),
                   reads_fields=False, masks=False)
    scale = dyn.work.get(f"{name}_scale", batch.num_graphs, batch.system_capacity, (), dtype, batch.device)
    args = (
        ke, xi, vxi, dyn.per_system("temperature", batch), tau, nf, dyn.per_system("dt", batch), active_flags(dyn, batch),
        w, dyn.chain_steps, typed(KB, batch), scale,
    )
    launches_of(dyn).launch(name, _nhc_half_step, batch.num_graphs, args, batch.device)
    return scale


def nose_hoover_pre(dyn: Any, batch: Batch) -> None:
    x, v, f, im, sys, dt, act = common(dyn, batch)
    launches = launches_of(dyn)
    ke = dyn.work.get("nhc_ke", batch.num_graphs, batch.system_capacity, (), v.dtype, v.device)
    ke.zero_()
    launches.launch("ke", _kinetic_energy, batch.num_nodes, (v, im, sys, ke), batch.device)
    scale = _chain(dyn, batch, ke)
    args = (x, v, f, im, sys, scale, dt, act)
    launches.launch("scale_kick_drift", _scale_kick_drift, batch.num_nodes, args, batch.device)


def nose_hoover_post(dyn: Any, batch: Batch) -> None:
    _, v, f, im, sys, dt, act = common(dyn, batch)
    launches = launches_of(dyn)
    ke = dyn.work.get("nhc_ke", batch.num_graphs, batch.system_capacity, (), v.dtype, v.device)
    ke.zero_()
    launches.launch("kick_ke", _kick_kinetic_energy, batch.num_nodes, (v, f, im, sys, dt, act, ke), batch.device)
    scale = _chain(dyn, batch, ke)
    launches.launch("scale", scale_by_system, batch.num_nodes, (v, sys, scale), batch.device)


def csvr_post(dyn: Any, batch: Batch) -> None:
    """CSVR's update after the forces: the half-kick, then each system's rescaling (csvr.py)."""
    _, v, f, im, sys, dt, act = common(dyn, batch)
    launches = launches_of(dyn)
    dtype, dev = v.dtype, v.device
    diag = dyn.work.get("csvr_diag", batch.num_nodes, batch.node_capacity, (3,), dtype, dev)
    launches.launch("kick_diag", _kick_kinetic_diag, batch.num_nodes, (v, f, im, sys, dt, act, diag), batch.device)
    kd = dyn.work.get("csvr_kd", batch.num_graphs, batch.system_capacity, (3,), dtype, dev)
    kd.zero_()
    system_sums(launches, dyn.work, "csvr_kd", diag, sys, kd, largest_system(dyn, batch))
    scale = dyn.work.get("csvr_scale", batch.num_graphs, batch.system_capacity, (), dtype, dev)
    nf = dyn.cached("csvr_dof", batch, lambda: degrees_of_freedom(batch), reads_fields=False)
    args = (kd, batch.system_id, getattr(batch, dyn.noise_field), dyn.per_system("temperature", batch),
            dyn.per_system("tau", batch), nf, dt, act, warp_seed(dyn.random_seed), typed(KB, batch),
            getattr(batch, dyn.heat_field), scale)
    launches.launch("factors", _csvr_factors, batch.num_graphs, args, batch.device)
    launches.launch("scale", scale_by_system, batch.num_nodes, (v, sys, scale), batch.device)


def fire_pre(dyn: Any, batch: Batch, rows: Any = None) -> None:
    """FIRE's whole step over the atoms, or over a cell filter's ``rows``
    (:class:`~alchemi_integrators.fire.FilterRows`: the atoms, then three cell rows per system)."""
    x, v, f, im, sys, _, act = common(dyn, batch)
    launches = launches_of(dyn)
    dtype, dev = v.dtype, v.device
    sums = dyn.work.get("fire_sums", batch.num_graphs, batch.system_capacity, (3,), dtype, dev)
    sums.zero_()
    largest = largest_system(dyn, batch)
    if rows is None:
        n, capacity = batch.num_nodes, batch.node_capacity
        powers = dyn.work.get("fire_powers", n, capacity, (3,), dtype, dev)
        launches.launch("powers", _fire_powers, n, (v, f, powers), batch.device)
        system_sums(launches, dyn.work, "fire_powers", powers, sys, sums, largest)
    else:
        x, v, f, im, sys = rows.x, rows.v, rows.f, rows.inv_mass, rows.system
        n = capacity = int(x.shape[0])
        launches.launch("powers", _fire_powers, n, (v, f, rows.powers), batch.device)
        system_sums(launches, dyn.work, "fire_powers", rows.atom_powers, batch.batch_idx, sums, largest)
        system_sums(launches, dyn.work, "fire_cell_powers", rows.cell_powers, rows.cell_system, sums, 3)
    fire2 = bool(dyn.uses_fire2)
    per = dyn.per_system
    delay = per("n_delay" if fire2 else "n_min", batch)
    dt_min = per("dt_min", batch) if fire2 else delay  # unused by FIRE
    coeff = dyn.work.get("fire_sys", batch.num_graphs, batch.system_capacity, (6,), dtype, dev)
    state = dyn._state(batch)
    args = (
        sums, *state, act, per("dt_max", batch), dt_min, per("maxstep", batch), delay, per("f_inc", batch),
        per("f_dec", batch), per("alpha_start", batch), per("f_alpha", batch), int(fire2),
        int(getattr(dyn, "initial_delay", False)), int(getattr(dyn, "half_step_back", False)), coeff,
    )
    launches.launch("fire_system", _fire_system, batch.num_graphs, args, batch.device)
    per_atom = dyn.maxstep_scope == "atom"
    dx = dyn.work.get("fire_dx", n, capacity, (3,), dtype, dev)
    dx_sq = dyn.work.get("fire_dx_sq", batch.num_graphs, batch.system_capacity, (), dtype, dev)
    if not per_atom:
        dx_sq.zero_()
    args = (x, v, f, im, sys, act, coeff, int(per_atom), dx, dx_sq)
    launches.launch("fire_atoms", _fire_atoms, n, args, batch.device)
    if not per_atom:
        launches.launch("fire_move", _fire_move, n, (x, sys, act, coeff, dx, dx_sq), batch.device)


# ---------------------------------------------------------------------------------------------
# counter-based draws (capturable in a CUDA graph, unlike a torch.Generator's draws)
# ---------------------------------------------------------------------------------------------


@wp.kernel
def _advance_counter(counter: wp.array(dtype=wp.int32)):
    counter[0] = counter[0] + 1


def warp_seed(seed: int) -> int:
    """``seed`` as the non-negative int32 that keys Warp's counter-based draws."""
    return int(seed) & 0x7FFFFFFF


def advance_counter(launches: RecordedLaunches, name: str, counter: torch.Tensor) -> None:
    """Add one to the device draw counter ``counter`` (int32 ``[1]``) on the device: a captured
    step's replays each draw the next numbers."""
    launches.launch(f"{name}:advance", _advance_counter, 1, (counter,), counter.device)

