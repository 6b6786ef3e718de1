"""The device value behind a tpu storage.

Every tpu tensor is a real PrivateUse1 ``TensorImpl`` whose 0-byte storage carries the data as a
Python attribute of its ``UntypedStorage`` object (PyTorch keeps that object alive exactly as long
as the StorageImpl, so the JAX buffer is freed with the last tensor that uses it).

The value is a ``jax.Array`` holding the storage's elements (natural shape of whoever wrote it last,
any dtype: readers reinterpret bytes as needed), or :class:`Uninitialized` for ``torch.empty``,
which must not allocate and zero-fill a buffer that is about to be overwritten. Nothing outside
this module and ``_tensor`` should assume which; fused eager and sharding will add kinds.
"""
from __future__ import annotations

from typing import Union

import jax
import jax.numpy as jnp
import numpy as np

_ATTR = "_tpu_value"


class Uninitialized:
    """Storage of ``size`` elements of ``dtype`` that nobody has written yet."""

    __slots__ = ("size", "dtype")

    def __init__(self, size: int, dtype: np.dtype):
        self.size = size
        self.dtype = dtype

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def materialize(self) -> jax.Array:
        return jnp.zeros((self.size,), self.dtype)


Value = Union[jax.Array, Uninitialized]


def get(storage) -> Value:
    return getattr(storage, _ATTR)


def get_array(storage) -> jax.Array:
    """The storage value as an array (an uninitialized storage becomes zeros, like fresh HBM)."""
    value = getattr(storage, _ATTR)
    if type(value) is Uninitialized:
        value = value.materialize()
        setattr(storage, _ATTR, value)
    return value


def put(storage, value: Value) -> None:
    setattr(storage, _ATTR, value)


def has_value(storage) -> bool:
    return hasattr(storage, _ATTR)


def nbytes(value: Value) -> int:
    return value.nbytes if type(value) is Uninitialized else value.size * value.dtype.itemsize
