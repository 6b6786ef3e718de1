"""The dtypes tpu tensors support, and their torch <-> JAX mapping."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

TORCH_TO_JAX: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(jnp.bool_),
    torch.uint8: np.dtype(jnp.uint8),
    torch.int8: np.dtype(jnp.int8),
    torch.int16: np.dtype(jnp.int16),
    torch.int32: np.dtype(jnp.int32),
    torch.int64: np.dtype(jnp.int64),
    torch.float16: np.dtype(jnp.float16),
    torch.bfloat16: np.dtype(jnp.bfloat16),
    torch.float32: np.dtype(jnp.float32),
    torch.float64: np.dtype(jnp.float64),
    torch.complex64: np.dtype(jnp.complex64),
}
JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_JAX.items()}


class UnsupportedDtypeError(TypeError):
    """A dtype tpu has no storage for (complex128, complex32, float8...)."""


def unsupported(dtype: object) -> TypeError:
    names = ", ".join(str(d).removeprefix("torch.") for d in TORCH_TO_JAX)
    return UnsupportedDtypeError(f"tpu does not support dtype {dtype}; supported dtypes: {names}")


def to_jax(dtype: torch.dtype) -> np.dtype:
    """JAX dtype for a torch dtype; TypeError naming the dtype if tpu has no such dtype."""
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise unsupported(dtype) from None


def to_torch(dtype: np.dtype) -> torch.dtype:
    try:
        return JAX_TO_TORCH[np.dtype(dtype)]
    except KeyError:
        raise unsupported(dtype) from None


_SCALAR_TYPE_NAMES = {
    torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short",
    torch.int32: "Int", torch.int64: "Long", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.float32: "Float", torch.float64: "Double", torch.complex64: "ComplexFloat",
}


def type_name(dtype) -> str:
    """PyTorch's C++ name for a torch or JAX dtype (``Long``), as its error messages spell it."""
    if not isinstance(dtype, torch.dtype):
        dtype = to_torch(dtype)
    return _SCALAR_TYPE_NAMES[dtype]
