"""MTK's NPT step as Warp kernels (``integrator:npt-mtk``, ``backend="warp"``).

The torch path of :class:`~alchemi_integrators.npt.NPTMTK` is about two hundred small operations
a step: 3x3 exponentials of every system's strain rate as batched matrix products, the kinetic
tensor as an ``index_add_`` of per-atom outer products (one address per system and component, so
the atoms of a large system queue on it), and each atom's rows times its system's matrix through
a per-atom copy of the matrix. Here a step is two kernels per system and four per atom:

* before the forces: each atom's share of the kinetic tensor ``sum_i m_i v_i v_i^T`` (two vec3
  per atom: the diagonal and ``xy, xz, yz``), summed per system by
  :func:`~alchemi_integrators.system_sums.system_sums`; one thread per system then walks both
  Nose-Hoover chains, kicks the strain rate, builds the four 3x3 maps of the step (the velocity
  kick ``exp(-B h)``, ``h phi1(-B h)``, the drift ``exp(g dt)``, ``dt phi1(g dt)``) and moves the
  cell; one thread per atom kicks and drifts it.
* after the forces: one thread per system builds the kick maps of the new strain rate, one per
  atom kicks and writes its kinetic-tensor share, the sums, one per system kicks the strain rate
  and walks the chains, and one per atom scales the velocities by the particle chain.

The arithmetic is the torch path's, in the same order (exponentials by two squarings of an
eighth-order Taylor polynomial, ``phi1`` to tenth order: :mod:`~alchemi_integrators.cell_math`),
so both backends agree to rounding. Systems another stage integrates are left untouched. Nothing
is read back and every buffer lives in the integrator's workspace, so a step replays in a CUDA
graph, and a CPU replays recorded launches.

Example:
    >>> from alchemi_core import registry
    >>> npt = registry.build("integrator:npt-mtk", model=model, dt=5.0, temperature=50.0,
    ...                      backend="warp")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import warp as wp

from alchemi_core.units import KB
from alchemi_core.warp_runtime import RecordedLaunches, warp
from alchemi_integrators.kernel_funcs import VECTOR_ARGS, chain_walk, declare_overloads, idle
from alchemi_integrators.system_sums import VECTOR_ARGS as SUM_VECTOR_ARGS
from alchemi_integrators.system_sums import system_sums

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Kernel arguments that take ``[B, 3, 3]`` tensors as mat33 arrays.
MATRIX_ARGS = frozenset({"g", "cell", "stress", "kick", "push", "grow", "carry"})
#: Kernel arguments that take ``[N, 3]`` tensors as vec3 arrays.
VECTORS = VECTOR_ARGS | SUM_VECTOR_ARGS | frozenset({"diag", "off", "kd", "ko"})
#: Kernel arguments that take ``[B, M]`` tensors as 2-D arrays (the two chains).
ROWS_ARGS = frozenset({"xi", "vxi", "bxi", "bvxi"})


class NPTLaunches(RecordedLaunches):
    """Recorded launches whose ``[B, 3, 3]`` arguments (:data:`MATRIX_ARGS`) become mat33 arrays."""

    def __init__(self) -> None:
        super().__init__(vector_args=VECTORS)

    def _to_warp(self, label: str, value: Any) -> Any:
        if label in MATRIX_ARGS and isinstance(value, torch.Tensor):
            dtype = {torch.float32: wp.mat33f, torch.float64: wp.mat33d}[value.dtype]
            return warp().from_torch(value, dtype=dtype)
        return super()._to_warp(label, value)


# ---------------------------------------------------------------------------------------------
# 3x3 functions (cell_math's, for one matrix)
# ---------------------------------------------------------------------------------------------


@wp.func
def _eye(like: Any):
    one = type(like[0, 0])(1.0)
    zero = type(like[0, 0])(0.0)
    return type(like)(one, zero, zero, zero, one, zero, zero, zero, one)


@wp.func
def _matmul(a: Any, b: Any):
    # a b, written out: warp-lang 1.5's product of two float64 matrices rounds like float32.
    return type(a)(
        a[0, 0] * b[0, 0] + a[0, 1] * b[1, 0] + a[0, 2] * b[2, 0],
        a[0, 0] * b[0, 1] + a[0, 1] * b[1, 1] + a[0, 2] * b[2, 1],
        a[0, 0] * b[0, 2] + a[0, 1] * b[1, 2] + a[0, 2] * b[2, 2],
        a[1, 0] * b[0, 0] + a[1, 1] * b[1, 0] + a[1, 2] * b[2, 0],
        a[1, 0] * b[0, 1] + a[1, 1] * b[1, 1] + a[1, 2] * b[2, 1],
        a[1, 0] * b[0, 2] + a[1, 1] * b[1, 2] + a[1, 2] * b[2, 2],
        a[2, 0] * b[0, 0] + a[2, 1] * b[1, 0] + a[2, 2] * b[2, 0],
        a[2, 0] * b[0, 1] + a[2, 1] * b[1, 1] + a[2, 2] * b[2, 1],
        a[2, 0] * b[0, 2] + a[2, 1] * b[1, 2] + a[2, 2] * b[2, 2],
    )


@wp.func
def _expm(a: Any):
    # cell_math.expm(a, squarings=2, order=8): I + x (I + x/2 (... (I + x/8))), x = a / 4, squared twice.
    eye = _eye(a)
    x = a / type(a[0, 0])(4.0)
    k = type(a[0, 0])(8.0)
    out = eye + x / k
    for _ in range(7):
        k = k - type(k)(1.0)
        out = eye + _matmul(x, out) / k
    out = _matmul(out, out)
    return _matmul(out, out)


@wp.func
def _phi1(x: Any):
    # cell_math.phi1(x, order=10): sum_k x^k / (k + 1)!, by Horner from k = 10.
    eye = _eye(x)
    k = type(x[0, 0])(1.0)
    fact = k
    for _ in range(10):
        k = k + type(k)(1.0)
        fact = fact * k
    out = eye / fact  # 11!
    for _ in range(10):
        fact = fact / k  # 10!, 9!, ..., 1!
        k = k - type(k)(1.0)
        out = eye / fact + _matmul(x, out)
    return out


@wp.func
def _trace(a: Any):
    return a[0, 0] + a[1, 1] + a[2, 2]


@wp.func
def _volume(cell: Any):
    # |det| as the triple product of the rows (cell_math.det3).
    return wp.abs(wp.dot(cell[0], wp.cross(cell[1], cell[2])))


@wp.func
def _kinetic_tensor(diag: Any, off: Any, like: Any):
    # sum m v v^T from its diagonal and its (xy, xz, yz) entries.
    return type(like)(diag[0], off[0], off[1], off[0], diag[1], off[2], off[1], off[2], diag[2])


@wp.func
def _kick_cell(g: Any, k: Any, cell: Any, stress: Any, p_ext: Any, nf: Any, mass: Any, h: Any, anisotropic: wp.int32):
    # g += h G / W, G = V (k / V - sigma - p I) + (tr k / N_f) I, projected on symmetric or
    # isotropic strains (NPTMTK._kick_cell).
    eye = _eye(g)
    volume = _volume(cell)
    force = (k / volume - stress - eye * p_ext) * volume + eye * (_trace(k) / nf)
    if anisotropic != 0:
        force = (force + wp.transpose(force)) * type(h)(0.5)
    else:
        force = eye * (_trace(force) / type(h)(3.0))
    return g + force * (h / mass)


@wp.func
def _kick_maps(g: Any, nf: Any, h: Any):
    # v <- v exp(-B h) + (F/m) h phi1(-B h), B = g + tr(g)/N_f I (NPTMTK._kick_atoms).
    damp = -(g + _eye(g) * (_trace(g) / nf)) * h
    return _expm(damp), _phi1(damp) * h


@wp.func
def _kicked(v: Any, f: Any, inv_mass: Any, kick: Any, push: Any):
    # v kick + (F/m) push: a row times its system's maps.
    return wp.mul(v, kick) + wp.mul(f * inv_mass, push)


@wp.func
def _share(vi: Any, inv_mass: Any):
    # An atom's m v v^T: its diagonal and (xy, xz, yz) (m / ACCELERATION = 1 / inv_mass, in eV).
    mv = vi / inv_mass
    return type(vi)(mv[0] * vi[0], mv[1] * vi[1], mv[2] * vi[2]), type(vi)(mv[0] * vi[1], mv[0] * vi[2], mv[1] * vi[2])


@wp.func
def _barostat_mass(nf: Any, kt: Any, tau_p: Any):
    return (nf + type(kt)(3.0)) * kt * tau_p * tau_p / type(kt)(3.0)


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------


@wp.kernel
def _kinetic_parts(v: wp.array(dtype=Any), inv_mass: wp.array(dtype=Any), diag: wp.array(dtype=Any),
                   off: wp.array(dtype=Any)):
    i = wp.tid()
    d, o = _share(v[i], inv_mass[i])
    diag[i] = d
    off[i] = o


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
    eye = _eye(gb)
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
    k = _kinetic_tensor(kd[b], ko[b], gb)
    if before_forces == 0:
        gb = _kick_cell(gb, k, cell[b], stress[b], pressure[b], nf[b], mass, h, anisotropic)
    s_cell = chain_walk(b, half * mass * wp.ddot(gb, gb), bxi, bvxi, kt, tau_p[b], cell_dof, dt[b], weights,
                        chain_steps)
    s_atoms = chain_walk(b, half * _trace(k), xi, vxi, kt, tau_t[b], nf[b], dt[b], weights, chain_steps)
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
    e_drift = _expm(strain)
    grow[b] = e_drift
    carry[b] = _phi1(strain) * dt[b]
    cell[b] = _matmul(cell[b], e_drift)


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
    d, o = _share(vi, inv_mass[i])
    diag[i] = d
    off[i] = o


@wp.kernel
def _scale_velocities(v: wp.array(dtype=Any), system: wp.array(dtype=wp.int64), scale: wp.array(dtype=Any)):
    i = wp.tid()
    v[i] = v[i] * scale[system[i]]


declare_overloads([_kinetic_parts, _system_update, _pre_atoms, _kick_system, _kick_parts, _scale_velocities],
                  vectors=VECTORS, rows=ROWS_ARGS, matrices=MATRIX_ARGS)


# ---------------------------------------------------------------------------------------------
# the step
# ---------------------------------------------------------------------------------------------


def _launches(dyn: Any) -> NPTLaunches:
    launches = getattr(dyn, "_npt_launches", None)
    if launches is None:
        launches = dyn._npt_launches = NPTLaunches()
    return launches


def _in_dtype(dyn: Any, batch: Batch, name: str) -> torch.Tensor:
    """Field ``name`` (``cell`` or ``stress``) in the positions' dtype: the field itself, or a
    workspace copy where the model or the data gave it another precision."""
    field = getattr(batch, name)
    dtype = batch.positions.dtype
    if field.dtype == dtype:
        return field
    copy = dyn.work.get(f"npt_{name}", batch.num_graphs, batch.system_capacity, (3, 3), dtype, batch.device)
    return copy.copy_(field)


def _kinetic_sums(dyn: Any, batch: Batch, diag: torch.Tensor, off: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, 3]`` sums of the atoms' kinetic-tensor shares: diagonal and off-diagonal."""
    from alchemi_integrators.warp_kernels import _largest_system

    work, dtype, device = dyn.work, diag.dtype, diag.device
    kd = work.get("npt_kd", batch.num_graphs, batch.system_capacity, (3,), dtype, device)
    ko = work.get("npt_ko", batch.num_graphs, batch.system_capacity, (3,), dtype, device)
    kd.zero_()
    ko.zero_()
    largest = _largest_system(dyn, batch)
    system_sums(_launches(dyn), work, "npt_kd", diag, batch.batch_idx, kd, largest)
    system_sums(_launches(dyn), work, "npt_ko", off, batch.batch_idx, ko, largest)
    return kd, ko


