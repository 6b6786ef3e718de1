"""Matrix products (mm, bmm, addmm and relatives) and linear-algebra decompositions.

Products run at ``Precision.HIGHEST`` so float32 is true float32 on every backend (a TPU would
otherwise use bfloat16 passes), unless ``torch.set_float32_matmul_precision`` allows faster
passes (``runtime.precision``); float16/bfloat16 accumulate in float32 like torch CPU.
Integer products are exact; bool products are not implemented, as on CPU.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
from jax import lax
from jax._src.lax.linalg import geqrf as _lapack_geqrf  # not re-exported by jax.lax.linalg

from ..runtime import overlap, tensor
from ..runtime.buffer import apply
from ..runtime.dtypes import FLOAT8_JAX, cast, to_jax, to_torch, torchs_own
from ..runtime.precision import matmul_precision
from . import layout
from ._helpers import accumulator, type_name
from ._nn_helpers import require, wrap_dim
from .padding import Einsum
from .reduction import linalg_vector_norm
from .registry import Layout, Promote, Runs, lower, runtime

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
            raise RuntimeError(
                f"{name}: expected all operands to have the same dtype, but got: "
                f"{to_torch(first)} != {to_torch(x.dtype)}"
            )
    if first == jnp.bool_:
        raise NotImplementedError(f"\"{name}\" not implemented for '{type_name(first)}'")


# ----------------------------------------------------------------------------- products
def _product(spec: str, a, b):
    """``einsum(spec, a, b)`` accumulated in torch's opmath dtype (result not yet rounded; float8
    operands widened to float32 first, exactly, as CPU's kernel reads them)."""
    if a.dtype in FLOAT8_JAX:
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return jnp.einsum(
        spec, a, b, precision=matmul_precision(a.dtype), preferred_element_type=accumulator(a.dtype)
    )


def _rounded(value, dtype):
    """A product's rounding to the operands' ``dtype``: into float8 saturating, as c10 does
    (``cast``); into the others as XLA converts."""
    return cast(value, dtype) if dtype in FLOAT8_JAX else value.astype(dtype)


def _scaled_sum(bias, product, beta, alpha, dtype):
    """``beta * bias + alpha * product``; ``beta == 0`` ignores ``bias`` (NaN/inf included).
    The scalars take the product's dtype first, as in torch (``alpha=0.6`` is 0 for ints)."""
    beta, alpha = jnp.asarray(beta, product.dtype), jnp.asarray(alpha, product.dtype)
    bias = jnp.where(beta == 0, jnp.zeros((), product.dtype), bias.astype(product.dtype) * beta)
    return _rounded(jnp.broadcast_to(bias + product * alpha, product.shape), dtype)


def _check_operands(name: str, ranks: tuple[int, int], a, b, bias=None) -> None:
    _check_ranks(name, (a, ranks[0]), (b, ranks[1]))
    _check_dtypes(name, *([a, b] if bias is None else [bias, a, b]))


# Inner (and batch) sizes must match exactly, with CPU's messages: einsum would broadcast a size-1
# dimension instead (a 5x1 by 2x3 mm gave a 5x3 tensor of 2s).
def _sizes(shape) -> str:
    return "x".join(map(str, shape))


def _check_mm(a, b, bias=None) -> None:
    if a.shape[1] != b.shape[0]:
        raise RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied ({_sizes(a.shape)} and {_sizes(b.shape)})"
        )


def _check_bmm(a, b, bias=None) -> None:
    expected = [a.shape[0], a.shape[2]]
    if list(b.shape[:2]) != expected:
        raise RuntimeError(
            f"Expected size for first two dimensions of batch2 tensor to be: "
            f"{expected} but got: {list(b.shape[:2])}."
        )


def _check_addbmm(a, b, bias=None) -> None:
    if a.shape[0] != b.shape[0]:
        raise RuntimeError(
            f"batch1 and batch2 must have same number of batches, got {a.shape[0]} and {b.shape[0]}"
        )
    if a.shape[2] != b.shape[1]:
        raise RuntimeError(
            f"Incompatible matrix sizes for bmm ({_sizes(a.shape[1:])} and {_sizes(b.shape[1:])})"
        )


def _check_mv(a, b, bias=None) -> None:
    """``bias`` (addmv's input) has the output's length, or 1 (it broadcasts)."""
    length = a.shape[0] if bias is None or bias.ndim != 1 else bias.shape[0]
    if a.shape[1] != b.shape[0] or length not in (1, a.shape[0]):
        raise RuntimeError(
            f"size mismatch, got input ({length}), mat ({_sizes(a.shape)}), vec ({b.shape[0]})"
        )


def _matmul_op(name: str, spec: str, ranks: tuple[int, int], check_sizes):
    """``op(a, b) = einsum(spec, a, b)``."""

    def product(a, b):
        _check_operands(name, ranks, a, b)
        check_sizes(a, b)
        return _rounded(_product(spec, a, b), a.dtype)

    return product


def _scaled_matmul_op(name: str, spec: str, ranks: tuple[int, int], check_sizes):
    """``op(bias, a, b, beta, alpha) = beta * bias + alpha * einsum(spec, a, b)``."""

    def scaled(bias, a, b, beta=1, alpha=1):
        _check_operands(name, ranks, a, b, bias)
        check_sizes(a, b, bias)
        return _scaled_sum(bias, _product(spec, a, b), beta, alpha, a.dtype)

    return scaled


mm = lower(aten.mm.default, pad=Einsum("mk,kn->mn", (0, 1)))(_matmul_op("mm", "nk,km->nm", (2, 2), _check_mm))
bmm = lower(aten.bmm.default, pad=Einsum("bmk,bkn->bmn", (0, 1)))(
    _matmul_op("bmm", "bnk,bkm->bnm", (3, 3), _check_bmm)
)
mv = lower(aten.mv.default)(_matmul_op("mv", "nk,k->n", (2, 1), _check_mv))
addmm = lower(aten.addmm.default, pad=Einsum("mn,mk,kn->mn", (0, 1, 2)))(
    _scaled_matmul_op("addmm", "nk,km->nm", (2, 2), _check_mm)
)
baddbmm = lower(aten.baddbmm.default, pad=Einsum("bmn,bmk,bkn->bmn", (0, 1, 2)))(
    _scaled_matmul_op("baddbmm", "bnk,bkm->bnm", (3, 3), _check_bmm)
)
addmv = lower(aten.addmv.default)(_scaled_matmul_op("addmv", "nk,k->n", (2, 1), _check_mv))
addbmm = lower(aten.addbmm.default)(_scaled_matmul_op("addbmm", "bnk,bkm->nm", (3, 3), _check_addbmm))


