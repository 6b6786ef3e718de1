"""Complex-number lowerings: building complex tensors and taking them apart (real/imag are
views, see ops/core.py's view_as_real)."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..runtime.dtypes import to_torch, type_name, unsupported
from ._helpers import unary
from ._nn_helpers import require
from .registry import OutDtype, Promote, lower, runtime

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
    """CPU's dtype checks (torch or JAX dtypes); two half tensors make a complex32 on CPU, a
    dtype tpu does not have: say so clearly (before tracing, where the dispatcher would turn it
    into a generic error)."""
    dtypes = [x.dtype if isinstance(x.dtype, torch.dtype) else to_torch(x.dtype) for x in (real, imag)]
    floats = (torch.float16, torch.float32, torch.float64)
    if dtypes[0] not in floats or dtypes[1] not in floats:
        raise RuntimeError(
            f"Expected both inputs to be Half, Float or Double tensors but got {type_name(dtypes[0])} and "
            f"{type_name(dtypes[1])}"
        )
    if dtypes[0] != dtypes[1]:
        real_name, imag_name = map(type_name, dtypes)
        raise RuntimeError(
            f"Expected object of scalar type {real_name} but got scalar type {imag_name} for second argument"
        )
    if dtypes[0] == torch.float16:
        raise unsupported(torch.complex32)


def _complex_of_parts(real, imag) -> torch.dtype:
    _check_parts(real, imag)  # first, as on CPU
    return real.dtype.to_complex()


#: complex/polar's out= rule, after their input checks
_COMPLEX_OUT = OutDtype(
    _complex_of_parts,
    lambda want, got: (
        f"Expected object of scalar type {type_name(want)} but got scalar type {type_name(got)} "
        "for argument 'out'"
    ),
)
lower(aten.complex.default, check=_check_parts, out_dtype=_COMPLEX_OUT)(_complex_pair)
lower(aten.polar.default, check=_check_parts, out_dtype=_COMPLEX_OUT)(
    lambda magnitude, phase: _complex_pair(magnitude * jnp.cos(phase), magnitude * jnp.sin(phase))
)
unary(aten._conj_physical.default, lambda x: jnp.conj(x) if _is_complex(x) else x)


@runtime(aten.conj_physical_.default)
def conj_physical_(x: torch.Tensor) -> torch.Tensor:
    """In place (PyTorch's composite calls a CPU-only stub): a no-op for real tensors."""
    return x.copy_(aten._conj_physical.default(x)) if x.is_complex() else x