def _parts(dyn: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    v = batch.velocities
    diag = dyn.work.get("npt_diag", batch.num_nodes, batch.node_capacity, (3,), v.dtype, v.device)
    off = dyn.work.get("npt_off", batch.num_nodes, batch.node_capacity, (3,), v.dtype, v.device)
    return diag, off


def _maps(dyn: Any, batch: Batch, names: tuple[str, ...]) -> list[torch.Tensor]:
    dtype = batch.positions.dtype
    return [dyn.work.get(f"npt_{n}", batch.num_graphs, batch.system_capacity, (3, 3), dtype, batch.device)
            for n in names]


def _scale(dyn: Any, batch: Batch) -> torch.Tensor:
    dtype = batch.positions.dtype
    return dyn.work.get("npt_scale", batch.num_graphs, batch.system_capacity, (), dtype, batch.device)


def _system_args(dyn: Any, batch: Batch, kd: torch.Tensor, ko: torch.Tensor, cell: torch.Tensor) -> tuple[Any, ...]:
    from alchemi_integrators import npt
    from alchemi_integrators.warp_kernels import _active, _typed

    per = dyn.per_system
    dtype = batch.positions.dtype
    weights = dyn.cached("npt_weights", batch,
                         lambda: torch.tensor(dyn.yoshida_weights(), dtype=dtype, device=batch.device),
                         reads_fields=False, masks=False)
    return (
        kd, ko, getattr(batch, npt.CELL_STRAIN_RATE), cell, _in_dtype(dyn, batch, "stress"),
        getattr(batch, npt.THERMOSTAT_POSITIONS), getattr(batch, npt.THERMOSTAT_VELOCITIES),
        getattr(batch, npt.BAROSTAT_CHAIN_POSITIONS), getattr(batch, npt.BAROSTAT_CHAIN_VELOCITIES),
        per("temperature", batch), per("pressure", batch), per("tau_t", batch), per("tau_p", batch),
        dyn.system_dof(batch), per("dt", batch), _active(dyn, batch), weights, dyn.chain_steps,
        _typed(dyn.cell_dof, batch), _typed(KB, batch), int(dyn.anisotropic),
    )


def _atom_args(dyn: Any, batch: Batch) -> tuple[Any, ...]:
    from alchemi_integrators.warp_kernels import _active

    inv_mass = dyn.cached("warp_inv_mass", batch, lambda: dyn.inv_mass.view(-1), reads_fields=False, masks=False)
    return batch.velocities, batch.forces, inv_mass, batch.batch_idx, _active(dyn, batch)


def mtk_pre(dyn: Any, batch: Batch) -> None:
    """``NPTMTK``'s update before the forces (see the module docstring)."""
    launches = _launches(dyn)
    v, f, inv_mass, system, active = _atom_args(dyn, batch)
    diag, off = _parts(dyn, batch)
    launches.launch("parts", _kinetic_parts, batch.num_nodes, (v, inv_mass, diag, off), batch.device)
    kd, ko = _kinetic_sums(dyn, batch, diag, off)
    cell = _in_dtype(dyn, batch, "cell")
    kick, push, grow, carry = _maps(dyn, batch, ("kick", "push", "grow", "carry"))
    args = (*_system_args(dyn, batch, kd, ko, cell), 1, kick, push, grow, carry, _scale(dyn, batch))
    launches.launch("pre_system", _system_update, batch.num_graphs, args, batch.device)
    if cell is not batch.cell:
        batch.cell.copy_(cell)
    args = (batch.positions, v, f, inv_mass, system, active, kick, push, grow, carry)
    launches.launch("pre_atoms", _pre_atoms, batch.num_nodes, args, batch.device)


def mtk_post(dyn: Any, batch: Batch) -> None:
    """``NPTMTK``'s update after the forces (see the module docstring)."""
    from alchemi_integrators import npt

    launches = _launches(dyn)
    v, f, inv_mass, system, active = _atom_args(dyn, batch)
    kick, push, grow, carry = _maps(dyn, batch, ("kick", "push", "grow", "carry"))
    g = getattr(batch, npt.CELL_STRAIN_RATE)
    args = (g, dyn.system_dof(batch), dyn.per_system("dt", batch), active, kick, push)
    launches.launch("kick_system", _kick_system, batch.num_graphs, args, batch.device)
    diag, off = _parts(dyn, batch)
    args = (v, f, inv_mass, system, active, kick, push, diag, off)
    launches.launch("kick_parts", _kick_parts, batch.num_nodes, args, batch.device)
    kd, ko = _kinetic_sums(dyn, batch, diag, off)
    scale = _scale(dyn, batch)
    args = (*_system_args(dyn, batch, kd, ko, _in_dtype(dyn, batch, "cell")), 0, kick, push, grow, carry, scale)
    launches.launch("post_system", _system_update, batch.num_graphs, args, batch.device)
    launches.launch("scale", _scale_velocities, batch.num_nodes, (v, system, scale), batch.device)