@runtime(aten.baddbmm_.default)
def baddbmm_(self: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta=1, alpha=1):
    """CPU's kernel checks no overlap: it updates ``self`` one batch matrix after another, so
    where batches share memory (an expanded batch dimension) each batch's update starts from
    what the previous one wrote. Done the same way here, matrix by matrix; a matrix that
    overlaps itself (CPU's element order) is refused with PyTorch's overlap error."""
    result = aten.baddbmm.default(self, batch1, batch2, beta=beta, alpha=alpha)
    if result.shape != self.shape:
        raise RuntimeError(
            f"Bad in-place call: input tensor size {list(self.shape)} and output tensor size "
            f"{list(result.shape)} should match"
        )
    if not overlap.has_internal_overlap(overlap.layout(self)):
        return self.copy_(result)
    for matrix, first, second in zip(self, batch1, batch2):
        matrix.copy_(aten.addmm.default(matrix, first, second, beta=beta, alpha=alpha))
    return self


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
        raise RuntimeError(
            f"inconsistent tensor size, expected tensor [{a.shape[0]}] and src "
            f"[{b.shape[0]}] to have the same number of elements, but got "
            f"{a.shape[0]} and {b.shape[0]} elements respectively"
        )
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
    outer = a[:, None].astype(accumulator(a.dtype)) * b[None, :]
    return _scaled_sum(bias, outer, beta, alpha, a.dtype)


@lower(aten._addmm_activation.default)
def addmm_activation(bias, a, b, beta=1, alpha=1, use_gelu=False):
    out = addmm(bias, a, b, beta, alpha)
    wide = out.astype(accumulator(out.dtype))
    activated = jax.nn.gelu(wide, approximate=False) if use_gelu else jax.nn.relu(wide)
    return activated.astype(out.dtype)


# ----------------------------------------------------------------------------- grouped products
# ``_grouped_mm`` (MoE experts): ``offs`` holds each group's cumulative END along the jagged
# dimension of the 2-D operand(s). PyTorch's composite kernel reads ``offs`` on the host to slice;
# here the groups are masks over static shapes (``ragged_dot``), so one jit (and torch.compile)
# covers every routing. Rows/columns past ``offs[-1]`` come out 0 (CPU leaves them uninitialized).
_GROUPED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
_CONTRACT_2D = (([1], [0]), ([], []))


def _check_grouped(a, b, offs, bias, out_dtype) -> None:
    """CPU's ``_grouped_mm_validate_inputs`` (memory-alignment checks aside: tpu has none)."""
    for name, x in (("mat_a", a), ("mat_b", b)):
        if x.dtype not in _GROUPED_DTYPES:
            raise RuntimeError(
                f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got {to_torch(x.dtype)}"
            )
        if x.ndim not in (2, 3):
            raise RuntimeError(f"{name} has to be 2 or 3d")
    if (a.ndim == 3 or b.ndim == 3) and a.shape[-1] != b.shape[-2]:
        raise RuntimeError("contraction dimension of mat_a and mat_b must match")
    if (offs is not None) != (a.ndim == 2 or b.ndim == 2):
        raise RuntimeError(
            "Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d"
        )
    if offs is not None and offs.ndim != 1:
        raise RuntimeError("offs has to be 1D")
    if offs is not None and offs.dtype != jnp.int32:
        raise RuntimeError("Offsets have to be int32")
    if bias is not None:
        raise RuntimeError("Bias not supported yet")
    if out_dtype is not None and out_dtype != a.dtype:
        raise RuntimeError("Grouped gemm output dtype must match `mat_a` dtype")
    groups = {(2, 3): b.shape[0], (3, 2): a.shape[0]}.get((a.ndim, b.ndim))
    if groups is not None and offs.shape[0] != groups:
        raise RuntimeError("matrix batch sizes have to match")
    if a.ndim == b.ndim == 3 and a.shape[0] != b.shape[0]:
        raise RuntimeError("batched dimension has to match")
    _check_dtypes("_grouped_mm", a, b)


def _ragged(a, b, offs, dimension_numbers=None):
    """``ragged_dot(_general)`` of groups given by end offsets, accumulated in opmath."""
    sizes = jnp.diff(offs, prepend=jnp.zeros(1, offs.dtype))
    options = dict(precision=matmul_precision(a.dtype), preferred_element_type=accumulator(a.dtype))
    if dimension_numbers is None:
        return lax.ragged_dot(a, b, sizes, **options)
    return lax.ragged_dot_general(a, b, sizes, dimension_numbers, **options)


def _grouped_product(a, b, offs):
    if a.ndim == 3 and b.ndim == 3:  # no groups to find: a batched product
        return _product("gmk,gkn->gmn", a, b)
    if b.ndim == 3:  # (m, k) x (g, k, n): groups of rows of a, each times its own matrix of b
        return _ragged(a, b, offs)
    if a.ndim == 3:  # (g, m, k) x (k, n): groups of columns of b, each column's product picked
        # from its group's (no MoE layer uses this layout; ragged_dot needs a transposed
        # result here, which XLA:CPU folds into a bfloat16 dot it cannot run)
        before_end = jnp.arange(b.shape[1]) < offs[:, None]
        in_group = before_end & ~jnp.concatenate([jnp.zeros_like(before_end[:1]), before_end[:-1]])
        return jnp.where(in_group[:, None, :], _product("gmk,kn->gmn", a, b), 0).sum(0)
    # (m, k) x (k, n) -> (g, m, n): groups along the contraction (the weight gradient)
    return _ragged(
        a,
        b,
        offs,
        lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=_CONTRACT_2D, lhs_ragged_dimensions=[1], rhs_group_dimensions=[]
        ),
    )


@lower(aten._grouped_mm.default)
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    _check_grouped(a, b, offs, bias, out_dtype)
    return _grouped_product(a, b, offs).astype(a.dtype)


