"""Complex-number lowerings: building complex tensors and taking them apart (real/imag are
views, see ops/core.py's view_as_real)."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..runtime.dtypes import type_name, unsupported
from ._helpers import unary
from ._nn_helpers import require
from .registry import Promote, lower, runtime

aten = torch.ops.aten


def _is_complex(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


@lower(aten.angle.default, promote=Promote.INT_TO_FLOAT, promote_args=("self",))
def angle(x, *, types):
    """The argument of a complex number; for reals PyTorch's 0 or pi by sign (NaN kept)."""
    x = x.astype(types.compute)
    if _is_complex(x):
        return jnp.angle(x).astype(jnp.finfo(types.result).dtype)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0)).astype(types.result)


def _complex_pair(real, imag):
    """``real + i imag`` for two equal-dtype float tensors (PyTorch does not promote here)."""
    require(real.dtype == imag.dtype and jnp.issubdtype(real.dtype, jnp.floating))
    return lax.complex(*jnp.broadcast_arrays(real, imag))


def _check_parts(real, imag) -> None:
    """CPU's dtype check; two half tensors make a complex32 on CPU, a dtype tpu does not have:
    say so clearly (before tracing, where the dispatcher would turn it into a generic error)."""
    floats = (jnp.float16, jnp.float32, jnp.float64)
    if real.dtype not in floats or imag.dtype not in floats:
        raise RuntimeError(
            "Expected both inputs to be Half, Float or Double tensors but got "
            f"{type_name(real.dtype)} and {type_name(imag.dtype)}"
        )
    if real.dtype == imag.dtype == jnp.float16:
        raise unsupported(torch.complex32)


lower(aten.complex.default, check=_check_parts)(_complex_pair)
lower(aten.polar.default, check=_check_parts)(
    lambda magnitude, phase: _complex_pair(magnitude * jnp.cos(phase), magnitude * jnp.sin(phase))
)
unary(aten._conj_physical.default, lambda x: jnp.conj(x) if _is_complex(x) else x)


@runtime(aten.conj_physical_.default)
def conj_physical_(x: torch.Tensor) -> torch.Tensor:
    """In place (PyTorch's composite calls a CPU-only stub): a no-op for real tensors."""
    return x.copy_(aten._conj_physical.default(x)) if x.is_complex() else x
