"""Each system's largest atomic force norm (``fmax``), measured at a check.

In torch this is a norm per atom and ``scatter_reduce_(..., reduce="amax")`` into the systems:
on a GPU an atomic maximum per atom, on which the atoms of a system race (W2, a check every step:
53 us against 20 us here per check on an H200). Here a Warp kernel gives each thread
:data:`~alchemi_core.dynamics.check_kernels.WIDTH` consecutive atoms (a system's atoms are
contiguous in a batch) and updates each system it sees once per run of its atoms.

The norms are Warp's ``length`` and may differ from torch's ``vector_norm`` in the last bit. A
system with a non-finite force gets ``inf`` (torch: NaN): it never converges, and the check's
quarantine, which runs before convergence, has already failed it.

Warp is not a dependency of alchemi-core: :func:`system_force_max` returns False where its path
does not apply (no warp-lang, a CPU without Warp's CPU compiler, other dtypes or shapes, a device
Warp does not run on), and the caller uses torch. The engine calls it where its
``CoreTuning.force_max_kernel`` says so (``alchemi_core.tuning``: on for CPUs and CUDA).

Example:
    >>> import torch
    >>> from alchemi_core.dynamics.force_max import system_force_max
    >>> forces = torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    >>> system = torch.tensor([0, 0, 1])
    >>> out = torch.zeros(2)
    >>> if not system_force_max(forces, system, out):  # no warp-lang: torch
    ...     _ = out.scatter_reduce_(0, system, forces.norm(dim=-1), reduce="amax", include_self=False)
    >>> out.tolist()
    [5.0, 2.0]
"""

from __future__ import annotations

import torch


def system_force_max(forces: torch.Tensor, system: torch.Tensor, out: torch.Tensor) -> bool:
    """Write each system's largest force norm into ``out`` ``[B]`` (``forces`` ``[V, 3]``,
    ``system`` ``[V]`` each atom's system, contiguous runs); False, with nothing written, where the
    Warp path does not apply and torch must do it. No host synchronisation: a check's graph
    captures it."""
    dtype = forces.dtype
    if forces.device.type not in ("cpu", "cuda"):
        return False
    if (dtype not in (torch.float32, torch.float64) or out.dtype != dtype or forces.dim() != 2
            or forces.shape[1] != 3 or out.dim() != 1 or system.dtype != torch.int64
            or forces.shape[0] == 0 or not out.is_contiguous()):
        return False
    from alchemi_core.dynamics.check_kernels import WIDTH, force_max_kernel, warp_for
    from alchemi_core.warp_runtime import Typed, launch_args

    wp = warp_for(forces.device)
    if wp is None:
        return False
    kernel = force_max_kernel()
    count = forces.shape[0]
    vec = wp.vec3d if dtype == torch.float64 else wp.vec3f
    out.zero_()
    launch_args(kernel, -(-count // WIDTH), (Typed(forces.contiguous(), vec), system.contiguous(), count, out),
                forces.device)
    return True
