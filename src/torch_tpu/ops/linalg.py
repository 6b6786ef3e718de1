"""Matrix products (mm, bmm, addmm and relatives) and linear-algebra decompositions.

Products run at ``Precision.HIGHEST`` so float32 is true float32 on every backend (a TPU would
otherwise use bfloat16 passes), and float16/bfloat16 accumulate in float32 like torch CPU.
Integer products are exact; bool products are not implemented, as on CPU.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .._dtypes import to_torch
from .._registry import lower
from ._helpers import accumulator, type_name

aten = __import__("torch").ops.aten
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
    """``beta * bias + alpha * product``; ``beta == 0`` ignores ``bias`` (NaN/inf included)."""
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
    return (jax.nn.gelu(wide, approximate=False) if use_gelu else jax.nn.relu(wide)).astype(out.dtype)
