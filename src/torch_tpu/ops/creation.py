"""Factory lowerings: fills (``full``, ``zeros``, ``*_like``, ``new_*``), ranges, windows,
identity. (Random factories live in ops/random.py.)

Factories that read the default dtype, a global, resolve it outside any trace (``runs=Runs.EAGER``)
and then run one jitted program through ``buffer.apply`` (so fused eager records it): calling
``jnp`` eagerly would run and dispatch every XLA op on its own, ten times the cost. The
constant ``*_like``/``new_*`` ones share the fills' program (and their first fill on the host,
:func:`_full`); the others take their dtype from ``self`` and are jitted like any lowering.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.scipy.special import i0

from ..runtime import padding, platform
from ..runtime.buffer import Padded, apply
from ..runtime.context import context
from ..runtime.dtypes import cast, check_scalar, to_jax, to_torch
from ..runtime.host_copies import HOST_COPY_BYTES, keep_host_copy
from ..runtime.lru import Kind, cached, caches
from ..runtime.tensor import fill
from ..runtime.transfer import INT64_RANGE, device_scalar, first_fill_on_host
from ._helpers import accumulator, check_number_fits, converted
from .padding import UNREAD
from .registry import Layout, Runs, lower, runtime

aten = torch.ops.aten


def _float_or_default(dtype) -> np.dtype:
    return to_jax(torch.get_default_dtype()) if dtype is None else dtype


def _accumulate_dtype(dtype) -> np.dtype:
    """torch CPU's accumulate type for ranges: int64 for integers, float for half types."""
    if jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
        return np.dtype(jnp.int64)
    return np.dtype(jnp.float32) if dtype in (jnp.float16, jnp.bfloat16) else np.dtype(jnp.float64)


