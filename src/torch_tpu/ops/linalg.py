"""Matrix products (mm, bmm, addmm and relatives) and linear-algebra decompositions.

Products run at ``Precision.HIGHEST`` so float32 is true float32 on every backend (a TPU would
otherwise use bfloat16 passes), and float16/bfloat16 accumulate in float32 like torch CPU.
Integer products are exact; bool products are not implemented, as on CPU.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .. import _tensor
from .._dtypes import to_torch
from .._registry import lower, runtime
from ._helpers import accumulator, type_name

aten = torch.ops.aten
HIGHEST = lax.Precision.HIGHEST


# ----------------------------------------------------------------------------- checks
def _check_ranks(name: str, *pairs) -> None:
    """``(array, rank)`` pairs; a wrong rank is reported with torch's own message (the
    dispatcher replays the call on meta tensors, whose kernels carry those checks)."""
    for x, rank in pairs:
        if x.ndim != rank:
            raise ValueError(f"{name}: expected a {rank}-D tensor, got {x.ndim}-D")


def _check_dtypes(name: str, *arrays) -> None:
    first = arrays[0].dtype
    for x in arrays[1:]:
        if x.dtype != first:
            raise RuntimeError(f"{name}: expected all operands to have the same dtype, but got: "
                               f"{to_torch(first)} != {to_torch(x.dtype)}")
    if first == jnp.bool_:
        raise NotImplementedError(f"\"{name}\" not implemented for '{type_name(first)}'")


# ----------------------------------------------------------------------------- products
def _product(spec: str, a, b):
    """``einsum(spec, a, b)`` accumulated in torch's opmath dtype (result not yet rounded)."""
    return jnp.einsum(spec, a, b, precision=HIGHEST, preferred_element_type=accumulator(a.dtype))


def _scaled_sum(bias, product, beta, alpha, dtype):
    """``beta * bias + alpha * product``; ``beta == 0`` ignores ``bias`` (NaN/inf included).
    The scalars take the product's dtype first, as in torch (``alpha=0.6`` is 0 for ints)."""
    beta, alpha = jnp.asarray(beta, product.dtype), jnp.asarray(alpha, product.dtype)
    bias = jnp.where(beta == 0, jnp.zeros((), product.dtype), bias.astype(product.dtype) * beta)
    return jnp.broadcast_to(bias + product * alpha, product.shape).astype(dtype)


def _check_operands(name: str, ranks: tuple[int, int], a, b, bias=None) -> None:
    _check_ranks(name, (a, ranks[0]), (b, ranks[1]))
    _check_dtypes(name, *([a, b] if bias is None else [bias, a, b]))


def _matmul_op(name: str, spec: str, ranks: tuple[int, int]):
    """``op(a, b) = einsum(spec, a, b)``."""
    def product(a, b):
        _check_operands(name, ranks, a, b)
        return _product(spec, a, b).astype(a.dtype)
    return product


def _scaled_matmul_op(name: str, spec: str, ranks: tuple[int, int]):
    """``op(bias, a, b, beta, alpha) = beta * bias + alpha * einsum(spec, a, b)``."""
    def scaled(bias, a, b, beta=1, alpha=1):
        _check_operands(name, ranks, a, b, bias)
        return _scaled_sum(bias, _product(spec, a, b), beta, alpha, a.dtype)
    return scaled


mm = lower(aten.mm.default)(_matmul_op("mm", "nk,km->nm", (2, 2)))
bmm = lower(aten.bmm.default)(_matmul_op("bmm", "bnk,bkm->bnm", (3, 3)))
mv = lower(aten.mv.default)(_matmul_op("mv", "nk,k->n", (2, 1)))
addmm = lower(aten.addmm.default)(_scaled_matmul_op("addmm", "nk,km->nm", (2, 2)))
baddbmm = lower(aten.baddbmm.default)(_scaled_matmul_op("baddbmm", "bnk,bkm->bnm", (3, 3)))
addmv = lower(aten.addmv.default)(_scaled_matmul_op("addmv", "nk,k->n", (2, 1)))
addbmm = lower(aten.addbmm.default)(_scaled_matmul_op("addbmm", "bnk,bkm->nm", (3, 3)))


@runtime(aten.addbmm_.default)
def addbmm_(self: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta=1, alpha=1):
    """CPU's in-place addbmm runs addbmm.out with ``out=self``, so a ``self`` that only
    broadcasts to the product's shape is resized to it (no other in-place op does this)."""
    result = aten.addbmm.default(self, batch1, batch2, beta=beta, alpha=alpha)
    return self.resize_(result.shape).copy_(result)


