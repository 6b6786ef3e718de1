"""Factory lowerings whose values are not just a fill: ranges, identity, permutations.

``empty``/``full``/``zeros``/``ones``/``scalar_tensor``, the ``*_like`` factories and
``rand``/``randn``/``randint`` reach the tpu through PyTorch's composites (``empty`` plus an
in-place fill, see ops/core.py). The factories here read the default dtype, a global, so they
are resolved outside any trace (``jit=False``); each is a handful of XLA ops.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .._dtypes import to_jax
from .._registry import lower, runtime

aten = torch.ops.aten


def _float_or_default(dtype) -> np.dtype:
    return to_jax(torch.get_default_dtype()) if dtype is None else dtype


def _accumulate_dtype(dtype) -> np.dtype:
    """torch CPU's accumulate type for ranges: int64 for integers, float for half types."""
    if jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
        return np.dtype(jnp.int64)
    return np.dtype(jnp.float32) if dtype in (jnp.float16, jnp.bfloat16) else np.dtype(jnp.float64)


@lower(aten.arange.start_step, jit=False, static=("start", "end", "step"))
def arange(start, end, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        integral = all(isinstance(v, (int, bool)) for v in (start, end, step))
        dtype = np.dtype(jnp.int64) if integral else _float_or_default(None)
    accumulate = _accumulate_dtype(dtype)
    integral = jnp.issubdtype(accumulate, jnp.integer)
    convert = int if integral else float  # torch's Scalar.to<acc_type>: truncates for integers
    first, last, stride = convert(start), convert(end), convert(step)
    if stride == 0:
        raise RuntimeError("step must be nonzero")
    if (last - first) * stride < 0:
        raise RuntimeError("upper bound and lower bound inconsistent with step sign")
    if dtype == jnp.int64:  # exact integer count, as torch does for int64 only
        span = last - first + stride - (1 if stride > 0 else -1)
        length = abs(span) // abs(stride)
    else:
        length = math.ceil((float(end) - float(start)) / float(step))
    return (first + stride * jnp.arange(max(length, 0), dtype=accumulate)).astype(dtype)


def _triangle_indices(triangle):
    def indices(row, col, offset=0, dtype=np.dtype(jnp.int64), layout=None, device=None,
                pin_memory=None):
        return jnp.stack(triangle(row, offset, col)).astype(dtype)
    return indices


lower(aten.tril_indices.default)(_triangle_indices(jnp.tril_indices))
lower(aten.triu_indices.default)(_triangle_indices(jnp.triu_indices))


def _step_dtype(dtype) -> np.dtype:
    """torch CPU steps integer linspaces in double and half types in float."""
    if jnp.issubdtype(dtype, jnp.integer):
        return np.dtype(jnp.float64)
    return np.dtype(jnp.float32) if dtype in (jnp.float16, jnp.bfloat16) else np.dtype(dtype)


def _linear_steps(start, end, steps: int, dtype) -> jax.Array:
    """torch CPU's linspace: the first half counts up from start, the second down from end."""
    compute = _step_dtype(dtype)
    start, end = jnp.asarray(start, compute), jnp.asarray(end, compute)
    if steps == 1:
        return start.reshape(1)
    step = (end - start) / (steps - 1)
    i = jnp.arange(steps, dtype=compute)
    return jnp.where(jnp.arange(steps) < steps // 2, start + step * i,
                     end - step * (steps - 1 - i))


def _check_steps(steps: int) -> None:
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")


@lower(aten.linspace.default, jit=False)
def linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    _check_steps(steps)
    dtype = _float_or_default(dtype)
    values = _linear_steps(start, end, steps, dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        values = jnp.trunc(values)
    return values.astype(dtype)


@lower(aten.logspace.default, jit=False)
def logspace(start, end, steps, base=10.0, dtype=None, layout=None, device=None, pin_memory=None):
    _check_steps(steps)
    dtype = _float_or_default(dtype)
    exponents = _linear_steps(start, end, steps, dtype)
    return jnp.power(jnp.float64(base), exponents.astype(jnp.float64)).astype(dtype)


@lower(aten.eye.default, jit=False)
def eye(n, dtype=None, layout=None, device=None, pin_memory=None):
    return eye_m(n, n, dtype)


@lower(aten.eye.m, jit=False)
def eye_m(n, m, dtype=None, layout=None, device=None, pin_memory=None):
    for size in (n, m):
        if size < 0:
            raise RuntimeError(f"n must be greater or equal to 0, got {size}")
    return jnp.eye(n, m, dtype=_float_or_default(dtype))


@lower(aten.randperm.generator, random=True)
def randperm(n, generator=None, dtype=np.dtype(jnp.int64), layout=None, device=None,
             pin_memory=None, *, key):
    return jax.random.permutation(key, n).astype(dtype)


def _factory_out(out_op, functional) -> None:
    """``<factory>(..., out=t)``: the functional factory in ``t``'s dtype, stored into ``t``."""
    def kernel(*args, out, **options):
        result = functional(*args, **options, dtype=out.dtype, device=out.device)
        if out.shape != result.shape:  # the composite factories pass a fresh empty((0,))
            return out.set_(result)
        return out.copy_(result)
    runtime(out_op)(kernel)


for _out, _functional in [(aten.arange.start_out, aten.arange.start_step),
                          (aten.linspace.out, aten.linspace.default),
                          (aten.logspace.out, aten.logspace.default),
                          (aten.eye.out, aten.eye.default), (aten.eye.m_out, aten.eye.m),
                          (aten.randperm.generator_out, aten.randperm.generator)]:
    _factory_out(_out, _functional)
