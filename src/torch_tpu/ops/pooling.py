"""Pooling lowerings: max/avg pooling with their indices, adaptive, fractional and unpooling.

Backward ops scatter the output gradient to the argmax (max pooling) or are ``jax.vjp`` of the
forward lowering (average pooling).
"""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ._helpers import check_bounds, type_name
from ._nn_helpers import compute_dtype, ntuple, require, vjp
from .registry import Layout, lower

aten = torch.ops.aten


def _pooled_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling_output_shape: with ceil_mode the last window must start inside the
    input or its left padding."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_geometry(x, kernel_size, stride, padding, dilation, ceil_mode, n):
    kernel = ntuple(kernel_size, n)
    stride = ntuple(stride, n) if stride else kernel
    padding, dilation = ntuple(padding, n), ntuple(dilation, n)
    out = tuple(
        _pooled_size(size, k, s, p, d, ceil_mode)
        for size, k, s, p, d in zip(x.shape[-n:], kernel, stride, padding, dilation)
    )
    require(
        all(o > 0 for o in out)
        and all(2 * p <= (k - 1) * d + 1 for k, p, d in zip(kernel, padding, dilation))
    )
    return kernel, stride, padding, dilation, out


def _pad_spatial(x, n, low, high, value):
    pads = [(0, 0)] * (x.ndim - n) + list(zip(low, high))
    return jnp.pad(x, pads, constant_values=value)


def _max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, n):
    """Max over each window, and the argmax as a flat index into the input's spatial plane
    (PyTorch's convention). Windows are gathered as one strided slice per kernel offset."""
    require(all(size > 0 for size in x.shape[-(n + 1) :]))  # channels and spatial sizes, as CPU
    kernel, stride, padding, dilation, out = _pool_geometry(
        x, kernel_size, stride, padding, dilation, ceil_mode, n
    )
    spatial = x.shape[-n:]
    lowest = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    high = [
        max(0, (o - 1) * s + d * (k - 1) + 1 - p - size)
        for o, s, d, k, p, size in zip(out, stride, dilation, kernel, padding, spatial)
    ]
    padded = _pad_spatial(x, n, padding, high, lowest)
    offsets = list(itertools.product(*(range(k) for k in kernel)))
    windows = jnp.stack(
        [
            padded[
                (...,)
                + tuple(
                    slice(o * d, o * d + (size - 1) * s + 1, s)
                    for o, d, size, s in zip(offset, dilation, out, stride)
                )
            ]
            for offset in offsets
        ],
        axis=-n - 1,
    )
    best = jnp.argmax(windows, axis=-n - 1)
    values = jnp.max(windows, axis=-n - 1)
    kernel_offsets = jnp.asarray(offsets, jnp.int64)[best]  # (..., *out, n)
    flat = jnp.zeros(best.shape, jnp.int64)
    for axis in range(n):
        grid = lax.broadcasted_iota(jnp.int64, out, axis)
        position = grid * stride[axis] - padding[axis] + kernel_offsets[..., axis] * dilation[axis]
        flat = flat * spatial[axis] + position
    return values, flat


def _scatter_to_plane(grad, x, indices, n):
    """Adds each output gradient at its flat index in the input plane (max-pool backward)."""
    plane = math.prod(x.shape[-n:])
    g = grad.reshape(math.prod(grad.shape[:-n]), math.prod(grad.shape[-n:]))  # no -1: sizes may be 0
    idx = indices.reshape(g.shape)
    rows = jnp.arange(g.shape[0])[:, None]
    return jnp.zeros((g.shape[0], plane), grad.dtype).at[rows, idx].add(g).reshape(x.shape)


def _max_pool_entries(forward, backward, n):
    @lower(forward, layout=Layout.META)
    def max_pool(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        return _max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, n)

    @lower(backward, layout=Layout.META)
    def max_pool_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
        return _scatter_to_plane(grad, x, indices, n)


_max_pool_entries(aten.max_pool2d_with_indices.default, aten.max_pool2d_with_indices_backward.default, 2)
_max_pool_entries(aten.max_pool3d_with_indices.default, aten.max_pool3d_with_indices_backward.default, 3)


def _window_counts(k, s, out, covered):
    """Per output position, how many of the positions ``covered`` (on the padded axis) its
    window holds: the avg-pool divisor along one axis."""
    return np.array([covered[o * s : o * s + k].sum() for o in range(out)], np.float64)


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n):
    require(all(x.shape[-n - 1 :]))  # only the batch dimension may be empty
    kernel, stride, padding, _, out = _pool_geometry(x, kernel_size, stride, padding, 1, ceil_mode, n)
    spatial = x.shape[-n:]
    compute = compute_dtype(x.dtype)
    high = [
        max(0, (o - 1) * s + k - p - size) for o, s, k, p, size in zip(out, stride, kernel, padding, spatial)
    ]
    padded = _pad_spatial(x.astype(compute), n, padding, high, 0)
    lead = (1,) * (x.ndim - n)
    sums = lax.reduce_window(padded, np.zeros((), compute), lax.add, lead + kernel, lead + stride, "VALID")
    sums = sums[(...,) + tuple(slice(0, o) for o in out)]
    if divisor_override:
        return (sums / divisor_override).astype(x.dtype)
    divisor = np.ones((), np.float64)
    for size, k, s, p, o, h in zip(spatial, kernel, stride, padding, out, high):
        # PyTorch counts padding but never the extra ceil_mode overhang beyond it
        covered = np.zeros(p + size + h)
        if count_include_pad:
            covered[: p + size + min(p, h)] = 1
        else:
            covered[p : p + size] = 1
        divisor = np.multiply.outer(divisor, _window_counts(k, s, o, covered))
    return (sums / divisor.astype(compute)).astype(x.dtype)


