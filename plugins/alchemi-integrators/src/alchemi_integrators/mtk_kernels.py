"""MTK's NPT step as Warp kernels (``integrator:npt-mtk``, and ``integrator:nph`` without its chains).

Specialised kernels: the step as generic torch operations is about two hundred small operations
(3x3 exponentials of every system's strain rate as batched matrix products, the kinetic tensor as
an ``index_add_`` of per-atom outer products, one address per system and component, so the atoms
of a large system queue on it, and each atom's rows times its system's matrix through a per-atom
copy of the matrix). Here a step is two kernels per system and four per atom:

* before the forces: each atom's share of the kinetic tensor ``sum_i m_i v_i v_i^T`` (two vec3
  per atom: the diagonal and ``xy, xz, yz``), summed per system by
  :func:`~alchemi_integrators.system_sums.system_sums`; one thread per system then walks both
  Nose-Hoover chains, kicks the strain rate, builds the four 3x3 maps of the step (the velocity
  kick ``exp(-B h)``, ``h phi1(-B h)``, the drift ``exp(g dt)``, ``dt phi1(g dt)``) and moves the
  cell; one thread per atom kicks and drifts it.
* after the forces: one thread per system builds the kick maps of the new strain rate, one per
  atom kicks and writes its kinetic-tensor share, the sums, one per system kicks the strain rate
  and walks the chains, and one per atom scales the velocities by the particle chain.

With ``thermostatted`` off (``integrator:nph``) the system kernel leaves both chains alone.

The arithmetic is the test oracle's, in the same order (:mod:`~alchemi_integrators.npt_common`),
so both agree to rounding. Systems another stage integrates are left untouched. Nothing
is read back and every buffer lives in the integrator's workspace, so a step replays in a CUDA
graph, and a CPU replays recorded launches.

Example:
    >>> from alchemi_core import registry
    >>> npt = registry.build("integrator:npt-mtk", model=model, dt=5.0, temperature=50.0)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import warp as wp

from alchemi_core.units import KB
from alchemi_integrators.kernel_funcs import chain_walk, declare_overloads, idle, launches_of
from alchemi_integrators.npt_common import (
    BAROSTAT_CHAIN_POSITIONS,
    BAROSTAT_CHAIN_VELOCITIES,
    CELL_STRAIN_RATE,
    THERMOSTAT_POSITIONS,
    THERMOSTAT_VELOCITIES,
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
    phi1_3,
    scale_buffer,
    trace3,
    volume3,
)
from alchemi_integrators.warp_kernels import active_flags, common, scale_by_system, typed

if TYPE_CHECKING:
    from alchemi_core.data import Batch

# ---------------------------------------------------------------------------------------------
# one system's functions
# ---------------------------------------------------------------------------------------------


@wp.func
def _kick_cell(g: Any, k: Any, cell: Any, stress: Any, p_ext: Any, nf: Any, mass: Any, h: Any, anisotropic: wp.int32):
    # g += h G / W, G = V (k / V - sigma - p I) + (tr k / N_f) I, projected on symmetric or
    # isotropic strains (the test oracle's _kick_cell).
    eye = eye3(g)
    volume = volume3(cell)
    force = (k / volume - stress - eye * p_ext) * volume + eye * (trace3(k) / nf)
    if anisotropic != 0:
        force = (force + wp.transpose(force)) * type(h)(0.5)
    else:
        force = eye * (trace3(force) / type(h)(3.0))
    return g + force * (h / mass)


@wp.func
def _kick_maps(g: Any, nf: Any, h: Any):
    # v <- v exp(-B h) + (F/m) h phi1(-B h), B = g + tr(g)/N_f I (the test oracle's _kick_atoms).
    damp = -(g + eye3(g) * (trace3(g) / nf)) * h
    return expm3(damp), phi1_3(damp) * h


@wp.func
def _kicked(v: Any, f: Any, inv_mass: Any, kick: Any, push: Any):
    # v kick + (F/m) push: a row times its system's maps.
    return wp.mul(v, kick) + wp.mul(f * inv_mass, push)


@wp.func
def _barostat_mass(nf: Any, kt: Any, tau_p: Any):
    return (nf + type(kt)(3.0)) * kt * tau_p * tau_p / type(kt)(3.0)


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------


@wp.kernel
def _system_update(
    kd: wp.array(dtype=Any),
    ko: wp.array(dtype=Any),
    g: wp.array(dtype=Any),
    cell: wp.array(dtype=Any),
    stress: wp.array(dtype=Any),
    xi: wp.array2d(dtype=Any),
    vxi: wp.array2d(dtype=Any),
    bxi: wp.array2d(dtype=Any),
    bvxi: wp.array2d(dtype=Any),
    temperature: wp.array(dtype=Any),
    pressure: wp.array(dtype=Any),
    tau_t: wp.array(dtype=Any),
    tau_p: wp.array(dtype=Any),
    nf: wp.array(dtype=Any),
    dt: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
    weights: wp.array(dtype=Any),
    chain_steps: wp.int32,
    cell_dof: Any,
    kb: Any,
    anisotropic: wp.int32,
    thermostat: wp.int32,
    before_forces: wp.int32,
    kick: wp.array(dtype=Any),
    push: wp.array(dtype=Any),
    grow: wp.array(dtype=Any),
    carry: wp.array(dtype=Any),
    scale: wp.array(dtype=Any),
):
    # One system's part of a step, from its kinetic tensor (kd, ko). Before the forces
    # (NPTMTK.torch_pre_update): both chains over dt/2, the strain-rate kick, the atoms' kick and
    # drift maps, the cell's drift. After the atoms' second kick (torch_post_update): the
    # strain-rate kick, both chains; scale[b] is the particle chain's factor for the velocities.
    b = wp.tid()
    gb = g[b]
    eye = eye3(gb)
    if idle(active, b):
        if before_forces != 0:
            kick[b] = eye
            push[b] = eye * type(kb)(0.0)
            grow[b] = eye
            carry[b] = eye * type(kb)(0.0)
        else:
            scale[b] = type(kb)(1.0)
        return
    half = type(kb)(0.5)
    h = half * dt[b]
    kt = kb * temperature[b]
    mass = _barostat_mass(nf[b], kt, tau_p[b])
    k = kinetic_tensor(kd[b], ko[b], gb)
    if before_forces == 0:
        gb = _kick_cell(gb, k, cell[b], stress[b], pressure[b], nf[b], mass, h, anisotropic)
    s_cell = type(kb)(1.0)
    s_atoms = type(kb)(1.0)
    if thermostat != 0:  # NPH (thermostat = 0): no chain moves, H = KE + E + pV + W |g|² / 2 is conserved
        s_cell = chain_walk(b, half * mass * wp.ddot(gb, gb), bxi, bvxi, kt, tau_p[b], cell_dof, dt[b], weights,
                            chain_steps)
        s_atoms = chain_walk(b, half * trace3(k), xi, vxi, kt, tau_t[b], nf[b], dt[b], weights, chain_steps)
    gb = gb * s_cell
    if before_forces == 0:
        g[b] = gb
        scale[b] = s_atoms
        return
    gb = _kick_cell(gb, k * (s_atoms * s_atoms), cell[b], stress[b], pressure[b], nf[b], mass, h, anisotropic)
    g[b] = gb
    e, p = _kick_maps(gb, nf[b], h)
    kick[b] = e * s_atoms  # the chain's scaling of v, folded into the kick
    push[b] = p
    strain = gb * dt[b]
    e_drift = expm3(strain)
    grow[b] = e_drift
    carry[b] = phi1_3(strain) * dt[b]
    cell[b] = matmul3(cell[b], e_drift)


@wp.kernel
def _pre_atoms(
    x: wp.array(dtype=Any),
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    active: wp.array(dtype=Any),
    kick: wp.array(dtype=Any),
    push: wp.array(dtype=Any),
    grow: wp.array(dtype=Any),
    carry: wp.array(dtype=Any),
):
    # v <- v kick + (F/m) push; x <- x grow + v carry (rows times their system's maps).
    i = wp.tid()
    b = system[i]
    if idle(active, b):
        return
    vi = _kicked(v[i], f[i], inv_mass[i], kick[b], push[b])
    v[i] = vi
    x[i] = wp.mul(x[i], grow[b]) + wp.mul(vi, carry[b])


@wp.kernel
def _kick_system(
    g: wp.array(dtype=Any),
    nf: wp.array(dtype=Any),
    dt: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
    kick: wp.array(dtype=Any),
    push: wp.array(dtype=Any),
):
    # The kick maps of the strain rate the forces were computed under (after the forces).
    b = wp.tid()
    if idle(active, b):
        return
    e, p = _kick_maps(g[b], nf[b], type(nf[b])(0.5) * dt[b])
    kick[b] = e
    push[b] = p


@wp.kernel
def _kick_parts(
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    active: wp.array(dtype=Any),
    kick: wp.array(dtype=Any),
    push: wp.array(dtype=Any),
    diag: wp.array(dtype=Any),
    off: wp.array(dtype=Any),
):
    # The atoms' second kick, and their shares of the new kinetic tensor.
    i = wp.tid()
    b = system[i]
    vi = v[i]
    if not idle(active, b):
        vi = _kicked(vi, f[i], inv_mass[i], kick[b], push[b])
        v[i] = vi
    d, o = kinetic_share(vi, inv_mass[i])
    diag[i] = d
    off[i] = o


declare_overloads([_system_update, _pre_atoms, _kick_system, _kick_parts],)


# ---------------------------------------------------------------------------------------------
# the step
# ---------------------------------------------------------------------------------------------


def _system_args(dyn: Any, batch: Batch, kd: torch.Tensor, ko: torch.Tensor, cell: torch.Tensor) -> tuple[Any, ...]:
    per = dyn.per_system
    dtype = batch.positions.dtype
    weights = dyn.cached("npt_weights", batch,
                         lambda: torch.tensor(dyn.yoshida_weights(), dtype=dtype, device=batch.device),
                         reads_fields=False, masks=False)
    return (
        kd, ko, getattr(batch, CELL_STRAIN_RATE), cell, in_dtype(dyn, batch, "stress"),
        getattr(batch, THERMOSTAT_POSITIONS), getattr(batch, THERMOSTAT_VELOCITIES),
        getattr(batch, BAROSTAT_CHAIN_POSITIONS), getattr(batch, BAROSTAT_CHAIN_VELOCITIES),
        per("temperature", batch), per("pressure", batch), per("tau_t", batch), per("tau_p", batch),
        dyn.system_dof(batch), per("dt", batch), active_flags(dyn, batch), weights, dyn.chain_steps,
        typed(dyn.cell_dof, batch), typed(KB, batch), int(dyn.anisotropic), int(dyn.thermostatted),
    )


def mtk_pre(dyn: Any, batch: Batch) -> None:
    """``NPTMTK``'s update before the forces (see the module docstring)."""
    launches = launches_of(dyn)
    _, v, f, inv_mass, system, _, active = common(dyn, batch)
    diag, off = parts(dyn, batch)
    launches.launch("parts", kinetic_parts, batch.num_nodes, (v, inv_mass, diag, off), batch.device)
    kd, ko = kinetic_sums(dyn, batch, diag, off)
    cell = in_dtype(dyn, batch, "cell")
    kick, push, grow, carry = maps(dyn, batch, ("kick", "push", "grow", "carry"))
    args = (*_system_args(dyn, batch, kd, ko, cell), 1, kick, push, grow, carry, scale_buffer(dyn, batch))
    launches.launch("pre_system", _system_update, batch.num_graphs, args, batch.device)
    if cell is not batch.cell:
        batch.cell.copy_(cell)
    args = (batch.positions, v, f, inv_mass, system, active, kick, push, grow, carry)
    launches.launch("pre_atoms", _pre_atoms, batch.num_nodes, args, batch.device)