@lower(aten.dot.default)
def dot(a, b):
    _check_ranks("dot", (a, 1), (b, 1))
    _check_dtypes("dot", a, b)
    if a.shape != b.shape:
        raise RuntimeError(f"inconsistent tensor size, expected tensor [{a.shape[0]}] and src "
                           f"[{b.shape[0]}] to have the same number of elements, but got "
                           f"{a.shape[0]} and {b.shape[0]} elements respectively")
    return _product("k,k->", a, b).astype(a.dtype)


@lower(aten.vdot.default)
def vdot(a, b):
    return dot(jnp.conj(a), b)


@lower(aten.addr.default)
def addr(bias, a, b, beta=1, alpha=1):
    _check_ranks("addr", (a, 1), (b, 1))
    if a.dtype == jnp.bool_:  # torch's boolean addr: (bias and beta) or (a outer b and alpha)
        outer = jnp.logical_and(a[:, None], b[None, :]) & (alpha != 0)
        return jnp.broadcast_to((bias & (beta != 0)) | outer, outer.shape)
    outer = (a[:, None].astype(accumulator(a.dtype)) * b[None, :])
    return _scaled_sum(bias, outer, beta, alpha, a.dtype)


@lower(aten._addmm_activation.default)
def addmm_activation(bias, a, b, beta=1, alpha=1, use_gelu=False):
    out = addmm(bias, a, b, beta, alpha)
    wide = out.astype(accumulator(out.dtype))
    activated = jax.nn.gelu(wide, approximate=False) if use_gelu else jax.nn.relu(wide)
    return activated.astype(out.dtype)


# ----------------------------------------------------------------------------- decompositions
# Info outputs are int32 like LAPACK's. Factorizations with ``check_errors`` run unjitted so a
# failure can raise on the host; their arithmetic is jitted below.
def _raise_if_failed(check_errors: bool, info: jax.Array, message: str) -> None:
    if check_errors and bool(jnp.any(info != 0)):
        first = int(jnp.ravel(info)[jnp.argmax(jnp.ravel(info) != 0)])
        raise torch.linalg.LinAlgError(message.format(first))


def _first_failure(bad: jax.Array) -> jax.Array:
    """LAPACK-style info: 1 + the first index along the last axis where ``bad``, else 0."""
    if bad.shape[-1] == 0:
        return jnp.zeros(bad.shape[:-1], jnp.int32)
    return jnp.where(jnp.any(bad, -1), jnp.argmax(bad, -1) + 1, 0).astype(jnp.int32)


def _mT(x):
    return jnp.conj(jnp.swapaxes(x, -1, -2))


@jax.jit
def _cholesky(a):
    lower_factor = lax.linalg.cholesky(a, symmetrize_input=False)
    diagonal = jnp.diagonal(lower_factor, axis1=-2, axis2=-1)
    return lower_factor, _first_failure(~jnp.isfinite(diagonal))


@lower(aten.linalg_cholesky_ex.default, jit=False)
def linalg_cholesky_ex(a, upper=False, check_errors=False):
    factor, info = _cholesky(a)
    _raise_if_failed(check_errors, info, "linalg.cholesky: The factorization could not be "
                     "completed because the input is not positive-definite (the leading minor "
                     "of order {} is not positive-definite).")
    return (_mT(factor) if upper else factor), info


@jax.jit
def _lu(a):
    """LU with partial pivoting: packed factors, 1-based int32 pivots (LAPACK's), info."""
    lu, pivots, _ = lax.linalg.lu(a)
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return lu, (pivots + 1).astype(jnp.int32), _first_failure(diagonal == 0)


@lower(aten.linalg_lu_factor_ex.default, jit=False)
def linalg_lu_factor_ex(a, pivot=True, check_errors=False):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
    lu, pivots, info = _lu(a)
    _raise_if_failed(check_errors, info, "linalg.lu_factor: U[{0},{0}] is zero and therefore "
                     "the matrix is singular.")
    return lu, pivots, info


def _factored_transpose(op):
    """A kernel for ``op(A) -> (..., LU, pivots)``. torch factors A^T when A is contiguous and
    real (a copy-free LAPACK layout), and its backward formulas read LU that way, so the
    kernel must know A's strides: it is a runtime entry around a pure, jitted ``fn(A, A_T)``."""
    def register(fn):
        jitted = jax.jit(fn, static_argnums=1)

        def kernel(a):
            factor_transpose = a.is_contiguous() and not a.is_complex()
            return tuple(_tensor.wrap(o) for o in jitted(_tensor.read(a), factor_transpose))
        runtime(op)(kernel)
        return fn
    return register


