"""Batched 3x3 matrix functions for moving cells: exponential, its Fréchet derivative, logarithm.

Every function takes ``[..., n, n]`` tensors and runs a fixed sequence of matrix products (no
data-dependent branch, no read-back), so a step that uses them can be captured as a CUDA graph.
They are meant for the matrices that cell dynamics produce: strains and strain rates of at most
order one.

* :func:`expm`: scaling and squaring with a fixed number of squarings and a Taylor polynomial.
* :func:`expm_frechet_adjoint`: the gradient ``G -> D exp(L)^T [G]`` that turns a gradient with
  respect to ``exp(L)`` into one with respect to ``L`` (the upper-right block of the exponential
  of ``[[L^T, G], [0, L^T]]``).
* :func:`logm_near_identity`: inverse scaling and squaring (Denman-Beavers square roots, then the
  series of ``log(1 + x)``), accurate for deformation gradients within ~50 % of the identity.

Example:
    >>> import torch
    >>> a = torch.tensor([[[0.0, 0.1, 0.0], [0.0, 0.0, 0.2], [0.05, 0.0, 0.01]]], dtype=torch.float64)
    >>> torch.allclose(logm_near_identity(expm(a)), a)
    True
"""

from __future__ import annotations

import torch

__all__ = ["det3", "expm", "expm_frechet_adjoint", "inv3", "logm_near_identity"]


def det3(m: torch.Tensor) -> torch.Tensor:
    """``[...]`` determinants of ``[..., 3, 3]`` matrices as the triple product of their rows
    (LAPACK's batched determinant costs milliseconds for a few small matrices on a CPU)."""
    return (m[..., 0, :] * torch.linalg.cross(m[..., 1, :], m[..., 2, :])).sum(-1)


def inv3(m: torch.Tensor) -> torch.Tensor:
    """Inverses of ``[..., 3, 3]`` matrices from the adjugate (no pivoting, no error check: the
    cells and deformation gradients this serves are far from singular)."""
    a, b, c = m[..., 0, :], m[..., 1, :], m[..., 2, :]
    cols = torch.stack((torch.linalg.cross(b, c), torch.linalg.cross(c, a), torch.linalg.cross(a, b)), dim=-1)
    return cols / det3(m)[..., None, None]


def _eye_like(a: torch.Tensor) -> torch.Tensor:
    return torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(a)


def expm(a: torch.Tensor, squarings: int = 8, order: int = 12) -> torch.Tensor:
    """``exp(a)`` for ``[..., n, n]`` matrices; accurate to float64 rounding for ``|a| <~ 20``.

    Example:
        >>> import torch
        >>> z = torch.zeros(2, 3, 3)
        >>> bool((expm(z) == torch.eye(3)).all())
        True
    """
    x = a / float(2**squarings)
    eye = _eye_like(a)
    # Horner: I + x (I + x/2 (I + x/3 (...)))
    out = eye + x / float(order)
    for k in range(order - 1, 0, -1):
        out = eye + (x @ out) / float(k)
    for _ in range(squarings):
        out = out @ out
    return out


def expm_frechet_adjoint(log_f: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The gradient with respect to ``L`` of a scalar whose gradient with respect to ``exp(L)`` is
    ``grad``: ``sum_kl grad_kl d exp(L)_kl / d L_ij`` for ``[..., 3, 3]`` inputs.

    This is ``D exp(L^T)[grad]``, the Fréchet derivative at ``L^T`` in the direction ``grad``,
    read off the upper-right block of ``exp([[L^T, grad], [0, L^T]])``. The derivative is linear
    in ``grad``, so ``grad`` is normalised first to keep the block matrix well scaled.
    """
    n = log_f.shape[-1]
    lt = log_f.transpose(-1, -2)
    scale = torch.linalg.matrix_norm(grad).clamp(min=torch.finfo(grad.dtype).tiny)[..., None, None]
    block = torch.zeros((*log_f.shape[:-2], 2 * n, 2 * n), dtype=log_f.dtype, device=log_f.device)
    block[..., :n, :n] = lt
    block[..., n:, n:] = lt
    block[..., :n, n:] = grad / scale
    return expm(block)[..., :n, n:] * scale


def _sqrtm_denman_beavers(a: torch.Tensor, iterations: int) -> torch.Tensor:
    y, z = a, _eye_like(a)
    for _ in range(iterations):
        y_inv, z_inv = inv3(y), inv3(z)
        y, z = 0.5 * (y + z_inv), 0.5 * (z + y_inv)
    return y


def logm_near_identity(f: torch.Tensor, roots: int = 3, terms: int = 14) -> torch.Tensor:
    """The principal logarithm of ``[..., 3, 3]`` matrices with no eigenvalue on the negative axis.

    ``roots`` square roots bring ``f`` close to the identity, the series of ``log(1 + x)`` to
    ``terms`` terms does the rest, and the result is multiplied back by ``2**roots``.
    """
    y = f
    for _ in range(roots):
        y = _sqrtm_denman_beavers(y, 6)
    x = y - _eye_like(f)
    # log(1 + x) = x - x^2/2 + x^3/3 - ..., by Horner.
    out = x * ((-1.0) ** (terms + 1) / terms)
    for k in range(terms - 1, 0, -1):
        out = x @ (out + _eye_like(f) * ((-1.0) ** (k + 1) / k))
    return out * float(2**roots)
