"""The dtypes tpu tensors support, their torch <-> JAX mapping, and conversions between them
(with torch CPU's results where XLA's differ)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

TORCH_TO_JAX: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(jnp.bool_),
    torch.uint8: np.dtype(jnp.uint8),
    torch.uint16: np.dtype(jnp.uint16),
    torch.uint32: np.dtype(jnp.uint32),
    torch.uint64: np.dtype(jnp.uint64),
    torch.int8: np.dtype(jnp.int8),
    torch.int16: np.dtype(jnp.int16),
    torch.int32: np.dtype(jnp.int32),
    torch.int64: np.dtype(jnp.int64),
    torch.float16: np.dtype(jnp.float16),
    torch.bfloat16: np.dtype(jnp.bfloat16),
    torch.float32: np.dtype(jnp.float32),
    torch.float64: np.dtype(jnp.float64),
    torch.complex64: np.dtype(jnp.complex64),
    torch.complex128: np.dtype(jnp.complex128),
    torch.float8_e4m3fn: np.dtype(jnp.float8_e4m3fn),
    torch.float8_e5m2: np.dtype(jnp.float8_e5m2),
    torch.float8_e4m3fnuz: np.dtype(jnp.float8_e4m3fnuz),
    torch.float8_e5m2fnuz: np.dtype(jnp.float8_e5m2fnuz),
    torch.float8_e8m0fnu: np.dtype(jnp.float8_e8m0fnu),
}
#: The float8 dtypes: PyTorch's CPU kernels run them in a few ops only (``ops.cpu_dtypes``).
#: ``float8_e8m0fnu`` (MX formats' scales) holds powers of two only, no sign and no zero.
FLOAT8 = frozenset(
    {
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.float8_e4m3fnuz,
        torch.float8_e5m2fnuz,
        torch.float8_e8m0fnu,
    }
)
JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_JAX.items()}
FLOAT8_JAX = frozenset(TORCH_TO_JAX[d] for d in FLOAT8)


def torchs_own(error: Exception) -> Exception:
    """Mark ``error``, which a lowering raises, as PyTorch CPU's own (type and message): the
    dispatcher raises it as is instead of asking the meta kernel for PyTorch's."""
    error.torchs_own = True
    return error


class UnsupportedDtypeError(TypeError):
    """A dtype tpu has no storage for (complex32, float8...)."""


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
    torch.bool: "Bool",
    torch.uint8: "Byte",
    torch.uint16: "UInt16",
    torch.uint32: "UInt32",
    torch.uint64: "UInt64",
    torch.int8: "Char",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.float32: "Float",
    torch.float64: "Double",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
    torch.float8_e4m3fn: "Float8_e4m3fn",
    torch.float8_e5m2: "Float8_e5m2",
    torch.float8_e4m3fnuz: "Float8_e4m3fnuz",
    torch.float8_e5m2fnuz: "Float8_e5m2fnuz",
    torch.float8_e8m0fnu: "Float8_e8m0fnu",
}


#: The C++ names of the floating and complex element types (both tables below use them).
_CPP_FLOATING = {
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.float32: "float",
    torch.float64: "double",
    torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
    torch.float8_e4m3fn: "c10::Float8_e4m3fn",
    torch.float8_e5m2: "c10::Float8_e5m2",
    torch.float8_e4m3fnuz: "c10::Float8_e4m3fnuz",
    torch.float8_e5m2fnuz: "c10::Float8_e5m2fnuz",
    torch.float8_e8m0fnu: "c10::Float8_e8m0fnu",
}

#: The C++ element types' names, as PyTorch's structured kernels word a wrong out= dtype.
_ITEM_NAMES = {
    torch.bool: "bool",
    torch.uint8: "unsigned char",
    torch.uint16: "short unsigned int",
    torch.uint32: "unsigned int",
    torch.uint64: "long unsigned int",
    torch.int8: "signed char",
    torch.int16: "short int",
    torch.int32: "int",
    torch.int64: "long int",
    **_CPP_FLOATING,
}


def item_name(dtype: torch.dtype) -> str:
    """The C++ element type of a torch dtype (``long int``)."""
    return _ITEM_NAMES[dtype]


def type_name(dtype) -> str:
    """PyTorch's C++ name for a torch or JAX dtype (``Long``), as its error messages spell it."""
    if not isinstance(dtype, torch.dtype):
        dtype = to_torch(dtype)
    return _SCALAR_TYPE_NAMES[dtype]


# ----------------------------------------------------------------------------- conversions
def _low_bits(value, dtype: np.dtype):
    """The two's complement low bits of a wider integer ``value`` as ``dtype`` (spelled out:
    XLA leaves an out-of-range integer conversion undefined)."""
    bits = 8 * dtype.itemsize
    low = value & ((1 << bits) - 1)
    if jnp.issubdtype(dtype, jnp.signedinteger):
        low = jnp.where(low >= 1 << (bits - 1), low - (1 << bits), low)
    return low.astype(dtype)