def _grouped_mm_shape(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``_grouped_mm``'s shape function for fake tensors (torch.compile). PyTorch's meta kernel
    only accepts bfloat16 (its CUDA kernel's limit), which would keep float32 MoE models on tpu
    from tracing, so tpu tensors get the result's shape here (the lowering checks the arguments
    when the compiled program is traced) and other devices keep PyTorch's meta kernel.
    ``register_fake`` also takes over the op's meta kernel; registering again replaces it."""
    if a.device.type != "tpu":
        return _torch_grouped_mm_meta(a, b, offs=offs, bias=bias, out_dtype=out_dtype)
    torch._check(
        (offs is not None) == (a.dim() == 2 or b.dim() == 2),
        lambda: "Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d",
    )
    if a.dim() == b.dim() == 3:
        shape = (a.shape[0], a.shape[1], b.shape[2])
    elif a.dim() == b.dim() == 2:
        shape = (offs.shape[0], a.shape[0], b.shape[1])
    else:
        shape = (a.shape[-2], b.shape[-1])
    return a.new_empty(shape, dtype=out_dtype or a.dtype)


_torch_grouped_mm_meta = torch._meta_registrations.meta_grouped_mm
torch.library.register_fake("aten::_grouped_mm", _grouped_mm_shape)


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


@lower(aten.linalg_cholesky_ex.default, runs=Runs.HOST, layout=Layout.META)
def linalg_cholesky_ex(a, upper=False, check_errors=False):
    factor, info = _cholesky(a)
    _raise_if_failed(
        check_errors,
        info,
        "linalg.cholesky: The factorization could not be "
        "completed because the input is not positive-definite (the leading minor "
        "of order {} is not positive-definite).",
    )
    return (_mT(factor) if upper else factor), info


@jax.jit
def _lu(a):
    """LU with partial pivoting: packed factors, 1-based int32 pivots (LAPACK's), info."""
    lu, pivots, _ = lax.linalg.lu(a)
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return lu, (pivots + 1).astype(jnp.int32), _first_failure(diagonal == 0)


@lower(aten.linalg_lu_factor_ex.default, runs=Runs.HOST, layout=Layout.META)
def linalg_lu_factor_ex(a, pivot=True, check_errors=False):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
    lu, pivots, info = _lu(a)
    _raise_if_failed(
        check_errors, info, "linalg.lu_factor: U[{0},{0}] is zero and therefore the matrix is singular."
    )
    return lu, pivots, info


def _factored_transpose(op):
    """A kernel for ``op(A) -> (..., LU, pivots)``. torch factors A^T when A is contiguous and
    real (a copy-free LAPACK layout), and its backward formulas read LU that way, so the
    kernel must know A's strides: it is a runtime entry around a pure, jitted ``fn(A, A_T)``."""

    def register(fn):
        jitted = jax.jit(fn, static_argnums=1)

        def kernel(a):
            factor_transpose = a.is_contiguous() and not a.is_complex()
            outputs = apply(jitted, tensor.read(a), factor_transpose)
            return tuple(layout.wrap(op, Layout.META, outputs, (a,), {}))

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
lower(aten.linalg_lu_solve.default, layout=Layout.META)(_lu_solve)


@lower(aten.linalg_inv_ex.default, runs=Runs.HOST, layout=Layout.META)
def linalg_inv_ex(a, check_errors=False):
    lu, pivots, info = _lu(a)
    _raise_if_failed(
        check_errors,
        info,
        "linalg.inv: The diagonal element {} is zero, the "
        "inversion could not be completed because the input matrix is singular.",
    )
    identity = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return _jit_lu_solve(lu, pivots, identity), info


@lower(aten._linalg_solve_ex.default, runs=Runs.HOST, layout=Layout.META)
def linalg_solve_ex(a, b, left=True, check_errors=False):
    """torch.linalg.solve: ``b`` is a (batch of) vector(s) when it has one dim less than ``a``."""
    lu, pivots, info = _lu(a)
    _raise_if_failed(
        check_errors, info, "torch.linalg.solve: The solver failed because the input matrix is singular."
    )
    vector = left and (b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1]))
    solution = _jit_lu_solve(lu, pivots, b[..., None] if vector else b, left, False)
    return (solution[..., 0] if vector else solution), lu, pivots, info


def _triangular_solve(a, b, upper, left, unitriangular, transpose=False):
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    return lax.linalg.triangular_solve(
        a, b, left_side=left, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular
    ), a


@lower(aten.linalg_solve_triangular.default, layout=Layout.META)
def linalg_solve_triangular(a, b, upper, left=True, unitriangular=False):
    return _triangular_solve(a, b, upper, left, unitriangular)[0]


@lower(aten.triangular_solve.default, layout=Layout.META)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    solution, a = _triangular_solve(a, b, upper, True, unitriangular, transpose)
    return solution, a


@lower(aten.linalg_qr.default, layout=Layout.META)
def linalg_qr(a, mode="reduced"):
    if mode == "r":
        return jnp.zeros((0,), a.dtype), jnp.linalg.qr(a, mode="r")
    return jnp.linalg.qr(a, mode=mode)


@lower(aten._linalg_svd.default, layout=Layout.COLUMN_MAJOR)
def linalg_svd(a, full_matrices=False, compute_uv=True, driver=None):
    require(jnp.issubdtype(a.dtype, jnp.inexact))
    if not compute_uv:
        empty = jnp.zeros((0,), a.dtype)
        return empty, jnp.linalg.svd(a, compute_uv=False), empty
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


@lower(aten._linalg_eigh.default, layout=Layout.META)
def linalg_eigh(a, UPLO="L", compute_v=True):
    values, vectors = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return values, (vectors if compute_v else jnp.zeros((0,), a.dtype))


@lower(aten.cholesky.default, runs=Runs.HOST, layout=Layout.META)
def cholesky(a, upper=False):
    """The deprecated ``torch.cholesky``: always checks, with torch's message for it."""
    factor, info = _cholesky(a)
    _raise_if_failed(
        True,
        info,
        "cholesky: The factorization could not be completed because "
        "the input is not positive-definite (the leading minor of order {} is not "
        "positive-definite).",
    )
    return _mT(factor) if upper else factor


def _cholesky_factor_solve(factor, b, upper):
    """Solve ``A X = B`` for ``A = L L^H`` (``U^H U`` when ``upper``) given the factor."""
    lower_factor = _mT(factor) if upper else factor
    half = lax.linalg.triangular_solve(lower_factor, b, left_side=True, lower=True)
    return lax.linalg.triangular_solve(
        lower_factor, half, left_side=True, lower=True, transpose_a=True, conjugate_a=True
    )


@lower(aten._cholesky_solve_helper.default)
def cholesky_solve_helper(b, factor, upper):
    return _cholesky_factor_solve(factor, b, upper)


@lower(aten.cholesky_inverse.default)
def cholesky_inverse(factor, upper=False):
    identity = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return _cholesky_factor_solve(factor, identity, upper)


def _permutation_matrix(pivots, rows: int, dtype):
    """P with ``A = P L U`` from LAPACK's 1-based row swaps: row ``i`` of ``P^T A`` is row
    ``perm[i]`` of A, so ``P[perm[i], i] = 1``."""
    perm = lax.linalg.lu_pivots_to_permutation(pivots - 1, rows)
    return jnp.swapaxes(jax.nn.one_hot(perm, rows, dtype=dtype), -1, -2)


def _unpack_factors(lu):
    """Unit lower ``L`` (m x k) and upper ``U`` (k x n) from packed m x n factors."""
    rows, cols = lu.shape[-2:]
    k = min(rows, cols)
    lower_part = jnp.tril(lu[..., :, :k], -1) + jnp.eye(rows, k, dtype=lu.dtype)
    return lower_part, jnp.triu(lu[..., :k, :])