def mtk_post(dyn: Any, batch: Batch) -> None:
    """``NPTMTK``'s update after the forces (see the module docstring)."""
    launches = launches_of(dyn)
    _, v, f, inv_mass, system, _, active = common(dyn, batch)
    kick, push, grow, carry = maps(dyn, batch, ("kick", "push", "grow", "carry"))
    g = getattr(batch, CELL_STRAIN_RATE)
    args = (g, dyn.system_dof(batch), dyn.per_system("dt", batch), active, kick, push)
    launches.launch("kick_system", _kick_system, batch.num_graphs, args, batch.device)
    diag, off = parts(dyn, batch)
    args = (v, f, inv_mass, system, active, kick, push, diag, off)
    launches.launch("kick_parts", _kick_parts, batch.num_nodes, args, batch.device)
    kd, ko = kinetic_sums(dyn, batch, diag, off)
    scale = scale_buffer(dyn, batch)
    args = (*_system_args(dyn, batch, kd, ko, in_dtype(dyn, batch, "cell")), 0, kick, push, grow, carry, scale)
    launches.launch("post_system", _system_update, batch.num_graphs, args, batch.device)
    # The velocity scaling of Nose-Hoover NVT's second half (warp_kernels' kernel).
    launches.launch("scale", scale_by_system, batch.num_nodes, (v, system, scale), batch.device)
