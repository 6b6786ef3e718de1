"""The device value behind a tpu storage.

Every tpu tensor is a real PrivateUse1 ``TensorImpl`` whose 0-byte storage carries the data as a
Python attribute of its ``UntypedStorage`` object (PyTorch keeps that object alive exactly as long
as the StorageImpl, so the JAX buffer is freed with the last tensor that uses it).

The value is a ``jax.Array`` holding the storage's elements (natural shape of whoever wrote it last,
any dtype: readers reinterpret bytes as needed), :class:`Uninitialized` for ``torch.empty``,
which must not allocate and zero-fill a buffer that is about to be overwritten, or in fused eager
a :class:`~torch_tpu._graph.Deferred` value that its graph has not computed yet. Nothing outside
this module and ``_tensor`` should assume which.
"""
from __future__ import annotations

from typing import Union

import jax
import jax.numpy as jnp
import numpy as np

from ._graph import Deferred

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


Value = Union[jax.Array, Uninitialized, Deferred]


def get(storage) -> Value:
    value = getattr(storage, _ATTR)
    if type(value) is Deferred and value.value is not None:  # its graph has run
        value = value.value
        setattr(storage, _ATTR, value)
    return value


def get_array(storage) -> jax.Array | Deferred:
    """The storage value as an array (an uninitialized storage becomes zeros, like fresh HBM);
    in fused eager, possibly a :class:`Deferred` one."""
    value = get(storage)
    if type(value) is Uninitialized:
        value = value.materialize()
        setattr(storage, _ATTR, value)
    return value


_ARRAY = type(jnp.zeros(()))


def concrete(storage) -> jax.Array:
    """The storage value as a concrete array: the common case first (it already is one), else
    zeros for an uninitialized storage, or a fused graph's result (running the graph)."""
    value = getattr(storage, _ATTR)
    if type(value) is _ARRAY:
        return value
    value = get_array(storage)
    return value.concrete() if type(value) is Deferred else value


def put(storage, value: Value) -> None:
    setattr(storage, _ATTR, value)


def has_value(storage) -> bool:
    return hasattr(storage, _ATTR)


def nbytes(value: Value) -> int:
    return value.nbytes if type(value) is Uninitialized else value.size * value.dtype.itemsize