@lower(aten.lu_unpack.default)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    empty = jnp.zeros((0,), lu.dtype)
    lower_part, upper_part = _unpack_factors(lu) if unpack_data else (empty, empty)
    permutation = _permutation_matrix(pivots, lu.shape[-2], lu.dtype) if unpack_pivots else empty
    return permutation, lower_part, upper_part


@lower(aten.linalg_lu.default)
def linalg_lu(a, pivot=True):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")
    lu, pivots, _ = _lu(a)
    return lu_unpack(lu, pivots)


@lower(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    """Scaling and squaring with Pade approximants; half types run in float32."""
    require(jnp.issubdtype(a.dtype, jnp.inexact))
    if not a.shape[-1]:
        return a
    return jax.scipy.linalg.expm(a.astype(accumulator(a.dtype))).astype(a.dtype)


@lower(aten.trace.default)
def trace(a):
    _check_ranks("trace", (a, 2))
    diagonal = jnp.diagonal(a)
    integral = jnp.issubdtype(a.dtype, jnp.integer) or a.dtype == jnp.bool_
    result = jnp.int64 if integral else a.dtype
    return jnp.sum(diagonal.astype(accumulator(result)), dtype=accumulator(result)).astype(result)


@lower(aten.linalg_cross.default)
def linalg_cross(a, b, dim=-1):
    if a.ndim != b.ndim:
        raise RuntimeError("linalg.cross: inputs must have the same number of dimensions.")
    axis = wrap_dim(dim, a.ndim)
    if a.shape[axis] != 3 or b.shape[axis] != 3:
        lengths = f"{a.shape[axis]} and {b.shape[axis]}"
        raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got {lengths}")
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    a, b = jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)
    return jnp.cross(a, b, axis=dim)


@lower(aten._int_mm.default)
def int_mm(a, b):
    _check_ranks("_int_mm", (a, 2), (b, 2))
    return jnp.matmul(a, b, preferred_element_type=jnp.int32)


@lower(aten._compute_linear_combination.default)
def compute_linear_combination(x, coefficients):
    """``out[i] = sum_j coefficients[i, j] * x[j]``."""
    flat = x.reshape(x.shape[0], -1)
    combined = jnp.einsum("ij,jk->ik", coefficients, flat, precision=HIGHEST)
    return combined.reshape((coefficients.shape[0],) + x.shape[1:]).astype(x.dtype)


@lower(aten.block_diag.default)
def block_diag(tensors):
    dtype = to_jax(functools.reduce(torch.promote_types, (to_torch(t.dtype) for t in tensors)))
    blocks = [t.reshape((1,) * (2 - t.ndim) + t.shape) for t in tensors]
    rows, cols = sum(b.shape[0] for b in blocks), sum(b.shape[1] for b in blocks)
    result = jnp.zeros((rows, cols), dtype)
    row = col = 0
    for b in blocks:
        result = result.at[row : row + b.shape[0], col : col + b.shape[1]].set(b.astype(result.dtype))
        row, col = row + b.shape[0], col + b.shape[1]
    return result


@runtime(aten._linalg_check_errors.default)
def linalg_check_errors(info: torch.Tensor, api_name: str, *, is_matrix: bool) -> None:
    """Raise as torch CPU would for nonzero LAPACK ``info``: its own check, on a host copy."""
    aten._linalg_check_errors.default(info.cpu(), api_name, is_matrix=is_matrix)


# ----------------------------------------------------------------------------- Householder QR
@lower(aten.geqrf.default)
def geqrf(a):
    """LAPACK's QR: R above the diagonal, Householder vectors (unit first entry implied) below
    it and their scalars ``tau``, so ``Q = H_1 ... H_k`` with ``H_i = I - tau_i v_i v_i^H``."""
    packed, tau = _lapack_geqrf(a)
    return packed, tau


@lower(aten.linalg_householder_product.default, layout=Layout.META)
def linalg_householder_product(a, tau):
    return lax.linalg.householder_product(a, tau)


@lower(aten.ormqr.default, layout=Layout.META)
def ormqr(a, tau, other, left=True, transpose=False):
    """``op(Q) C`` (or ``C op(Q)``) for Q from ``geqrf``'s vectors, ``op`` the adjoint when
    ``transpose``. Q is m x m: the missing reflectors are identities (tau 0)."""
    if a.ndim < 2:
        raise RuntimeError("torch.ormqr: input must have at least 2 dimensions.")
    side = -2 if left else -1
    if other.ndim >= 2 and tau.ndim and tau.shape[-1] != min(other.shape[side], a.shape[-1]):
        raise RuntimeError(
            f"torch.ormqr: tau.shape[-1] must be equal to min(other.shape[{side}], input.shape[-1])"
        )
    rows = a.shape[-2]
    padding = [(0, 0)] * (a.ndim - 1)
    full_vectors = jnp.pad(a[..., :rows], padding + [(0, rows - min(rows, a.shape[-1]))])
    full_tau = jnp.pad(tau, padding[:-1] + [(0, rows - tau.shape[-1])])
    q = lax.linalg.householder_product(full_vectors, full_tau)
    q = _mT(q) if transpose else q
    return _product("...ij,...jk->...ik", q, other) if left else _product("...ij,...jk->...ik", other, q)


# ----------------------------------------------------------------------------- least squares
_RESIDUAL_DRIVERS = ("gels", "gelsd", "gelss")  # gelsy's output never holds the residuals
_RANK_DRIVERS = ("gelsy", "gelsd", "gelss")
_SINGULAR_VALUE_DRIVERS = ("gelsd", "gelss")


@jax.jit
def _svd_least_squares(a, b, rcond):
    """Minimum-norm least-squares solution from the SVD, the rank it uses and the singular values."""
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    keep = s > rcond * s[..., :1]
    inverse_s = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
    projected = _product("...ji,...jk->...ik", jnp.conj(u), b) * inverse_s[..., :, None]
    solution = _product("...ji,...jk->...ik", jnp.conj(vh), projected).astype(a.dtype)
    return solution, jnp.sum(keep, -1).astype(jnp.int64), s


def _check_lstsq(a, b, rcond=None, driver=None) -> None:
    """CPU's first argument checks, in its order (the lowering assumes them)."""
    if a.ndim < 2:
        raise RuntimeError("torch.linalg.lstsq: input must have at least 2 dimensions.")
    if b.ndim < 1:
        raise RuntimeError("torch.linalg.lstsq: other must have at least 1 dimension.")
    if a.dtype != b.dtype:
        raise RuntimeError(
            "torch.linalg.lstsq: Expected input and other to have the same dtype, but got input's dtype "
            f"{type_name(a.dtype)} and other's dtype {type_name(b.dtype)}"
        )
    if not 0 <= a.ndim - b.ndim <= 1:
        raise RuntimeError(
            "torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and "
            "(input.dim() - other.dim()) <= 1"
        )
    vector = b.ndim == a.ndim - 1
    if a.shape[-2] != b.shape[-1 if vector else -2]:
        raise RuntimeError(
            f"torch.linalg.lstsq: input.size(-2) should match other.size({-1 if vector else -2})"
        )
    if a.dtype not in (jnp.float32, jnp.float64, jnp.complex64, jnp.complex128):  # CPU's LAPACK dispatch
        raise RuntimeError("This function doesn't handle types other than float and double")