def _avg_pool_entries(forward, backward, n):
    @lower(forward, layout=Layout.META)
    def avg_pool(
        x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
    ):
        return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n)

    @lower(backward, layout=Layout.META)
    def avg_pool_backward(
        grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    ):
        return vjp(
            lambda x: avg_pool(
                x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
            ),
            (x,),
            grad,
            (True,),
        )[0]


_avg_pool_entries(aten.avg_pool2d.default, aten.avg_pool2d_backward.default, 2)
_avg_pool_entries(aten.avg_pool3d.default, aten.avg_pool3d_backward.default, 3)


def _check_adaptive(name: str):
    """CPU's adaptive pooling kernels take floating inputs only, and an empty dimension only
    as the batch."""

    def check(x, *_):
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            raise NotImplementedError(f"\"{name}\" not implemented for '{type_name(x.dtype)}'")
        if not all(x.shape[1:]):
            raise RuntimeError(
                f"{name}(): Expected input to have non-zero size for non-batch dimensions, "
                f"but input has sizes {list(x.shape)} with dimension {list(x.shape).index(0, 1)} being empty"
            )

    return check


def _adaptive_bounds(size: int, out: int):
    starts = [(i * size) // out for i in range(out)]
    ends = [-(-((i + 1) * size) // out) for i in range(out)]
    return starts, ends


def _adaptive_avg_pool(x, output_size, n):
    """Averages as one small (out, in) matrix per spatial axis, applied in turn."""
    compute = compute_dtype(x.dtype)
    y = x.astype(compute)
    for axis, out in zip(range(x.ndim - n, x.ndim), ntuple(output_size, n)):
        size = x.shape[axis]
        averaging = np.zeros((out, size))
        for row, (start, end) in enumerate(zip(*_adaptive_bounds(size, out))):
            averaging[row, start:end] = 1 / (end - start)
        y = jnp.moveaxis(
            jnp.tensordot(
                y, jnp.asarray(averaging.T, compute), ((axis,), (0,)), precision=lax.Precision.HIGHEST
            ),
            -1,
            axis,
        )
    return y.astype(x.dtype)


def _adaptive_avg_pool_entries(forward, backward, n):
    lower(forward, layout=Layout.META, check=_check_adaptive(f"adaptive_avg_pool{n}d"))(
        lambda x, output_size: _adaptive_avg_pool(x, output_size, n)
    )

    @lower(backward, layout=Layout.META)
    def adaptive_avg_pool_backward(grad, x):
        return vjp(lambda x: _adaptive_avg_pool(x, grad.shape[-n:], n), (x,), grad, (True,))[0]


_adaptive_avg_pool_entries(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d_backward.default, 2)
_adaptive_avg_pool_entries(aten._adaptive_avg_pool3d.default, aten._adaptive_avg_pool3d_backward.default, 3)


def _adaptive_max_pool(x, output_size, n):
    """Each axis gathers its (uneven) windows padded to the widest by repeating their last
    element, which never changes the max nor PyTorch's first-max argmax."""
    require(len(output_size) == n)  # (``output_size=()`` reaches the kernel: CPU's internal error)
    output_size = ntuple(output_size, n)
    windows, gathers = x, []
    for axis, out in zip(range(x.ndim - n, x.ndim), output_size):
        starts, ends = _adaptive_bounds(x.shape[axis], out)
        width = max((e - s for s, e in zip(starts, ends)), default=1)  # an empty output: any
        idx = np.array([[min(s + j, e - 1) for j in range(width)] for s, e in zip(starts, ends)], int)
        idx = idx.reshape(out, width)
        gathers.append(idx)
        # axis -> (out, width), with the width axes collected at the end
        gathered = jnp.take(windows, jnp.asarray(idx.reshape(-1)), axis=axis)
        gathered = gathered.reshape(windows.shape[:axis] + idx.shape + windows.shape[axis + 1 :])
        windows = jnp.moveaxis(gathered, axis + 1, -1)
    windows = windows.reshape(windows.shape[: x.ndim] + (math.prod(windows.shape[x.ndim :]),))
    best = jnp.argmax(windows, axis=-1)
    widths = tuple(g.shape[1] for g in gathers)
    offsets = jnp.unravel_index(best, widths)
    flat = jnp.zeros(best.shape, jnp.int64)
    for axis, (idx, offset) in enumerate(zip(gathers, offsets)):
        rows = lax.broadcasted_iota(jnp.int64, output_size, axis)
        flat = flat * x.shape[x.ndim - n + axis] + jnp.asarray(idx, jnp.int64)[rows, offset]
    return jnp.max(windows, axis=-1), flat


def _adaptive_max_pool_entries(forward, backward, n):
    lower(forward, layout=Layout.META, check=_check_adaptive(f"adaptive_max_pool{n}d"))(
        lambda x, output_size: _adaptive_max_pool(x, output_size, n)
    )
    lower(backward, layout=Layout.META)(lambda grad, x, indices: _scatter_to_plane(grad, x, indices, n))


_adaptive_max_pool_entries(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool2d_backward.default, 2)
_adaptive_max_pool_entries(aten.adaptive_max_pool3d.default, aten.adaptive_max_pool3d_backward.default, 3)


# ----------------------------------------------------------------------------- unpooling
def _planes(x, n):
    """``x`` as (planes, elements per spatial plane)."""
    return x.reshape(math.prod(x.shape[:-n]), math.prod(x.shape[-n:]))  # no -1: sizes may be 0


def _check_unpool_indices(x, indices, output_size, *_):
    check_bounds(
        [(indices, math.prod(output_size), False)], lambda *_: RuntimeError("Found an invalid max index")
    )


def _max_unpool(x, indices, output_size, n):
    """Each value written at its flat index into a zero output plane (max pooling's inverse)."""
    values, idx = _planes(x, n), _planes(indices, n)
    rows = jnp.arange(values.shape[0])[:, None]
    out = jnp.zeros((values.shape[0], math.prod(output_size)), x.dtype).at[rows, idx].set(values)
    return out.reshape(x.shape[:-n] + tuple(output_size))


lower(aten.max_unpool2d.default, check=_check_unpool_indices, layout=Layout.SUGGESTED)(
    lambda x, indices, output_size: _max_unpool(x, indices, output_size, 2)
)
lower(aten.max_unpool3d.default, check=_check_unpool_indices)(
    lambda x, indices, output_size, stride, padding: _max_unpool(x, indices, output_size, 3)
)


# ----------------------------------------------------------------------------- fractional
def _fractional_starts(sample, size: int, out: int, k: int):
    """PyTorch's generate_intervals: window starts spread pseudo-randomly by ``sample`` in [0, 1),
    computed in the sample's dtype; the last window ends at the input's edge."""
    if out <= 1:
        return jnp.full(sample.shape + (out,), size - k, jnp.int64)
    alpha = jnp.asarray(size - k, sample.dtype) / jnp.asarray(out - 1, sample.dtype)
    steps = jnp.arange(out - 1, dtype=sample.dtype)
    starts = ((steps + sample[..., None]) * alpha).astype(jnp.int64) - (sample * alpha).astype(jnp.int64)[
        ..., None
    ]
    return jnp.concatenate([starts, jnp.full(sample.shape + (1,), size - k, jnp.int64)], -1)


def _fractional_max_pool(x, kernel_size, output_size, samples, n):
    """(values, flat indices): the max of each kernel-sized window at the sampled starts. The
    samples hold one value per plane and axis, innermost axis first for 2-d (W, H) and outermost
    first for 3-d (T, H, W)."""
    spatial = x.shape[-n:]
    # PyTorch's 3-d kernel also rejects a last window ending exactly at the edge
    require(all(o + k - 1 < size + (n == 2) for o, k, size in zip(output_size, kernel_size, spatial)))
    samples = samples.reshape(x.shape[:-n] + (n,))
    axis_samples = [samples[..., n - 1 - axis if n == 2 else axis] for axis in range(n)]
    flat = jnp.zeros(x.shape[:-n] + (1,) * (2 * n), jnp.int64)
    for axis, (sample, size, out, k) in enumerate(zip(axis_samples, spatial, output_size, kernel_size)):
        positions = _fractional_starts(sample, size, out, k)[..., None] + jnp.arange(k)
        # axis -> (out, k) at output slot ``axis`` and window slot ``n + axis``
        shape = [1] * (2 * n)
        shape[axis], shape[n + axis] = out, k
        flat = flat * size + positions.reshape(positions.shape[:-2] + tuple(shape))
    flat = flat.reshape(flat.shape[: x.ndim] + (math.prod(flat.shape[x.ndim :]),))
    planes = _planes(x, n)
    windows = jnp.take_along_axis(planes, flat.reshape(planes.shape[0], -1 if flat.size else 0), 1)
    windows = windows.reshape(flat.shape)
    best = jnp.argmax(windows, axis=-1)
    return (jnp.max(windows, axis=-1), jnp.take_along_axis(flat, best[..., None], -1)[..., 0])


def _fractional_entries(forward, backward, n):
    lower(forward)(
        lambda x, kernel_size, output_size, samples: _fractional_max_pool(
            x, kernel_size, output_size, samples, n
        )
    )
    lower(backward)(lambda grad, x, kernel_size, output_size, indices: _scatter_to_plane(grad, x, indices, n))


_fractional_entries(aten.fractional_max_pool2d.default, aten.fractional_max_pool2d_backward.default, 2)
_fractional_entries(aten.fractional_max_pool3d.default, aten.fractional_max_pool3d_backward.default, 3)
