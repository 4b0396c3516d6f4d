"""What the constant-pressure Warp kernels share (:mod:`~alchemi_integrators.mtk_kernels`,
:mod:`~alchemi_integrators.crescale_kernels`): 3x3 matrix functions for one system, each atom's
share of the kinetic tensor and its per-system sums.

The 3x3 functions repeat :mod:`~alchemi_integrators.cell_math`'s arithmetic in the same order
(exponentials by two squarings of an eighth-order Taylor polynomial, ``phi1`` to tenth order), so
the kernels and the torch test oracles agree to rounding. The kinetic tensor ``sum_i m_i v_i v_i^T`` is
summed as two vec3 per atom (the diagonal and ``xy, xz, yz``) by
:func:`~alchemi_integrators.system_sums.system_sums`: no atomic add per atom into one address, so
one large system sums as fast as many small ones.

Example:
    >>> from alchemi_integrators.npt_common import in_dtype
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import warp as wp

from alchemi_integrators.kernel_funcs import declare_overloads, launches_of
from alchemi_integrators.system_sums import system_sums
from alchemi_integrators.warp_kernels import largest_system

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: MTK's state (system-level fields): the cell's strain rate ``[B, 3, 3]`` (1/fs) and the particle
#: thermostat's and the barostat's chains, positions and velocities ``[B, M]``.
CELL_STRAIN_RATE = "npt_strain_rate"
THERMOSTAT_POSITIONS = "npt_thermostat_positions"
THERMOSTAT_VELOCITIES = "npt_thermostat_velocities"
BAROSTAT_CHAIN_POSITIONS = "npt_barostat_chain_positions"
BAROSTAT_CHAIN_VELOCITIES = "npt_barostat_chain_velocities"


# ---------------------------------------------------------------------------------------------
# 3x3 functions (cell_math's, for one matrix) and the kinetic tensor
# ---------------------------------------------------------------------------------------------


@wp.func
def eye3(like: Any):
    one = type(like[0, 0])(1.0)
    zero = type(like[0, 0])(0.0)
    return type(like)(one, zero, zero, zero, one, zero, zero, zero, one)


@wp.func
def matmul3(a: Any, b: Any):
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
def expm3(a: Any):
    # cell_math.expm(a, squarings=2, order=8): I + x (I + x/2 (... (I + x/8))), x = a / 4, squared twice.
    eye = eye3(a)
    x = a / type(a[0, 0])(4.0)
    k = type(a[0, 0])(8.0)
    out = eye + x / k
    for _ in range(7):
        k = k - type(k)(1.0)
        out = eye + matmul3(x, out) / k
    out = matmul3(out, out)
    return matmul3(out, out)


@wp.func
def phi1_3(x: Any):
    # phi1(x, order=10) = (exp(x) - 1) / x: sum_k x^k / (k + 1)!, by Horner from k = 10.
    eye = eye3(x)
    k = type(x[0, 0])(1.0)
    fact = k
    for _ in range(10):
        k = k + type(k)(1.0)
        fact = fact * k
    out = eye / fact  # 11!
    for _ in range(10):
        fact = fact / k  # 10!, 9!, ..., 1!
        k = k - type(k)(1.0)
        out = eye / fact + matmul3(x, out)
    return out


@wp.func
def trace3(a: Any):
    return a[0, 0] + a[1, 1] + a[2, 2]


@wp.func
def volume3(cell: Any):
    # |det| as the triple product of the rows (cell_math.det3).
    return wp.abs(wp.dot(cell[0], wp.cross(cell[1], cell[2])))


@wp.func
def kinetic_tensor(diag: Any, off: Any, like: Any):
    # sum m v v^T from its diagonal and its (xy, xz, yz) entries.
    return type(like)(diag[0], off[0], off[1], off[0], diag[1], off[2], off[1], off[2], diag[2])


@wp.func
def kinetic_share(vi: Any, inv_mass: Any):
    # An atom's m v v^T: its diagonal and (xy, xz, yz) (m / ACCELERATION = 1 / inv_mass, in eV).
    mv = vi / inv_mass
    return type(vi)(mv[0] * vi[0], mv[1] * vi[1], mv[2] * vi[2]), type(vi)(mv[0] * vi[1], mv[0] * vi[2], mv[1] * vi[2])


@wp.kernel
def kinetic_parts(v: wp.array(dtype=Any), inv_mass: wp.array(dtype=Any), diag: wp.array(dtype=Any),
                   off: wp.array(dtype=Any)):
    i = wp.tid()
    d, o = kinetic_share(v[i], inv_mass[i])
    diag[i] = d
    off[i] = o


declare_overloads([kinetic_parts])


# ---------------------------------------------------------------------------------------------
# buffers and launches
# ---------------------------------------------------------------------------------------------


def in_dtype(dyn: Any, batch: Batch, name: str) -> torch.Tensor:
    """Field ``name`` (``cell`` or ``stress``) in the positions' dtype: the field itself, or a
    workspace copy where the model or the data gave it another precision."""
    field = getattr(batch, name)
    dtype = batch.positions.dtype
    if field.dtype == dtype:
        return field
    copy = dyn.work.get(f"npt_{name}", batch.num_graphs, batch.system_capacity, (3, 3), dtype, batch.device)
    return copy.copy_(field)


def kinetic_sums(dyn: Any, batch: Batch, diag: torch.Tensor, off: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, 3]`` sums of the atoms' kinetic-tensor shares: diagonal and off-diagonal."""
    work, dtype, device = dyn.work, diag.dtype, diag.device
    kd = work.get("npt_kd", batch.num_graphs, batch.system_capacity, (3,), dtype, device)
    ko = work.get("npt_ko", batch.num_graphs, batch.system_capacity, (3,), dtype, device)
    kd.zero_()
    ko.zero_()
    largest = largest_system(dyn, batch)
    system_sums(launches_of(dyn), work, "npt_kd", diag, batch.batch_idx, kd, largest)
    system_sums(launches_of(dyn), work, "npt_ko", off, batch.batch_idx, ko, largest)
    return kd, ko


def parts(dyn: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``[V, 3]`` buffers of the atoms' kinetic-tensor shares: diagonal and off-diagonal."""
    v = batch.velocities
    diag = dyn.work.get("npt_diag", batch.num_nodes, batch.node_capacity, (3,), v.dtype, v.device)
    off = dyn.work.get("npt_off", batch.num_nodes, batch.node_capacity, (3,), v.dtype, v.device)
    return diag, off


def maps(dyn: Any, batch: Batch, names: tuple[str, ...]) -> list[torch.Tensor]:
    """One ``[B, 3, 3]`` buffer per name: the per-system maps a step's atom kernels apply."""
    dtype = batch.positions.dtype
    return [dyn.work.get(f"npt_{n}", batch.num_graphs, batch.system_capacity, (3, 3), dtype, batch.device)
            for n in names]


def scale_buffer(dyn: Any, batch: Batch) -> torch.Tensor:
    """The ``[B]`` buffer of per-system velocity factors."""
    dtype = batch.positions.dtype
    return dyn.work.get("npt_scale", batch.num_graphs, batch.system_capacity, (), dtype, batch.device)