@lower(aten.linalg_lstsq.default, runs=Runs.HOST, check=_check_lstsq)
def linalg_lstsq(a, b, rcond=None, driver=None):
    driver = driver or "gelsy"
    rows, cols = a.shape[-2:]
    vector = b.ndim == a.ndim - 1
    b = b[..., None] if vector else b
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    if rcond is None:
        rcond = float(jnp.finfo(a.dtype).eps) * max(rows, cols)
    solution, rank, singular_values = _svd_least_squares(a, b, rcond)
    real = singular_values.dtype
    residuals = jnp.zeros((0,), real)
    full_rank = driver == "gels" or bool(jnp.all(rank == cols))
    if rows > cols and driver in _RESIDUAL_DRIVERS and full_rank:
        residual = _product("...ij,...jk->...ik", a, solution).astype(a.dtype) - b
        residuals = jnp.sum(jnp.abs(residual) ** 2, -2).astype(real)
    rank = rank if driver in _RANK_DRIVERS else jnp.zeros((0,), jnp.int64)
    if driver not in _SINGULAR_VALUE_DRIVERS:
        singular_values = jnp.zeros((0,), real)
    return (solution[..., 0] if vector else solution), residuals, rank, singular_values


# ----------------------------------------------------------------------------- distances
@lower(aten._euclidean_dist.default)
def euclidean_dist(x1, x2):
    """torch's matrix-product form: ``|a|^2 - 2 a.b + |b|^2`` as one product of padded
    operands, clamped at 0 (the same rounding as CPU, which is not that of the differences)."""
    norm1 = jnp.sum(x1 * x1, -1, keepdims=True)
    norm2 = jnp.sum(x2 * x2, -1, keepdims=True)
    padded1 = jnp.concatenate([x1 * -2, norm1, jnp.ones_like(norm1)], -1)
    padded2 = jnp.concatenate([x2, jnp.ones_like(norm2), norm2], -1)
    squared = _product("...ik,...jk->...ij", padded1, padded2).astype(x1.dtype)
    return jnp.sqrt(jnp.maximum(squared, 0))


def _p_norm(differences, p: float, axis: int = -1):
    """The p-norm of ``differences`` along ``axis``, with torch's limits for p = 0 and inf."""
    magnitude = jnp.abs(differences)
    if p == 0:
        return jnp.sum(magnitude != 0, axis).astype(differences.dtype)
    if p == math.inf:
        return jnp.max(magnitude, axis, initial=0)
    if p == 1:
        return jnp.sum(magnitude, axis)
    if p == 2:
        return jnp.sqrt(jnp.sum(magnitude * magnitude, axis))
    return jnp.sum(magnitude**p, axis) ** (1 / p)


def _p_norm_gradient(differences, distance, p: float):
    """d distance / d differences, zero where torch's kernels define it so (distance 0)."""
    if p == 0:
        return jnp.zeros_like(differences)
    if p == 1:
        return jnp.sign(differences)
    if p == math.inf:
        return jnp.sign(differences) * (jnp.abs(differences) == distance)
    safe = jnp.where(distance == 0, 1, distance)
    if p == 2:
        slope = differences / safe
    elif p < 2:
        slope = jnp.sign(differences) * jnp.abs(differences) ** (p - 1) / safe ** (p - 1)
        if p < 1:
            slope = jnp.where(differences == 0, 0, slope)
    else:
        slope = differences * jnp.abs(differences) ** (p - 2) / safe ** (p - 1)
    return jnp.where(distance == 0, 0, slope)


def _check_distance_p(name: str, p: float) -> None:
    if p < 0:
        raise RuntimeError(f"{name} only supports non-negative p values")


def _batched_pairs(x1, x2):
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    return jnp.broadcast_to(x1, batch + x1.shape[-2:]), jnp.broadcast_to(x2, batch + x2.shape[-2:])