@lower(aten.arange.start_step, runs=Runs.EAGER, static=("start", "end", "step"))
def arange(start, end, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    plan = _range_plan if type(start) is type(end) is type(step) is int else _range_plan.__wrapped__
    first, stride, length, dtype, accumulate, integral, host = plan(
        start, end, step, dtype, torch.get_default_dtype()
    )
    if not integral:
        # op by op: compiled as one program, XLA would contract the emulated roundings (FMA)
        return _cpu_arange(first, stride, length, dtype, accumulate)
    if host is not None and context.trace is None and host.nbytes <= _KEPT_RANGE_BYTES:
        layout = padding.learned_layout("arange", host.shape, dtype)
        if layout is not None:  # (positions of a length that changes: padded to its bucket)
            return padding.made(padding.from_host(host, layout, platform.jax_device(context.index)))
        return _kept_range(host, first, stride, length, dtype)
    value = apply(_jitted_arange, first, stride, length, dtype, accumulate)
    if host is not None:  # (positions: checked on the host)
        keep_host_copy(value, host, shared=True)
    return value


#: The largest integer range :func:`_kept_range` keeps on the device, and how many it keeps
_KEPT_RANGE_BYTES, _KEPT_RANGES = 64 << 10, 256
#: (first, stride, length, dtype, tpu index) -> the range's value there
_kept_ranges = caches.lru("creation.kept_ranges", Kind.CONSTANTS, _KEPT_RANGES)


def _kept_range(host: np.ndarray, first: int, stride: int, length: int, dtype: np.dtype) -> jax.Array:
    """A small integer range (its ``host`` copy) on the factory's device, copied there once and
    kept: a loop's positions then cost no program (no graph node when fused) and their bounds
    are read once. Values are immutable, so every tensor made from it can share it."""
    key = (first, stride, length, dtype, context.index)
    value = _kept_ranges.get(key)
    if value is None:
        value = _kept_ranges[key] = jax.device_put(host, platform.jax_device(context.index))
        keep_host_copy(value, host, shared=True)
    return value


@cached
def _range_plan(start, end, step, dtype, default_dtype: torch.dtype) -> tuple:
    """(first, stride, length, dtype, accumulate dtype, whether it accumulates in integers,
    host copy or None) of a range: the same for every call with these arguments, so a loop's
    ``arange`` over integers is worked out once (floats are not kept: -0.0 and 0.0 would share
    one)."""
    if dtype is None:
        integer_ends = all(isinstance(v, (int, bool)) for v in (start, end, step))
        dtype = np.dtype(jnp.int64) if integer_ends else _float_or_default(None)
    _check_range(float(start), float(end), float(step))
    accumulate = _accumulate_dtype(dtype)
    integral = jnp.issubdtype(accumulate, jnp.integer)
    convert = int if integral else float  # Scalar.to<acc_type>
    first, last, stride = convert(start), convert(end), convert(step)
    if dtype == jnp.int64:  # the count in exact integers, as torch does for int64 only
        if stride == 0:  # (a fractional step truncated to 0)
            raise ValueError("step must be nonzero")
        span = last - first + stride - (1 if stride > 0 else -1)
        length = abs(span) // abs(stride)
    else:
        length = math.ceil((float(end) - float(start)) / float(step))
    dtype = np.dtype(dtype)
    host = None
    if integral and length * dtype.itemsize <= HOST_COPY_BYTES:
        host = (first + stride * np.arange(length, dtype=np.int64)).astype(dtype)
        host.flags.writeable = False
    return first, stride, length, dtype, accumulate, integral, host


def _check_range(start: float, end: float, step: float) -> None:
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RuntimeError(f"unsupported range: {start} -> {end}")
    if (end - start) * step < 0:
        raise RuntimeError("upper bound and lower bound inconsistent with step sign")


#: at::internal::GRAIN_SIZE: parallel_for's smallest chunk
_GRAIN = 32768


def _cpu_arange(first, stride, length: int, dtype: np.dtype, accumulate: np.dtype) -> jax.Array:
    """``first + i * stride`` rounded as torch CPU's arange kernel rounds it, which matters for
    float types: each thread's chunk runs vectors of ``width`` lanes (two at a time) as ``base +
    lane * stride``, with ``base = first + i0 * stride`` rounded to ``dtype`` first, and its tail
    element by element as ``first + i * stride``; the multiply-adds are fused (FMA), but for
    bfloat16's lanes. The
    chunks follow this process's thread count, as a CPU tensor made here would."""
    index = jnp.arange(length, dtype=jnp.int64)
    if jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
        return (first + stride * index).astype(dtype)

    def at(i):
        return _fused_multiply_add(i.astype(accumulate), stride, first)

    width = _VECTOR_BYTES // dtype.itemsize
    tasks = 1 if length < _GRAIN else min(torch.get_num_threads(), -(-length // _GRAIN))
    chunk = max(-(-length // tasks), 1)
    position = index % chunk
    chunk_length = jnp.minimum(chunk, length - (index - position))
    lane = position % width
    base = at(index - lane).astype(dtype).astype(accumulate)
    vectorized = position < chunk_length // (2 * width) * (2 * width)
    if dtype == jnp.bfloat16:  # (c10::BFloat16's lanes add the rounded product: no FMA)
        vector = base + lane.astype(accumulate) * stride
    else:
        vector = _fused_multiply_add(lane.astype(accumulate), stride, base)
    return jnp.where(vectorized, vector.astype(dtype), at(index).astype(dtype))


_jitted_arange = jax.jit(_cpu_arange, static_argnums=(0, 1, 2, 3, 4))

#: The vector width (bytes) of the arange kernel torch's x86 CPU build runs: the AVX2 one, also
#: on AVX512 machines (``REGISTER_DISPATCH`` registers no AVX512 variant of ``arange_stub``).
_VECTOR_BYTES = 32


def _fused_multiply_add(a: jax.Array, b: float, c) -> jax.Array:
    """``a * b + c`` rounded once, as the FMA instruction x86 compilers emit for it: the
    product's rounding error (Dekker's exact product, Veltkamp's split) joins the sum's."""
    split = 2.0 ** (27 if a.dtype == jnp.float64 else 12) + 1
    b = jnp.asarray(b, a.dtype)

    def halves(x):
        scaled = split * x
        high = scaled - (scaled - x)
        return high, x - high

    product = a * b
    (a_high, a_low), (b_high, b_low) = halves(a), halves(b)
    product_error = ((a_high * b_high - product) + a_high * b_low + a_low * b_high) + a_low * b_low
    total = product + c
    rest = total - product
    sum_error = (product - (total - rest)) + (c - rest)
    return total + (sum_error + product_error)


@lower(aten.arange.default, runs=Runs.EAGER, static=("end",))
def arange_end(end, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(0, end, 1, dtype)


@lower(aten.arange.start, runs=Runs.EAGER, static=("start", "end"))
def arange_start(start, end, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(start, end, 1, dtype)


@lower(aten.range.step, runs=Runs.EAGER, static=("start", "end", "step"))
def range_step(start, end, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    """The deprecated ``torch.range``: ``end`` included, default dtype even for integers."""
    dtype = _float_or_default(dtype)
    accumulate = _accumulate_dtype(dtype)
    integral = jnp.issubdtype(accumulate, jnp.integer)
    first, last, stride = ((int if integral else float)(v) for v in (start, end, step))
    if not all(map(math.isfinite, (first, last))):
        raise RuntimeError(f"unsupported range: {first} -> {last}")
    if stride == 0:
        raise RuntimeError("step must be nonzero")
    if (last - first) * stride < 0:
        raise RuntimeError("upper bound and lower bound inconsistent with step sign")
    # torch computes the count in the accumulate type: integer division truncates
    length = abs(last - first) // abs(stride) + 1 if integral else int((last - first) / stride + 1)
    return (first + stride * jnp.arange(length, dtype=accumulate)).astype(dtype)


@lower(aten.range.default, runs=Runs.EAGER, static=("start", "end"))
def range_default(start, end, dtype=None, layout=None, device=None, pin_memory=None):
    return range_step(start, end, 1, dtype)


# ----------------------------------------------------------------------------- fills
def _checked_full(shape, value, dtype) -> jax.Array:
    check_scalar(value, dtype, math.prod(shape))
    return _full(shape, value, dtype)


def _full(shape, value, dtype) -> jax.Array:
    """``shape`` filled with ``value`` cast to ``dtype``: one program per shape and dtype, the
    value a runtime input (a uint64 fill past int64's range, which JAX cannot take as a Python
    number, is cast on the host). A strict-eager fill's first few times are built on the host
    instead (:func:`~torch_tpu.runtime.transfer.first_fill_on_host`)."""
    shape, dtype = tuple(shape), np.dtype(dtype)
    layout = padding.learned_layout("full", shape, dtype)
    if layout is not None:  # (made here at other sizes before: padded to its buckets)
        return padding.made(Padded(_filled(layout.padded_shape, value, dtype), layout))
    return _filled(shape, value, dtype)


def _filled(shape: tuple, value, dtype: np.dtype) -> jax.Array:
    filled = first_fill_on_host(shape, value, dtype, context.index)
    if filled is not None:
        return filled
    if isinstance(value, int) and value not in INT64_RANGE:
        value = cast(np.uint64(value), dtype)
    else:
        value = device_scalar(value, context.index)  # (the factory's device)
    return apply(fill, value, shape, dtype)


def _fill_dtype(value) -> np.dtype:
    """``full``'s dtype when none is given: the fill value's kind."""
    if isinstance(value, bool):
        return np.dtype(jnp.bool_)
    if isinstance(value, int):
        return np.dtype(jnp.int64)
    if isinstance(value, complex):
        return to_jax(torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64)
    return _float_or_default(None)


@lower(aten.full.default, runs=Runs.EAGER, static=("fill_value",))
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return _checked_full(size, fill_value, _fill_dtype(fill_value) if dtype is None else dtype)


@lower(aten.scalar_tensor.default, runs=Runs.EAGER, static=("s",))
def scalar_tensor(s, dtype=None, layout=None, device=None, pin_memory=None):
    return _checked_full((), s, _float_or_default(dtype))


def _constant_factory(value):
    def factory(size, dtype=None, layout=None, device=None, pin_memory=None):
        return _full(size, value, _float_or_default(dtype))

    return factory


# autograd's zero gradients (_efficientzerotensor) are plain zeros here: no ZeroTensor key on tpu
lower(aten.zeros.default, aten._efficientzerotensor.default, runs=Runs.EAGER)(_constant_factory(0))
lower(aten.ones.default, runs=Runs.EAGER)(_constant_factory(1))


def _check_full_like(x, fill_value, dtype=None, *_):
    """CPU's ``empty_like(x).fill_(value)``: a value the dtype cannot hold is refused."""
    check_number_fits(fill_value, x.dtype if dtype is None else dtype, x.size)


@lower(aten.full_like.default, layout=Layout.LIKE, check=_check_full_like)
def full_like(x, fill_value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.full(x.shape, converted(fill_value, x.dtype if dtype is None else dtype))


def _constant_like(value):
    def like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        dtype = x.dtype if dtype is None else dtype
        if type(x) is Padded:  # (laid out as its operand: the two meet without padding again)
            return padding.made(Padded(_filled(x.layout.padded_shape, value, np.dtype(dtype)), x.layout))
        return _full(x.shape, value, dtype)

    return like


lower(aten.zeros_like.default, layout=Layout.LIKE, runs=Runs.EAGER, pad=UNREAD)(_constant_like(0))
lower(aten.ones_like.default, layout=Layout.LIKE, runs=Runs.EAGER, pad=UNREAD)(_constant_like(1))


def _check_new_full(x, size, fill_value, dtype=None, *_):
    check_number_fits(fill_value, x.dtype if dtype is None else dtype, math.prod(size))


@lower(aten.new_full.default, check=_check_new_full)
def new_full(x, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(size, converted(fill_value, x.dtype if dtype is None else dtype))


def _constant_new(value):
    def new(x, size, dtype=None, layout=None, device=None, pin_memory=None):
        return _full(size, value, x.dtype if dtype is None else dtype)

    return new


lower(aten.new_zeros.default, runs=Runs.EAGER, pad=UNREAD)(_constant_new(0))
lower(aten.new_ones.default, runs=Runs.EAGER, pad=UNREAD)(_constant_new(1))


_INT64 = np.dtype(jnp.int64)


def _triangle_indices(triangle):
    def indices(row, col, offset=0, dtype=_INT64, layout=None, device=None, pin_memory=None):
        return jnp.stack(triangle(row, offset, col)).astype(dtype)

    return indices


lower(aten.tril_indices.default)(_triangle_indices(jnp.tril_indices))
lower(aten.triu_indices.default)(_triangle_indices(jnp.triu_indices))


def _step_dtype(dtype) -> np.dtype:
    """torch CPU steps integer linspaces in double and half types in float."""
    if jnp.issubdtype(dtype, jnp.integer):
        return np.dtype(jnp.float64)
    return np.dtype(jnp.float32) if dtype in (jnp.float16, jnp.bfloat16) else np.dtype(dtype)


def _real_unless_complex(value, dtype) -> jax.Array:
    """A bound in ``dtype``; a real dtype keeps only the real part of a complex bound, as
    torch's scalar conversion does."""
    value = jnp.asarray(value)
    if jnp.iscomplexobj(value) and not jnp.issubdtype(dtype, jnp.complexfloating):
        value = jnp.real(value)
    return value.astype(dtype)


def linear_steps(start, end, steps: int, dtype) -> jax.Array:
    """torch CPU's linspace: the first half counts up from start, the second down from end."""
    compute = _step_dtype(dtype)
    start, end = (_real_unless_complex(bound, compute) for bound in (start, end))
    if steps == 1:
        return start.reshape(1)
    step = (end - start) / (steps - 1)
    i = jnp.arange(steps, dtype=compute)
    return jnp.where(jnp.arange(steps) < steps // 2, start + step * i, end - step * (steps - 1 - i))


def _check_steps(steps: int) -> None:
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")


@lower(aten.linspace.default, runs=Runs.EAGER)
def linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    _check_steps(steps)
    dtype = _float_or_default(dtype)
    values = linear_steps(start, end, steps, dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        values = jnp.trunc(values)
    return values.astype(dtype)


@lower(aten.logspace.default, runs=Runs.EAGER)
def logspace(start, end, steps, base=10.0, dtype=None, layout=None, device=None, pin_memory=None):
    _check_steps(steps)
    dtype = _float_or_default(dtype)
    exponents = linear_steps(start, end, steps, dtype)
    return jnp.power(jnp.float64(base), exponents.astype(jnp.float64)).astype(dtype)


def _check_scalar_bounds(name: str):
    """The Tensor overloads of linspace/logspace take 0-dim tensors only."""

    def check(start, end, *rest):
        if jnp.ndim(start) or jnp.ndim(end):
            raise RuntimeError(
                f"{name} only supports 0-dimensional start and end tensors, but got start with "
                f"{jnp.ndim(start)} dimension(s) and end with {jnp.ndim(end)} dimension(s)."
            )

    return check


lower(
    aten.linspace.Tensor_Tensor,
    aten.linspace.Tensor_Scalar,
    aten.linspace.Scalar_Tensor,
    runs=Runs.EAGER,
    check=_check_scalar_bounds("linspace"),
)(linspace)
lower(
    aten.logspace.Tensor_Tensor,
    aten.logspace.Tensor_Scalar,
    aten.logspace.Scalar_Tensor,
    runs=Runs.EAGER,
    check=_check_scalar_bounds("logspace"),
)(logspace)


# ----------------------------------------------------------------------------- windows
def _window(name: str, length: int, periodic: bool, dtype, shape) -> jax.Array:
    """torch's window recipe: ``shape(n, N)`` over n = 0..N-1 where a periodic window is the
    symmetric one of length + 1 without its last point; lengths 0 and 1 are special."""
    dtype = _float_or_default(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise RuntimeError(f"{name} expects floating point dtypes, got: {to_torch(dtype)}")
    if length < 0:
        raise RuntimeError(f"{name} requires non-negative window_length, got window_length={length}")
    if length <= 1:
        return jnp.ones((length,), dtype)
    points = length + 1 if periodic else length
    compute = accumulator(dtype)
    return shape(jnp.arange(points, dtype=compute), points)[:length].astype(dtype)


def _cosine_sum(*coefficients):
    """sum_k (-1)^k a_k cos(2 pi k n / (N - 1)): Hann, Hamming, Blackman."""

    def shape(n, points):
        phase = n * (2 * math.pi / (points - 1))
        return sum((-1) ** k * a * jnp.cos(k * phase) for k, a in enumerate(coefficients))

    return shape


def _bartlett(n, points):
    ramp = n * (2.0 / (points - 1))
    return jnp.where(n < (points - 1) // 2 + 1, ramp, 2 - ramp)


def _kaiser(beta: float):
    def shape(n, points):
        alpha = (points - 1) / 2.0
        argument = beta * jnp.sqrt(jnp.abs(1 - ((n - alpha) / alpha) ** 2))
        return i0(argument) / i0(jnp.asarray(beta, n.dtype))

    return shape


@lower(aten.hann_window.periodic, runs=Runs.EAGER)
def hann_window(window_length, periodic=True, dtype=None, layout=None, device=None, pin_memory=None):
    return _window("hann_window", window_length, periodic, dtype, _cosine_sum(0.5, 0.5))


@lower(aten.hamming_window.periodic_alpha_beta, runs=Runs.EAGER)
def hamming_window(
    window_length, periodic=True, alpha=0.54, beta=0.46, dtype=None, layout=None, device=None, pin_memory=None
):
    return _window("hamming_window", window_length, periodic, dtype, _cosine_sum(alpha, beta))


@lower(aten.hamming_window.periodic_alpha, runs=Runs.EAGER)
def hamming_window_alpha(
    window_length, periodic, alpha, dtype=None, layout=None, device=None, pin_memory=None
):
    return hamming_window(window_length, periodic, alpha, 0.46, dtype)


@lower(aten.blackman_window.periodic, runs=Runs.EAGER)
def blackman_window(window_length, periodic=True, dtype=None, layout=None, device=None, pin_memory=None):
    return _window("blackman_window", window_length, periodic, dtype, _cosine_sum(0.42, 0.5, 0.08))


@lower(aten.bartlett_window.periodic, runs=Runs.EAGER)
def bartlett_window(window_length, periodic=True, dtype=None, layout=None, device=None, pin_memory=None):
    return _window("bartlett_window", window_length, periodic, dtype, _bartlett)


@lower(aten.kaiser_window.beta, runs=Runs.EAGER)
def kaiser_window(
    window_length, periodic=True, beta=12.0, dtype=None, layout=None, device=None, pin_memory=None
):
    return _window("kaiser_window", window_length, periodic, dtype, _kaiser(beta))


def _leading_arguments(window, count: int):
    """A window overload taking only the first ``count`` of ``window``'s parameters (the rest
    default), then the factory options."""

    def lowering(*args):
        return window(*args[:count], dtype=args[count])

    return lowering


for _overload, _window_fn, _count in [
    (aten.hann_window.default, hann_window, 1),
    (aten.hamming_window.default, hamming_window, 1),
    (aten.hamming_window.periodic, hamming_window, 2),
    (aten.blackman_window.default, blackman_window, 1),
    (aten.bartlett_window.default, bartlett_window, 1),
    (aten.kaiser_window.default, kaiser_window, 1),
    (aten.kaiser_window.periodic, kaiser_window, 2),
]:
    lower(_overload, runs=Runs.EAGER)(_leading_arguments(_window_fn, _count))


@lower(aten.eye.default, runs=Runs.EAGER)
def eye(n, dtype=None, layout=None, device=None, pin_memory=None):
    return eye_m(n, n, dtype)


@lower(aten.eye.m, runs=Runs.EAGER)
def eye_m(n, m, dtype=None, layout=None, device=None, pin_memory=None):
    for name, size in (("n", n), ("m", m)):
        if size < 0:
            raise RuntimeError(f"{name} must be greater or equal to 0, got {size}")
    return cast(jnp.eye(n, m, dtype=jnp.bool_), _float_or_default(dtype))  # (e8m0's 0 is 2**-127)


def _factory_out(out_op, functional) -> None:
    """``<factory>(..., out=t)``: the functional factory in ``t``'s dtype, stored into ``t``."""

    def kernel(*args, out, **options):
        result = functional(*args, **options, dtype=out.dtype, device=out.device)
        if out.shape != result.shape:  # the composite factories pass a fresh empty((0,))
            return out.set_(result)
        return out.copy_(result)

    runtime(out_op)(kernel)


for _out, _functional in [
    (aten.arange.start_out, aten.arange.start_step),
    (aten.linspace.out, aten.linspace.default),
    (aten.logspace.out, aten.logspace.default),
    (aten.eye.out, aten.eye.default),
    (aten.eye.m_out, aten.eye.m),
]:
    _factory_out(_out, _functional)
