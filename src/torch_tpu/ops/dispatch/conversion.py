"""How a kernel's arguments become a lowering's: tensors as arrays (or views for the program to
read), Python numbers as cached device scalars, static arguments as hashable values."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ...runtime import checks, tensor, transfer
from ...runtime.buffer import Deferred
from ...runtime.context import context
from ...runtime.dtypes import check_scalar, sure_fits, to_jax
from .errors import device_mismatch

_COMPLEX = (torch.complex64, torch.complex128)
#: The Python number types a Scalar argument may be.
NUMBERS = (bool, int, float, complex)


def to_jax_arg(x: Any, index: int = 0) -> Any:
    """A tensor argument of an op on ``tpu:index`` as an array."""
    value = tensor.whole_value(x)  # (the common case in one call)
    if value is not None:
        return value
    if not isinstance(x, torch.Tensor):  # None, or a number PyTorch unwrapped from a wrapped number
        return None if x is None else number(x, index)  # a runtime value: ``x + step`` compiles once
    if x.is_cpu:
        if x.dim() == 0:  # a CPU scalar tensor may join a device op, as on CUDA (read on the host:
            return x.item()  # some ops take only such a number, ``randint_like``'s ``high``)
        raise device_mismatch(x, index)
    if x.is_meta:  # (is_cpu/is_meta are cheap flags; reading .device builds an object)
        raise device_mismatch(x, index)
    if x.dtype in _COMPLEX:  # only complex views carry lazy conjugate/negative bits
        return tensor.read_resolved(x)
    return tensor.read(x)


def to_program_arg(x: Any, index: int = 0) -> Any:
    """:func:`to_jax_arg`, a view perhaps left for the op's program to read
    (``tensor.read_in_program``)."""
    value = tensor.whole_value(x)
    if value is not None:
        return value
    if isinstance(x, torch.Tensor) and not (x.is_cpu or x.is_meta) and x.dtype not in _COMPLEX:
        return tensor.read_in_program(x)
    return to_jax_arg(x, index)


def to_program_args(xs: list, index: int = 0) -> list:
    return [to_program_arg(x, index) for x in xs]


def to_jax_args(xs: list, index: int = 0) -> list:
    return [to_jax_arg(x, index) for x in xs]


def host_scalars(x: Any, index: int = 0) -> list:
    """The ``scalars`` tensor of a ``_foreach_*.Tensor`` op, read on the host as CUDA does: it
    must be a CPU tensor; a device one is refused with CUDA's error."""
    if isinstance(x, torch.Tensor) and not x.is_cpu:
        raise RuntimeError(f"Expected scalars to be on CPU, got {x.device} instead.")
    return scalars(x.tolist() if x.dim() else [x.item()], index)


def _index_to_jax(x: Any, index: int = 0) -> Any:
    """Index tensors may live on the host, as on CUDA (``x[torch.tensor([0, 2])]``)."""
    if isinstance(x, torch.Tensor) and x.is_cpu:
        return transfer.to_device(x, index)
    return to_jax_arg(x, index)


def indices_to_jax(xs: list, index: int = 0) -> list:
    """``Tensor?[] indices`` (``index``, ``index_put``): each index as :func:`_index_to_jax`
    makes it, None kept."""
    return [_index_to_jax(x, index) for x in xs]


#: A Python number as the program's input: its cached device scalar (the same function, so that
#: a number's conversion, the core's too, is one Python frame)
number = transfer.device_scalar


class FittedNumber:
    """:func:`number` for a Scalar argument CPU converts into ``dtype`` with its overflow check
    (``Lowering.fitted``), for a kept plan: PyTorch's error for a number ``dtype`` cannot hold,
    which sends the call to the general path (it refuses in CPU's order: the op's check, the
    numbers' kinds, then this)."""

    __slots__ = ("dtype", "int_low", "int_high", "float_low", "float_high")

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.int_low, self.int_high, self.float_low, self.float_high = sure_fits(dtype)

    def __call__(self, x: bool | int | float | complex, index: int = 0) -> Any:
        kind = type(x)  # (a number within the sure bounds, the common case, is tested here)
        if kind is float:
            fits = self.float_low <= x <= self.float_high
        elif kind is int:
            fits = self.int_low <= x <= self.int_high
        else:
            fits = kind is bool
        if not fits:
            check_scalar(x, self.dtype, 2)  # (2 elements: not a fill of one, which skips half's test)
        return transfer.device_scalar(x, index)