def _signed_lu(a, factor_transpose):
    """LU of A (or A^T), its diagonal and the sign of its row permutation."""
    lu, pivots, _ = _lu(jnp.swapaxes(a, -1, -2) if factor_transpose else a)
    swaps = jnp.sum(pivots != jnp.arange(1, pivots.shape[-1] + 1, dtype=pivots.dtype), -1)
    sign = (1 - 2 * (swaps % 2)).astype(a.dtype)
    return lu, pivots, jnp.diagonal(lu, axis1=-2, axis2=-1), sign


@_factored_transpose(aten._linalg_det.default)
def linalg_det(a, factor_transpose):
    lu, pivots, diagonal, sign = _signed_lu(a, factor_transpose)
    return jnp.prod(diagonal, -1) * sign, lu, pivots


@_factored_transpose(aten._linalg_slogdet.default)
def linalg_slogdet(a, factor_transpose):
    lu, pivots, diagonal, sign = _signed_lu(a, factor_transpose)
    sign = jnp.prod(jnp.sign(diagonal), -1) * sign
    return sign, jnp.sum(jnp.log(jnp.abs(diagonal)), -1), lu, pivots


def _lu_solve(lu, pivots, b, left=True, adjoint=False):
    """Solve ``op(A) X = B`` (``left``) or ``X op(A) = B`` from A's packed LU factors and
    1-based pivots, where ``op`` is the conjugate transpose when ``adjoint``."""
    if not left:  # X op(A) = B  <=>  op(A)^T X^T = B^T; conjugating turns ^H^T into plain ^T
        conj = jnp.conj if adjoint else (lambda x: x)
        flipped = _lu_solve(lu, pivots, conj(jnp.swapaxes(b, -1, -2)), True, not adjoint)
        return jnp.swapaxes(conj(flipped), -1, -2)
    batch = jnp.broadcast_shapes(lu.shape[:-2], b.shape[:-2])
    lu = jnp.broadcast_to(lu, batch + lu.shape[-2:])
    pivots = jnp.broadcast_to(pivots, batch + pivots.shape[-1:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    return jax.scipy.linalg.lu_solve((lu, pivots - 1), b, trans=2 if adjoint else 0)


_jit_lu_solve = jax.jit(_lu_solve, static_argnums=(3, 4))
lower(aten.linalg_lu_solve.default)(_lu_solve)


@lower(aten.linalg_inv_ex.default, jit=False)
def linalg_inv_ex(a, check_errors=False):
    lu, pivots, info = _lu(a)
    _raise_if_failed(check_errors, info, "linalg.inv: The diagonal element {} is zero, the "
                     "inversion could not be completed because the input matrix is singular.")
    identity = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return _jit_lu_solve(lu, pivots, identity), info


@lower(aten._linalg_solve_ex.default, jit=False)
def linalg_solve_ex(a, b, left=True, check_errors=False):
    """torch.linalg.solve: ``b`` is a (batch of) vector(s) when it has one dim less than ``a``."""
    lu, pivots, info = _lu(a)
    _raise_if_failed(check_errors, info, "torch.linalg.solve: The solver failed because the "
                     "input matrix is singular.")
    vector = left and (b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1]))
    solution = _jit_lu_solve(lu, pivots, b[..., None] if vector else b, left, False)
    return (solution[..., 0] if vector else solution), lu, pivots, info


def _triangular_solve(a, b, upper, left, unitriangular, transpose=False):
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=not upper,
                                       transpose_a=transpose, unit_diagonal=unitriangular), a


@lower(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, upper, left=True, unitriangular=False):
    return _triangular_solve(a, b, upper, left, unitriangular)[0]


@lower(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    solution, a = _triangular_solve(a, b, upper, True, unitriangular, transpose)
    return solution, a


@lower(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    if mode == "r":
        return jnp.zeros((0,), a.dtype), jnp.linalg.qr(a, mode="r")
    return jnp.linalg.qr(a, mode=mode)


@lower(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, driver=None):
    if not compute_uv:
        empty = jnp.zeros((0,), a.dtype)
        return empty, jnp.linalg.svd(a, compute_uv=False), empty
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


@lower(aten._linalg_eigh.default)
def linalg_eigh(a, UPLO="L", compute_v=True):
    values, vectors = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return values, (vectors if compute_v else jnp.zeros((0,), a.dtype))