@lower(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    """Row distances; p = 2 uses the matrix-product form where torch does (mode 1 always,
    the default mode beyond 25 rows), otherwise the differences' norm."""
    require(all(jnp.issubdtype(x.dtype, jnp.floating) for x in (x1, x2)))
    _check_distance_p("cdist", p)
    x1, x2 = _batched_pairs(x1, x2)
    mode = compute_mode or 0
    if p == 2 and (mode == 1 or (mode == 0 and max(x1.shape[-2], x2.shape[-2]) > 25)):
        return euclidean_dist(x1, x2)
    return _p_norm(x1[..., :, None, :] - x2[..., None, :, :], p)


@lower(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, distances):
    x1b, x2b = _batched_pairs(x1, x2)
    differences = x1b[..., :, None, :] - x2b[..., None, :, :]
    slope = _p_norm_gradient(differences, distances[..., None], p)
    # in the broadcast batch shape, as PyTorch's kernel returns it (autograd sums it to x1's)
    return jnp.sum(grad[..., None] * slope, -2).astype(x1.dtype)


def _pairs(rows: int):
    return jnp.triu_indices(rows, 1)


@lower(aten._pdist_forward.default)
def pdist_forward(x, p=2):
    _check_distance_p("pdist", p)
    first, second = _pairs(x.shape[0])
    return _p_norm(x[first] - x[second], p)


@lower(aten._pdist_backward.default)
def pdist_backward(grad, x, p, distances):
    first, second = _pairs(x.shape[0])
    contribution = grad[:, None] * _p_norm_gradient(x[first] - x[second], distances[:, None], p)
    return jnp.zeros_like(x).at[first].add(contribution).at[second].add(-contribution)


@lower(aten.renorm.default, static=("p", "maxnorm"))
def renorm(x, p, dim, maxnorm):
    """Scale each slice along ``dim`` whose p-norm exceeds ``maxnorm`` to (just under) it;
    the norm and scale are computed in float32 for half types, as on CPU."""
    if p <= 0:
        raise RuntimeError("renorm: non-positive-norm not supported")
    if maxnorm < 0:
        raise RuntimeError(f"renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    if x.ndim < 2:
        raise RuntimeError(f"renorm: input needs at least 2 dimensions, got {x.ndim} dimensions")
    dim = dim % x.ndim
    wide = accumulator(x.dtype)
    norm = linalg_vector_norm(x.astype(wide), p, tuple(d for d in range(x.ndim) if d != dim), True, None)
    maxnorm = jnp.asarray(maxnorm, norm.dtype)
    factor = jnp.where(norm > maxnorm, maxnorm / (norm + 1e-7), 1).astype(x.dtype)
    return x * factor


@lower(aten.dist.default, promote=Promote.DEFAULT, promote_args=("self", "other"), static=("p",), pad=None)
def dist(a, b, p=2, *, types):
    difference = a.astype(types.compute) - b.astype(types.compute)
    return linalg_vector_norm(difference.astype(types.result), p, None, False, None)


# ----------------------------------------------------------------------------- LDL (Bunch-Kaufman)
# LAPACK's sytf2/hetf2 with uplo 'L', step for step, so the pivots and the packed factors are
# CPU's: the trailing matrix is kept full (Hermitian) so a symmetric interchange is a plain row
# and column swap; the processed columns hold L below the diagonal and D on it (2x2 blocks on
# the subdiagonal too). Complex symmetric pivoting measures |re| + |im| like LAPACK's izamax.
_BUNCH_KAUFMAN_ALPHA = (1 + math.sqrt(17)) / 8


def _pivot_size(x):
    if jnp.iscomplexobj(x):
        return jnp.abs(x.real) + jnp.abs(x.imag)
    return jnp.abs(x)


def _diagonal_size(x, hermitian: bool):
    return jnp.abs(x.real) if hermitian and jnp.iscomplexobj(x) else _pivot_size(x)


def _full_from_lower(a, hermitian: bool):
    conj = jnp.conj if hermitian else (lambda x: x)
    full = jnp.tril(a) + conj(jnp.swapaxes(jnp.tril(a, -1), -1, -2))
    return _real_diagonal(full) if hermitian else full


def _real_diagonal(a):
    if not jnp.iscomplexobj(a):
        return a
    n = a.shape[-1]
    return jnp.where(jnp.eye(n, dtype=bool), a.real.astype(a.dtype), a)


def _swap(x, i, j, axis):
    """Swap indices ``i`` and ``j`` along ``axis`` (a symmetric interchange is one per axis)."""
    order = jnp.arange(x.shape[axis])
    order = jnp.where(order == i, j, jnp.where(order == j, i, order))
    return jnp.take(x, order, axis=axis)


def _ldl_step(hermitian: bool):
    conj = jnp.conj if hermitian else (lambda x: x)

    def step(state):
        a, pivots, k, info = state
        n = a.shape[-1]
        index = jnp.arange(n)
        column = a[:, k]
        below = index > k
        column_sizes = jnp.where(below, _pivot_size(column), -1)
        imax = jnp.argmax(column_sizes)
        colmax = jnp.maximum(column_sizes[imax], 0)
        absakk = _diagonal_size(a[k, k], hermitian)
        singular = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        # largest off-diagonal size in row/column imax of the trailing matrix
        row = a[imax, :]
        rowmax = jnp.max(jnp.where((index >= k) & (index != imax), _pivot_size(row), 0))
        keep = (absakk >= _BUNCH_KAUFMAN_ALPHA * colmax) | (
            absakk * rowmax >= _BUNCH_KAUFMAN_ALPHA * colmax * colmax
        )
        take_imax = _diagonal_size(a[imax, imax], hermitian) >= _BUNCH_KAUFMAN_ALPHA * rowmax
        two = ~singular & ~keep & ~take_imax
        kp = jnp.where(singular | keep, k, imax)
        kk = k + two.astype(k.dtype)
        # interchange kk and kp in the trailing matrix (rows and columns >= k)
        trailing = (index >= k)[:, None] & (index >= k)[None, :]
        swapped = _swap(_swap(a, kk, kp, 0), kk, kp, 1)
        a = jnp.where(trailing, swapped, a)
        a = jnp.where(singular, state[0], a)
        one_update = _rank_one_update(a, k, index, conj, hermitian)
        two_update = _rank_two_update(a, k, index, conj, hermitian)
        updated = jnp.where(two, two_update, one_update)
        a = jnp.where(singular, a, updated)
        code = jnp.where(two, -(kp + 1), kp + 1).astype(jnp.int32)
        pivots = pivots.at[k].set(code)
        pivots = jnp.where(two, pivots.at[k + 1].set(code), pivots)
        info = jnp.where(singular & (info == 0), k + 1, info).astype(jnp.int32)
        return a, pivots, k + 1 + two.astype(k.dtype), info

    return step


def _rank_one_update(a, k, index, conj, hermitian):
    """1x1 pivot: ``A22 -= x x^H / d``, then column k below the diagonal becomes ``x / d``."""
    pivot = a[k, k].real.astype(a.dtype) if hermitian else a[k, k]
    inverse = 1 / pivot
    x = jnp.where(index > k, a[:, k], 0)
    scaled = -inverse * conj(x)
    rest = (index > k)[:, None] & (index > k)[None, :]
    a = jnp.where(rest, a + x[:, None] * scaled[None, :], a)
    a = _full_from_lower(a, hermitian)  # the lower part is LAPACK's
    return jnp.where((index > k)[:, None] & (index == k)[None, :], (x * inverse)[:, None], a)


def _rank_two_update(a, k, index, conj, hermitian):
    """2x2 pivot on rows/columns k, k+1, as LAPACK's sytf2/hetf2 write it."""
    k1 = k + 1
    rest = index > k1
    d21 = a[k1, k]
    if hermitian:
        magnitude = jnp.abs(d21)
        d11, d22 = a[k1, k1].real / magnitude, a[k, k].real / magnitude
        unit = d21 / magnitude
        scale = (1 / (d11 * d22 - 1)) / magnitude
        wk = scale * (d11 * a[:, k] - unit * a[:, k1])
        wkp1 = scale * (d22 * a[:, k1] - jnp.conj(unit) * a[:, k])
    else:
        d11, d22 = a[k1, k1] / d21, a[k, k] / d21
        scale = (1 / (d11 * d22 - 1)) / d21
        wk = scale * (d11 * a[:, k] - a[:, k1])
        wkp1 = scale * (d22 * a[:, k1] - a[:, k])
    wk, wkp1 = jnp.where(rest, wk, 0), jnp.where(rest, wkp1, 0)
    block = rest[:, None] & rest[None, :]
    update = a[:, k][:, None] * conj(wk)[None, :] + a[:, k1][:, None] * conj(wkp1)[None, :]
    a = jnp.where(block, a - update, a)
    a = _full_from_lower(a, hermitian)  # the lower part is LAPACK's
    a = jnp.where(rest[:, None] & (index == k)[None, :], wk[:, None], a)
    return jnp.where(rest[:, None] & (index == k1)[None, :], wkp1[:, None], a)


@functools.partial(jax.jit, static_argnums=1)
def _ldl_factor(a, hermitian: bool):
    n = a.shape[-1]
    batch = a.shape[:-2]
    if n == 0:
        return a, jnp.zeros(batch + (0,), jnp.int32), jnp.zeros(batch, jnp.int32)

    def factor(matrix):
        state = (_full_from_lower(matrix, hermitian), jnp.zeros(n, jnp.int32), jnp.int32(0), jnp.int32(0))
        packed, pivots, _, info = lax.while_loop(lambda s: s[2] < n, _ldl_step(hermitian), state)
        return jnp.tril(packed), pivots, info

    flat = a.reshape((math.prod(batch), n, n))
    packed, pivots, info = jax.vmap(factor)(flat)
    return packed.reshape(a.shape), pivots.reshape(batch + (n,)), info.reshape(batch)


@lower(aten.linalg_ldl_factor_ex.default, runs=Runs.HOST, layout=Layout.META)
def linalg_ldl_factor_ex(a, hermitian=False, check_errors=False):
    packed, pivots, info = _ldl_factor(a, hermitian and jnp.iscomplexobj(a))
    if check_errors:
        aten._linalg_check_errors.default(
            torch.from_numpy(jax.device_get(info).copy()), "torch.linalg.ldl_factor_ex", is_matrix=a.ndim == 2
        )
    return packed, pivots, info


def _ldl_solve_one(packed, pivots, b, hermitian: bool):
    """LAPACK's sytrs/hetrs (uplo 'L'): undo ``P L`` forwards with D, then ``L^T P^T`` backwards."""
    n = packed.shape[-1]
    conj = jnp.conj if hermitian else (lambda x: x)
    index = jnp.arange(n)

    def forward(state):
        b, k = state
        two = pivots[k] < 0
        kk = k + two.astype(k.dtype)
        b = _swap(b, kk, jnp.abs(pivots[k]) - 1, 0)
        rest = (index > kk)[:, None]
        b = b - jnp.where(rest, packed[:, k, None] * b[k] + jnp.where(two, packed[:, kk, None] * b[kk], 0), 0)
        # 1x1: b_k /= d; 2x2: solve [[d_kk, conj(e)], [e, d_k1k1]] against rows k, k+1
        e = packed[kk, k]
        first = packed[k, k] / conj(e)
        second = packed[kk, kk] / e
        denominator = first * second - 1
        bk, bk1 = b[k] / conj(e), b[kk] / e
        two_k = (second * bk - bk1) / denominator
        two_k1 = (first * bk1 - bk) / denominator
        pivot = packed[k, k].real.astype(b.dtype) if hermitian else packed[k, k]
        b = b.at[k].set(jnp.where(two, two_k, b[k] / pivot))
        b = b.at[kk].set(jnp.where(two, two_k1, b[kk]))
        return b, kk + 1

    def backward(state):
        b, k = state  # k: the last row of the current block
        two = (k > 0) & (pivots[k] < 0)
        first = k - two.astype(k.dtype)
        rest = (index > k)[:, None]
        correction_k = jnp.sum(jnp.where(rest, conj(packed[:, k, None]) * b, 0), 0)
        correction_first = jnp.sum(jnp.where(rest, conj(packed[:, first, None]) * b, 0), 0)
        b = b.at[k].add(-correction_k)
        b = jnp.where(two, b.at[first].add(-correction_first), b)
        b = _swap(b, k, jnp.abs(pivots[k]) - 1, 0)
        return b, first - 1

    b, _ = lax.while_loop(lambda s: s[1] < n, forward, (b, jnp.int32(0)))
    b, _ = lax.while_loop(lambda s: s[1] >= 0, backward, (b, jnp.int32(n - 1)))
    return b


@lower(aten.linalg_ldl_solve.default, layout=Layout.META)
def linalg_ldl_solve(packed, pivots, b, hermitian=False):
    batch = jnp.broadcast_shapes(packed.shape[:-2], b.shape[:-2])
    n = packed.shape[-1]
    if n == 0:
        return jnp.broadcast_to(b, batch + b.shape[-2:])
    count = math.prod(batch)
    packed = jnp.broadcast_to(packed, batch + packed.shape[-2:]).reshape((count, n, n))
    pivots = jnp.broadcast_to(pivots, batch + pivots.shape[-1:]).reshape((count, n))
    flat_b = jnp.broadcast_to(b, batch + b.shape[-2:]).reshape((count,) + b.shape[-2:])
    solve = functools.partial(_ldl_solve_one, hermitian=hermitian and jnp.iscomplexobj(packed))
    return jax.vmap(solve)(packed, pivots, flat_b).reshape(batch + b.shape[-2:])


# ----------------------------------------------------------------------------- float8 products
def _scaling_error(a, b, scale_a, scale_b) -> ValueError:
    """CPU's ValueError for scales that fit no scaling (the meta kernel's checks are CUDA's)."""
    m, n = a.shape[0], b.shape[1]

    def described(name, x) -> str:
        strides = list(torch._prims_common.make_contiguous_strides_for(x.shape)) if x.ndim else []
        return (
            f"{name}.dtype()={type_name(x.dtype)}, {name}.size()={list(x.shape)}",
            f"{name}.stride()={strides}",
        )

    (a_dtype, a_stride), (b_dtype, b_stride) = described("scale_a", scale_a), described("scale_b", scale_b)
    return torchs_own(
        ValueError(
            "Invalid scaling configuration.\n"
            "- For TensorWise scaling, a and b should be float8, scales should be float and singletons.\n"
            "- For RowWise scaling, a and b should be float8, scales should be float, "
            f"scale_a should be ({m}, 1) and scale_b should be (1, {n}), and both should be contiguous.\n"
            f"Got mat_a.dtype()={type_name(a.dtype)}, {a_dtype}, {a_stride}, "
            f"mat_b.dtype()={type_name(b.dtype)}, {b_dtype} and {b_stride}"
        )
    )


def _check_scaled_mm(a, b, scale_a, scale_b) -> None:
    if a.ndim != 2:
        raise RuntimeError("mat1 must be a matrix")
    if b.ndim != 2:
        raise RuntimeError("mat2 must be a matrix")
    if a.shape[1] != b.shape[0]:
        raise RuntimeError(
            f"mat_a and mat_b shapes cannot be multiplied ({_sizes(a.shape)} and {_sizes(b.shape)})"
        )
    float8 = all(to_torch(x.dtype).is_floating_point and x.dtype.itemsize == 1 for x in (a, b))
    floats = scale_a.dtype == jnp.float32 and scale_b.dtype == jnp.float32
    tensorwise = scale_a.size == 1 and scale_b.size == 1
    rowwise = tuple(scale_a.shape) == (a.shape[0], 1) and tuple(scale_b.shape) == (1, b.shape[1])
    if not (float8 and floats and (tensorwise or rowwise)):
        raise _scaling_error(a, b, scale_a, scale_b)


@lower(aten._scaled_mm.default)
def scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    """``torch._scaled_mm`` as CPU computes it: the float8 operands' product in float32, times
    the scales (tensor-wise: one each; row-wise: ``[m, 1]`` and ``[1, n]``), plus ``bias``,
    divided by ``scale_result``, then converted to ``out_dtype`` (the operands' by default; into
    float8 saturating, as c10 does). ``use_fast_accum`` changes nothing here (CPU's neither)."""
    _check_scaled_mm(a, b, scale_a, scale_b)
    product = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    scale_a = scale_a.reshape(()) if scale_a.size == 1 else scale_a
    scale_b = scale_b.reshape(()) if scale_b.size == 1 else scale_b
    out = product * scale_a * scale_b
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    if scale_result is not None:
        out = out / scale_result.astype(jnp.float32).reshape(())
    return cast(out, a.dtype if out_dtype is None else out_dtype)


# ``_scaled_grouped_mm`` (float8 MoE experts, torchao's float8 MoE training): ``_grouped_mm``'s
# layouts on float8_e4m3fn operands with row-wise float32 scales, the products in float32, the
# result bfloat16. PyTorch has only a CUDA kernel; its checks (the meta kernel's) are followed
# here but for the memory layout ones (row-major ``a``, column-major ``b``, 16-byte strides),
# which tpu, with no layout constraints, does not need. MXFP8 (float8_e8m0fnu scales) is not
# supported.
def _check_scaled_grouped(a, b, scale_a, scale_b, offs, bias, scale_result, out_dtype) -> None:
    def check(ok: bool, message: str) -> None:
        if not ok:
            raise RuntimeError(message)

    check(
        a.dtype == b.dtype == jnp.float8_e4m3fn,
        "Expected inputs of E4M3 FP8 type but got "
        f"mat_a.dtype={to_torch(a.dtype)} and mat_b.dtype={to_torch(b.dtype)}.",
    )
    check(
        a.ndim in (2, 3) and b.ndim in (2, 3),
        f"Multiplicands must be 2D or 3D but got mat_a.dim()={a.ndim} and mat_b.dim()={b.ndim}",
    )
    check(
        a.ndim == b.ndim == 2 or a.shape[-1] == b.shape[-2],
        "contraction dimension of mat_a and mat_b must match",
    )
    check(
        scale_a.dtype == scale_b.dtype == jnp.float32,
        "For FP8 scales must both be float32, or for MXFP8 both scales must be float8_e8m0fnu. "
        f"Got scale_a.dtype={to_torch(scale_a.dtype)} and scale_b.dtype={to_torch(scale_b.dtype)}.",
    )
    groups = offs.shape[0] if offs is not None and a.ndim == b.ndim == 2 else 1
    _check_group_scale("scale_a", scale_a, a, 0, groups, check)
    _check_group_scale("scale_b", scale_b, b, 1, groups, check)
    check(scale_result is None, "Scale result tensor provided, but it is not supported yet.")
    if a.ndim == 2 or b.ndim == 2:
        check(
            offs is not None,
            f"Offsets tensor not provided, but is needed for {a.ndim}D/{b.ndim}D multiplicand layouts.",
        )
        check(offs.ndim == 1, f"Offsets tensor must be 1D, but got offs.dim()={offs.ndim}.")
        check(
            offs.dtype == jnp.int32,
            f"Offsets tensor must be integer (int32) tensor, but got {to_torch(offs.dtype)}.",
        )
    else:
        check(offs is None, "Offsets tensor provided, but is not needed for 3D/3D multiplicand layouts.")
    check(bias is None, "Bias tensor provided, but it is not supported yet.")
    check(
        out_dtype is None or out_dtype == jnp.bfloat16, "If output dtype provided, it must be torch.bfloat16."
    )


def _check_group_scale(name, scale, mat, scaled_dim, groups, check) -> None:
    """A row-wise scale: one per row of ``a`` (``scaled_dim`` 0) or column of ``b`` (1), per group."""
    if mat.ndim == 2:
        check(scale.ndim == 1, f"Expected {name} to be 1D tensor, but got {scale.ndim}D tensor.")
        expected = mat.shape[scaled_dim] * groups
        check(
            scale.shape[0] == expected,
            f"Expected {name} to have {expected} elements, got {scale.shape[0]} elements.",
        )
        return
    check(
        scale.ndim >= 1 and scale.shape[0] == mat.shape[0],
        f"Expected {name} batch dimension to be {mat.shape[0]}, got {scale.shape[0] if scale.ndim else 0}.",
    )
    check(scale.ndim == 2, f"Expected {name} to be 2D tensor, but got {scale.ndim}D tensor.")
    expected = mat.shape[1 + scaled_dim]
    check(
        scale.shape[1] == expected,
        f"Expected {name} non-batch dimension to be {expected}, got {scale.shape[1]}.",
    )


def _group_of(positions: int, offs) -> jax.Array:
    """The group of each of ``positions`` rows (or columns) given groups' end offsets (the last
    group for those past ``offs[-1]``, whose products are 0)."""
    group = jnp.searchsorted(offs, jnp.arange(positions, dtype=offs.dtype), side="right")
    return jnp.minimum(group, offs.shape[0] - 1)


def _grouped_scales(a, b, scale_a, scale_b, offs):
    """``scale_a`` and ``scale_b`` broadcast against the grouped product's result."""
    if a.ndim == 3 and b.ndim == 3:  # (g, m, n): a scale per group and row, per group and column
        return scale_a[:, :, None], scale_b[:, None, :]
    if b.ndim == 3:  # (m, n): a row's scale of b is its group's
        return scale_a[:, None], scale_b[_group_of(a.shape[0], offs)]
    if a.ndim == 3:  # (m, n): a column's scale of a is its group's
        return scale_a[_group_of(b.shape[1], offs)].T, scale_b[None, :]
    groups = offs.shape[0]  # (g, m, n): groups along the contraction, each with its own scales
    return scale_a.reshape(groups, -1)[:, :, None], scale_b.reshape(groups, -1)[:, None, :]


@lower(aten._scaled_grouped_mm.default)
def scaled_grouped_mm(
    a, b, scale_a, scale_b, offs=None, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False
):
    """``torch._scaled_grouped_mm``: each group's float8 product in float32 (exact products of
    float8 values, float32 sums), times its row-wise scales, rounded to bfloat16."""
    _check_scaled_grouped(a, b, scale_a, scale_b, offs, bias, scale_result, out_dtype)
    product = _grouped_product(a.astype(jnp.float32), b.astype(jnp.float32), offs)
    row_scale, column_scale = _grouped_scales(a, b, scale_a, scale_b, offs)
    return (product * row_scale * column_scale).astype(jnp.bfloat16)