_HALF_PRECISION = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
_FLOAT32 = np.dtype(jnp.float32)


def fitted_dtype(result: np.dtype, in_opmath: bool) -> np.dtype:
    """The dtype CPU converts a fitted Scalar argument into (``Lowering.fitted``) for an op whose
    result is ``result``: its ``scalar_t``, or with ``in_opmath`` float32 for a half-precision one."""
    return _FLOAT32 if in_opmath and result in _HALF_PRECISION else result


@functools.cache
def fitted_number(result: np.dtype, in_opmath: bool) -> FittedNumber:
    """The :class:`FittedNumber` of an argument of an op whose result is ``result``."""
    return FittedNumber(fitted_dtype(result, in_opmath))


def scalar(x: Any, index: int = 0) -> Any:
    """A ``Scalar`` argument: a tensor's value, or a Python number as a device scalar."""
    if isinstance(x, torch.Tensor):
        return to_jax_arg(x, index)
    if x is None or isinstance(x, jax.Array):
        return x
    return number(x, index)


def scalars(xs: Any, index: int = 0) -> Any:
    return [scalar(x, index) for x in xs]


#: The converters that turn a Python number into :func:`number`'s device scalar.
NUMBER_CONVERTERS = (to_jax_arg, to_program_arg, scalar)


def static(x: Any) -> Any:
    return tuple(x) if isinstance(x, list) else x


def static_arg(x: Any, index: int = 0) -> Any:
    return static(x)


def dtype_arg(d: Any, index: int = 0) -> Any:
    return None if d is None else to_jax(d)


class ExactStatic:
    """A float static argument that JAX's jit cache would merge with another, as it keys static
    arguments by ``==`` and hash: -0.0 (equal to 0.0, so the program traced for one would serve
    the other and lose the sign) and NaN (unequal to itself: a new program at every call). It is
    keyed by its ``repr``; the lowering's trace sees the float again (:func:`plain_static`)."""

    __slots__ = ("value",)

    def __init__(self, value: float):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is ExactStatic and repr(other.value) == repr(self.value)

    def __hash__(self) -> int:
        return hash(repr(self.value))

    def __repr__(self) -> str:
        return repr(self.value)


def exact_static(x: Any, index: int = 0) -> Any:
    """A float-typed static argument as :func:`static` makes it, a float JAX would merge with
    another made an :class:`ExactStatic` (an item of a list too)."""
    kind = type(x)
    if kind is float:
        return x if x == x and (x or math.copysign(1.0, x) > 0) else ExactStatic(x)
    if kind is list or kind is tuple:
        return tuple(map(exact_static, x))
    return x


def plain_static(x: Any) -> Any:
    """What :func:`exact_static` was given (read in the lowering's trace)."""
    kind = type(x)
    if kind is ExactStatic:
        return x.value
    return tuple(map(plain_static, x)) if kind is tuple else x


def op_index(values: list, positions: list[int]) -> int:
    """The tpu index an op runs on: its first tpu tensor's (another device's tensors are then
    refused by JAX), else the factory's (``context.index``)."""
    for i in positions:
        x = values[i]
        for t in x if type(x) in (list, tuple) else (x,):
            if isinstance(t, torch.Tensor) and not t.is_cpu:
                return max(t.get_device(), 0)
    return context.index


def check_generator(g) -> None:
    if g is not None and g.device.type != "tpu":
        raise RuntimeError(f"Expected a 'tpu' device type for generator but found '{g.device.type}'")


def for_host(value: Any) -> Any:
    """A lowering input as concrete arrays whose checks have passed (a host read)."""
    if isinstance(value, (list, tuple)):
        return type(value)(for_host(v) for v in value)
    if isinstance(value, (jax.Array, Deferred)):
        return checks.before_host_read(value)
    return value