def _truncated(value, wide: np.dtype) -> jax.Array:
    """x86's ``cvttsd2si`` into ``wide`` (int32 or int64): NaN, infinities and out-of-range
    values become its most negative value."""
    limit = 2.0 ** (8 * wide.itemsize - 1)
    fits = (value >= -limit) & (value < limit)  # False for NaN
    return jnp.where(fits, jnp.where(fits, value, 0).astype(wide), jnp.iinfo(wide).min)


#: Integer types CPU converts a float to through int64 (the rest go through int32).
_THROUGH_INT64 = {np.dtype(jnp.int64), np.dtype(jnp.uint8), np.dtype(jnp.uint32)}
_UINT64 = np.dtype(jnp.uint64)


def cast(value, dtype) -> jax.Array:
    """``value.astype(dtype)`` with torch CPU's (x86) results where XLA's differ.

    XLA saturates a float converted to an integer; CPU truncates with ``cvttsd2si``, which turns
    NaN, infinities and out-of-range values into the most negative int64 (int32 for int32
    results). int16/int8/uint16 take the low bits of that int32 and uint8/uint32 those of the
    int64, so 300.0 -> uint8 is 44 and NaN -> int8 is 0. uint64 converts values from 2**63 up as
    ``x - 2**63`` with the top bit set again (the compilers' sequence). CPU's vectorized loops
    give other results for out-of-range uint32 conversions (undefined in C++); these are its
    scalar loop's. A complex value keeps its real part (``copy_``).
    """
    dtype = np.dtype(dtype)
    value = jnp.asarray(value)
    if value.dtype == dtype:
        return value
    if value.dtype == _E8M0:
        return _from_e8m0(value, dtype)
    if jnp.issubdtype(value.dtype, jnp.complexfloating) and not jnp.issubdtype(dtype, jnp.complexfloating):
        value = jnp.real(value)
    if dtype in FLOAT8_JAX:
        return _to_float8(value, dtype)
    if not (jnp.issubdtype(value.dtype, jnp.floating) and jnp.issubdtype(dtype, jnp.integer)):
        return value.astype(dtype)
    if value.dtype in _FNUZ:  # (CPU converts their NaN to integer 0)
        value = jnp.where(jnp.isnan(value), 0, value)
    if value.dtype.itemsize < 4:  # half types: compare with the limits exactly
        value = value.astype(jnp.float32)
    if dtype == _UINT64:
        high = value >= 2.0**63
        bits = _truncated(jnp.where(high, value - 2.0**63, value), np.dtype(jnp.int64))
        return lax.bitcast_convert_type(jnp.where(high, bits ^ jnp.iinfo(jnp.int64).min, bits), _UINT64)
    wide = np.dtype(jnp.int64 if dtype in _THROUGH_INT64 else jnp.int32)
    whole = _truncated(value, wide)
    return whole if wide == dtype else _low_bits(whole, dtype)


_E4M3FN = np.dtype(jnp.float8_e4m3fn)
_E8M0 = np.dtype(jnp.float8_e8m0fnu)
_FNUZ = frozenset({np.dtype(jnp.float8_e4m3fnuz), np.dtype(jnp.float8_e5m2fnuz)})


def _to_float8(value, dtype: np.dtype) -> jax.Array:
    """A conversion to float8 as PyTorch's: through float32 (a float64 rounds twice, as c10's
    conversion from double does; integers and other float8 types convert to float32 first), and
    into ``float8_e4m3fn`` saturating (c10 clamps finite and infinite values past 448 to +-448;
    XLA makes them NaN). NaN stays NaN."""
    if not jnp.issubdtype(value.dtype, jnp.floating) or value.dtype.itemsize in (1, 8):
        value = value.astype(jnp.float32)  # (integers and bool too: c10 converts them so)
    if dtype == _E8M0:
        return _to_e8m0(value.astype(jnp.float32))
    if dtype == _E4M3FN:
        limit = float(jnp.finfo(_E4M3FN).max)
        value = jnp.clip(value, -limit, limit)
    return value.astype(dtype)


def _from_e8m0(value: jax.Array, dtype: np.dtype) -> jax.Array:
    """A conversion out of ``float8_e8m0fnu`` as c10's: ``2 ** (bits - 127)``, bits 255 NaN
    (NaN is 0 as an integer). Built from the bits: XLA:CPU flushes the smallest value, 2**-127
    (a float32 subnormal), to 0 when converting it."""
    bits = lax.bitcast_convert_type(value, jnp.uint8).astype(jnp.uint32)
    if dtype == jnp.bool_:  # (no e8m0 value is 0)
        return jnp.ones(value.shape, jnp.bool_)
    if dtype == jnp.float64:  # (2**-127 is normal there)
        wide = (bits.astype(jnp.uint64) + (1023 - 127)) << 52
        return lax.bitcast_convert_type(
            jnp.where(bits == 0xFF, np.uint64(0x7FF8000000000000), wide), jnp.float64
        )
    single_bits = jnp.where(
        bits == 0, np.uint32(0x00400000), jnp.where(bits == 0xFF, np.uint32(0x7FC00000), bits << 23)
    )
    if dtype == jnp.bfloat16:  # (a float32's upper half: every e8m0 value is exact there)
        return lax.bitcast_convert_type((single_bits >> 16).astype(jnp.uint16), jnp.bfloat16)
    single = lax.bitcast_convert_type(single_bits, jnp.float32)
    if jnp.issubdtype(dtype, jnp.integer):
        single = jnp.where(bits == 0xFF, 0, single)
    return cast(single, dtype)


