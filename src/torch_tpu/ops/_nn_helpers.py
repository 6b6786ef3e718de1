"""Private helpers shared by the nn, losses and pooling lowerings."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_HALF_TYPES = (jnp.float16, jnp.bfloat16)
REDUCTIONS = ("none", "mean", "sum")  # at::Reduction enum order


def compute_dtype(dtype) -> np.dtype:
    """PyTorch's opmath type: half types compute in float32."""
    return jnp.dtype(jnp.float32) if dtype in _HALF_TYPES else jnp.dtype(dtype)


def vjp(fn, primals, cotangent, mask):
    """Gradients of ``fn`` at ``primals`` for the entries ``mask`` asks for (None elsewhere)."""
    _, pullback = jax.vjp(fn, *primals)
    grads = pullback(cotangent)
    return tuple(g if wanted else None for g, wanted in zip(grads, mask))


def require(valid: bool) -> None:
    """Rejects arguments PyTorch rejects, at trace time (shapes are static, so this costs
    nothing per call). The ValueError makes the dispatcher replay the call on PyTorch's meta
    kernels, which raise PyTorch's own error."""
    if not valid:
        raise ValueError("invalid arguments")


def wrap_dim(dim: int, ndim: int) -> int:
    bound = max(ndim, 1)
    if not -bound <= dim < bound:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], but got {dim})"
        )
    return dim % bound


def ntuple(value, n: int):
    """An ``int[n]`` argument as n ints (PyTorch lets a single value stand for all)."""
    value = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    return value * n if len(value) == 1 else value