def _to_e8m0(value: jax.Array) -> jax.Array:
    """c10's ``fp8e8m0fnu_from_fp32_value``: the float32's exponent field, rounded up by its
    mantissa to nearest (ties to even, the implied bit the tie breaker); the sign is dropped,
    0 and subnormals below 2**-127 are 2**-127 (no zero), NaN and infinities NaN. (XLA's own
    conversion makes 0 and negative values NaN.)"""
    bits = lax.bitcast_convert_type(value, jnp.uint32)
    exponent = (bits >> 23) & 0xFF
    guard, round_bit, sticky = (bits & 0x400000) != 0, (bits & 0x200000) != 0, (bits & 0x1FFFFF) != 0
    round_up = guard & (round_bit | sticky | (exponent > 0)) & (exponent != 0xFF)
    return lax.bitcast_convert_type((exponent + round_up).astype(jnp.uint8), _E8M0)


#: The C++ names PyTorch's overflow message uses.
_CPP_NAMES = {
    torch.bool: "bool",
    torch.uint8: "uint8_t",
    torch.uint16: "uint16_t",
    torch.uint32: "uint32_t",
    torch.uint64: "uint64_t",
    torch.int8: "int8_t",
    torch.int16: "int16_t",
    torch.int32: "int",
    torch.int64: "int64_t",
    **_CPP_FLOATING,
}


def _overflows(value, dtype: np.dtype, numel: int) -> bool:
    """c10's ``overflows`` as ``fill_`` and ``full`` apply it to their Python number."""
    if jnp.issubdtype(dtype, jnp.complexfloating) or dtype == jnp.bool_ or isinstance(value, bool):
        return False
    if isinstance(value, complex):
        if value.imag != 0:
            return True
        value = value.real
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        if isinstance(value, int):  # negative integers may wrap into an unsigned type
            return value > info.max or (-value > info.max if info.min == 0 else value < info.min)
        # a float compares with the limits as doubles (so 2.0**63 passes for int64), NaN fails
        return not float(info.min) <= value <= float(info.max)
    if dtype.itemsize <= 2 and numel == 1:
        return False  # CPU fills one half or float8 element without the check (rounding instead)
    if dtype == jnp.float64 or math.isnan(value) or (math.isinf(value) and _has_infinity(dtype)):
        return False
    info = jnp.finfo(dtype)
    if isinstance(value, int):  # (an integer's magnitude only, as c10's ``overflows``)
        return abs(value) > float(info.max)
    return not float(info.min) <= value <= float(info.max)  # (e8m0's min: 2**-127, no zero)


@functools.cache
def _has_infinity(dtype: np.dtype) -> bool:
    """Whether ``dtype`` holds infinities (the float8 types but e5m2 do not)."""
    return bool(np.isinf(np.array(np.inf, np.float32).astype(dtype)))


@functools.cache
def sure_fits(dtype) -> tuple[int | float, int | float, float, float]:
    """(lowest, highest) int and (lowest, highest) float that surely fit many elements of
    ``dtype`` (:func:`check_scalar`): a number of that type between them needs no check; one
    outside may still fit (an infinity or NaN into a float dtype)."""
    dtype = np.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating) or dtype == jnp.bool_ or dtype == jnp.float64:
        return -math.inf, math.inf, -math.inf, math.inf
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        low, high = int(info.min), int(info.max)
        return (-high if low == 0 else low), high, float(low), float(high)
    info = jnp.finfo(dtype)
    low, high = float(info.min), float(info.max)
    return -high, high, low, high  # (an integer's magnitude counts; e8m0's float low is 2**-127)


def check_scalar(value, dtype, numel: int) -> None:
    """Raise PyTorch's error for a Python number that ``dtype`` cannot hold, filling ``numel``
    elements (``fill_``, ``full``)."""
    int_low, int_high, float_low, float_high = sure_fits(dtype)  # (the common case, decided here)
    kind = type(value)
    if (
        kind is bool
        or (kind is float and float_low <= value <= float_high)
        or (kind is int and int_low <= value <= int_high)
    ):
        return
    dtype = np.dtype(dtype)
    if _overflows(value, dtype, numel):
        raise overflow_error(dtype)


def overflow_error(dtype) -> RuntimeError:
    """PyTorch's error for a value ``dtype`` cannot hold."""
    return RuntimeError(f"value cannot be converted to type {_CPP_NAMES[to_torch(dtype)]} without overflow")
