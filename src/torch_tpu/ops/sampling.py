"""Resampling lowerings: ``upsample_*`` (nearest, linear, cubic, antialiased), ``grid_sampler_*``
and ``affine_grid_generator``.

Upsampling is separable: along each spatial dimension an output position reads a few input
positions ("taps") with weights. Sizes and scales are static, so taps and weights are computed
with numpy at trace time, following PyTorch's CPU formulas (``UpSample.h``) step by step in
the dtype PyTorch uses for them (float32, float64 for float64 inputs; nearest always float32).
Every backward op is the VJP of its forward.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ._helpers import accumulator
from .registry import Layout, lower

aten = torch.ops.aten

CUBIC_A = -0.75  # upsample_bicubic2d and grid_sampler's bicubic coefficient
CUBIC_AA_A = -0.5  # the antialiased bicubic filter's (Pillow's)
Taps = tuple[np.ndarray, np.ndarray]  # (indices, weights), both (output_size, taps)


# ----------------------------------------------------------------------------- source positions
def _scale_value(scale: float | None, input_size: int, output_size: int, dtype) -> np.generic:
    """``compute_scales_value``: 1/scale when given, else input/output, in ``dtype``."""
    if scale is not None and scale > 0:
        return dtype(1.0 / scale)
    return dtype(input_size) / dtype(output_size)


def _area_scale(input_size: int, output_size: int, align_corners: bool, scale, dtype) -> np.generic:
    """``area_pixel_compute_scale``."""
    if align_corners:
        return dtype(input_size - 1) / dtype(output_size - 1) if output_size > 1 else dtype(0)
    return _scale_value(scale, input_size, output_size, dtype)


def _source_positions(input_size, output_size, align_corners, scale, dtype, cubic) -> np.ndarray:
    """``area_pixel_compute_source_index`` for every output position."""
    step = _area_scale(input_size, output_size, align_corners, scale, dtype)
    destination = np.arange(output_size).astype(dtype)
    if align_corners:
        return step * destination
    source = step * (destination + dtype(0.5)) - dtype(0.5)
    return source if cubic else np.maximum(source, dtype(0))


def _nearest_taps(input_size, output_size, scale, dtype, exact: bool) -> Taps:
    """``nearest_idx`` (floor(dst * scale), with its exact-size shortcuts) or
    ``nearest_exact_idx`` (floor((dst + 0.5) * scale), the product taken in double)."""
    destination = np.arange(output_size)
    if not exact and output_size == input_size:
        index = destination
    elif not exact and output_size == 2 * input_size:
        index = destination >> 1
    else:
        step = _scale_value(scale, input_size, output_size, np.float32)
        position = (destination + 0.5) * np.float64(step) if exact else destination.astype(np.float32) * step
        index = np.minimum(np.floor(position.astype(np.float32)).astype(np.int64), input_size - 1)
    return index[:, None], np.ones((output_size, 1), dtype)


def _floor_and_fraction(position: np.ndarray, input_size: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``guard_index_and_lambda``: the tap left of ``position`` and the fraction past it."""
    index = np.minimum(np.floor(position.astype(np.float32)).astype(np.int64), input_size - 1)
    return index, np.clip(position - index.astype(dtype), dtype(0), dtype(1))


def _linear_taps(input_size, output_size, align_corners, scale, dtype) -> Taps:
    position = _source_positions(input_size, output_size, align_corners, scale, dtype, cubic=False)
    index, fraction = _floor_and_fraction(position, input_size, dtype)
    right = index + (index < input_size - 1)
    return np.stack([index, right], 1), np.stack([dtype(1) - fraction, fraction], 1)


def _cubic_near(x, a):
    """``cubic_convolution1``: the filter for |x| <= 1."""
    return ((a + 2) * x - (a + 3)) * x * x + 1


def _cubic_far(x, a):
    """``cubic_convolution2``: the filter for 1 < |x| < 2."""
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a


def _cubic_coefficients(t, a=CUBIC_A) -> list:
    """``get_cubic_upsample_coefficients``: weights of the taps at -1, 0, 1, 2 from ``t``."""
    rest = 1 - t
    return [_cubic_far(t + 1, a), _cubic_near(t, a), _cubic_near(rest, a), _cubic_far(rest + 1, a)]


def _cubic_taps(input_size, output_size, align_corners, scale, dtype) -> Taps:
    position = _source_positions(input_size, output_size, align_corners, scale, dtype, cubic=True)
    index, fraction = _floor_and_fraction(position, input_size, dtype)
    taps = np.clip(index[:, None] + np.arange(-1, 3), 0, input_size - 1)
    return taps, np.stack(_cubic_coefficients(fraction, dtype(CUBIC_A)), 1).astype(dtype)


def _triangle(x):
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0)


def _cubic_filter(a: float) -> Callable:
    """The cubic convolution kernel with coefficient ``a`` as a filter on distances."""

    def cubic(x):
        x = np.abs(x)
        a_ = x.dtype.type(a)
        return np.where(x < 1, _cubic_near(x, a_), np.where(x < 2, _cubic_far(x, a_), 0))

    return cubic


def _filtered_taps(
    input_size,
    output_size,
    align_corners,
    scale,
    dtype,
    filter_fn: Callable,
    support_size: int,
    antialias: bool,
    corner_delta: float = 0.0,
) -> Taps:
    """``_compute_indices_min_size_weights_aa``: taps within the filter's support around each
    output centre, weights normalized to sum to 1. Antialiasing stretches the filter by the
    scale when downsampling, so every input position contributes. ``corner_delta`` is 0.5 in
    CPU's uint8 kernels for align_corners without antialiasing."""
    step = _area_scale(input_size, output_size, align_corners, scale, dtype)
    stretch = antialias and step >= 1
    support = dtype(support_size * 0.5) * (step if stretch else dtype(1))
    width = int(np.ceil(support)) * 2 + 1 if antialias else support_size
    delta = dtype(corner_delta)
    center = step * (np.arange(output_size) + dtype(0.5) - delta).astype(dtype)
    start = np.maximum((center - support + dtype(0.5) + delta).astype(np.int64), 0)
    stop = np.minimum((center + support + dtype(0.5) + delta).astype(np.int64), input_size)
    count = np.clip(stop - start, 0, width)
    index = start[:, None] + np.arange(width)
    inverse = dtype(1) / step if stretch else dtype(1)
    weights = filter_fn((index - center[:, None] + dtype(0.5) - delta).astype(dtype) * inverse)
    weights = np.where(np.arange(width) < count[:, None], weights, dtype(0)).astype(dtype)
    total = weights.sum(1, keepdims=True)
    weights = np.where(total != 0, weights / np.where(total != 0, total, 1), weights)
    return np.minimum(index, input_size - 1), weights.astype(dtype)


def _int16_weights(weights: np.ndarray) -> tuple[np.ndarray, int]:
    """CPU's uint8 kernels' fixed point: weights scaled by 2**precision (the most bits that
    keep the largest weight within int16) and rounded half away from zero."""
    largest = weights.max()
    precision = 0
    while precision < 22 and int(0.5 + largest * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    return np.trunc(scaled + np.where(scaled < 0, -0.5, 0.5)).astype(np.int32), precision


# ----------------------------------------------------------------------------- upsampling
def _resample(
    x: jax.Array,
    output_size: Sequence[int],
    scales: Sequence[float | None],
    taps_for: Callable[[int, int, float | None], Taps],
    weighted: bool,
) -> jax.Array:
    """Resample the trailing ``len(output_size)`` dims of ``x`` one dimension at a time."""
    dtype = accumulator(x.dtype) if weighted else x.dtype
    spatial = len(output_size)
    result = x.astype(dtype) if weighted else x
    for k, (size, scale) in enumerate(zip(output_size, scales)):
        axis = x.ndim - spatial + k
        index, weights = taps_for(x.shape[axis], size, scale)
        broadcast = (slice(None),) + (None,) * (spatial - k - 1)
        if not weighted:
            result = jnp.take(result, index[:, 0], axis=axis)
            continue
        result = sum(
            jnp.take(result, index[:, t], axis=axis) * weights[:, t][broadcast] for t in range(index.shape[1])
        )
    return result if not weighted else result.astype(x.dtype)


def _resample_uint8(
    x: jax.Array, output_size, scales, align_corners: bool, taps_fn: Callable[..., Taps]
) -> jax.Array:
    """CPU's uint8 kernels (Pillow's algorithm): one pass per resized dimension, last first,
    in fixed point, each pass rounded and saturated back to uint8."""
    spatial = len(output_size)
    result = x
    for k in reversed(range(spatial)):
        axis = x.ndim - spatial + k
        if x.shape[axis] == output_size[k]:
            continue
        index, weights = taps_fn(x.shape[axis], output_size[k], align_corners, scales[k], np.float64)
        weights, precision = _int16_weights(weights)
        broadcast = (slice(None),) + (None,) * (spatial - k - 1)
        total = sum(
            jnp.take(result, index[:, t], axis=axis).astype(jnp.int32) * weights[:, t][broadcast]
            for t in range(index.shape[1])
        )
        result = jnp.clip((total + (1 << (precision - 1))) >> precision, 0, 255).astype(x.dtype)
    return result


def _weight_dtype(x: jax.Array):
    return np.float64 if x.dtype == jnp.float64 else np.float32


def _nearest(exact: bool):
    def forward(x, output_size, *scales):
        scales = scales or (None,) * len(output_size)
        return _resample(
            x, output_size, scales, lambda i, o, s: _nearest_taps(i, o, s, np.float32, exact), weighted=False
        )

    return forward


def _interpolating(taps_fn: Callable, uint8_taps: Callable | None = None):
    """A linear/cubic upsample; ``uint8_taps`` gives the (float64) taps of CPU's uint8 kernel
    for the modes CPU also runs on uint8 images."""

    def forward(x, output_size, align_corners, *scales):
        scales = scales or (None,) * len(output_size)
        if x.dtype == jnp.uint8:
            return _resample_uint8(x, output_size, scales, align_corners, uint8_taps)
        dtype = _weight_dtype(x)
        return _resample(
            x, output_size, scales, lambda i, o, s: taps_fn(i, o, align_corners, s, dtype), weighted=True
        )

    return forward


def _backward_of(forward: Callable):
    """``*_backward(grad_output, output_size, input_size, *options)``: the VJP of ``forward``."""

    def backward(grad_output, output_size, input_size, *options):
        zeros = jnp.zeros(input_size, grad_output.dtype)
        _, vjp = jax.vjp(lambda x: forward(x, output_size, *options), zeros)
        return vjp(grad_output)[0]

    return backward


def _upsample_family(forward: Callable, ops: Sequence, backward_ops: Sequence) -> None:
    lower(*ops, layout=Layout.META)(forward)
    lower(*backward_ops, layout=Layout.META)(_backward_of(forward))


def _antialiased(filter_fn: Callable, support_size: int) -> Callable[..., Taps]:
    return functools.partial(_filtered_taps, filter_fn=filter_fn, support_size=support_size, antialias=True)


def _bilinear_uint8_taps(input_size, output_size, align_corners, scale, dtype) -> Taps:
    """CPU's uint8 bilinear kernel shares the antialiasing one's taps, shifted half a pixel
    for align_corners."""
    return _filtered_taps(
        input_size,
        output_size,
        align_corners,
        scale,
        dtype,
        _triangle,
        2,
        antialias=False,
        corner_delta=0.5 if align_corners else 0.0,
    )


_upsample_family(
    _nearest(exact=False),
    (aten.upsample_nearest1d, aten.upsample_nearest2d, aten.upsample_nearest3d),
    (aten.upsample_nearest1d_backward, aten.upsample_nearest2d_backward, aten.upsample_nearest3d_backward),
)
_upsample_family(
    _nearest(exact=True),
    (aten._upsample_nearest_exact1d, aten._upsample_nearest_exact2d, aten._upsample_nearest_exact3d),
    (
        aten._upsample_nearest_exact1d_backward,
        aten._upsample_nearest_exact2d_backward,
        aten._upsample_nearest_exact3d_backward,
    ),
)
_upsample_family(
    _interpolating(_linear_taps),
    (aten.upsample_linear1d, aten.upsample_trilinear3d),
    (aten.upsample_linear1d_backward, aten.upsample_trilinear3d_backward),
)
_upsample_family(
    _interpolating(_linear_taps, _bilinear_uint8_taps),
    (aten.upsample_bilinear2d,),
    (aten.upsample_bilinear2d_backward,),
)
_upsample_family(
    _interpolating(_cubic_taps, _cubic_taps), (aten.upsample_bicubic2d,), (aten.upsample_bicubic2d_backward,)
)
_upsample_family(
    _interpolating(*[_antialiased(_triangle, 2)] * 2),
    (aten._upsample_bilinear2d_aa,),
    (aten._upsample_bilinear2d_aa_backward,),
)
_upsample_family(
    _interpolating(*[_antialiased(_cubic_filter(CUBIC_AA_A), 4)] * 2),
    (aten._upsample_bicubic2d_aa,),
    (aten._upsample_bicubic2d_aa_backward,),
)


# ----------------------------------------------------------------------------- grid sampling
BILINEAR, NEAREST, BICUBIC = 0, 1, 2  # GridSamplerInterpolation
ZEROS, BORDER, REFLECTION = 0, 1, 2  # GridSamplerPadding


def _unnormalize(coordinate, size: int, align_corners: bool):
    """``grid_sampler_unnormalize``: [-1, 1] to pixel coordinates."""
    if align_corners:
        return (coordinate + 1) / 2 * (size - 1)
    return ((coordinate + 1) * size - 1) / 2


def _reflect(coordinate, twice_low: int, twice_high: int):
    """``reflect_coordinates``: fold ``coordinate`` into [low, high] by mirroring at its ends."""
    if twice_low == twice_high:
        return jnp.zeros_like(coordinate)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = jnp.abs(coordinate - low)
    extra = jnp.fmod(distance, span)
    flips = jnp.floor(distance / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _pad_coordinate(coordinate, size: int, padding_mode: int, align_corners: bool):
    """``compute_coordinates``: where border/reflection padding reads an outside coordinate."""
    if padding_mode == BORDER:
        return jnp.clip(coordinate, 0, size - 1)
    if padding_mode == REFLECTION:
        bounds = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        return jnp.clip(_reflect(coordinate, *bounds), 0, size - 1)
    return coordinate


def _source_coordinate(coordinate, size, padding_mode, align_corners):
    """``grid_sampler_compute_source_index`` (non-finite coordinates read nothing, as on CPU)."""
    source = _pad_coordinate(_unnormalize(coordinate, size, align_corners), size, padding_mode, align_corners)
    return jnp.where(jnp.isfinite(source), source, -100.0)


def _read(x, indices: Sequence[jax.Array]):
    """``x[n, :, *indices[n]]`` as one gather on the flattened image, zeros where an index is
    outside (indices: one (N, *points) array per spatial dim) -> (N, C, *points)."""
    sizes = x.shape[2:]
    inside = functools.reduce(operator.and_, [(i >= 0) & (i < n) for i, n in zip(indices, sizes)])
    flat_index = 0
    for index, size in zip(indices, sizes):
        flat_index = flat_index * size + jnp.clip(index, 0, size - 1).astype(jnp.int32)
    points = flat_index.shape[1:]
    flat_image = x.reshape(*x.shape[:2], math.prod(sizes))
    values = jax.vmap(lambda image, where: image[:, where])(
        flat_image, flat_index.reshape(x.shape[0], math.prod(points))
    )
    return values.reshape(*x.shape[:2], *points) * jnp.expand_dims(inside, 1).astype(x.dtype)


def _weighted_sum(values, weights: Sequence[jax.Array]):
    """``sum_k values[:, :, k] * weights[k]`` in order (weights broadcast over channels)."""
    result = 0
    for k, weight in enumerate(weights):
        result = result + values[:, :, k] * jnp.expand_dims(weight, 1)
    return result


def _grid_sample(x, grid, interpolation_mode: int, padding_mode: int, align_corners: bool):
    """grid_sampler_{2,3}d. ``grid[..., 0]`` is the x (last, width) coordinate. Computed in
    the input dtype throughout, as CPU's kernels are (half types round at every step)."""
    sizes = x.shape[2:]
    coordinates = [grid[..., len(sizes) - 1 - k] for k in range(len(sizes))]  # (d,) h, w order
    if interpolation_mode == BICUBIC:
        return _bicubic_grid_sample(x, coordinates, padding_mode, align_corners)
    sources = [
        _source_coordinate(c, size, padding_mode, align_corners) for c, size in zip(coordinates, sizes)
    ]
    if interpolation_mode == NEAREST:
        return _read(x, [jnp.round(s) for s in sources])  # round half to even (nearbyint)
    lows = [jnp.floor(s) for s in sources]
    corners = list(itertools.product((0, 1), repeat=len(sizes)))
    weights = []
    for corner in corners:
        weight = 1
        for high, source, low in zip(corner, sources, lows):
            weight = weight * (source - low if high else low + 1 - source)
        weights.append(weight)
    values = _read(x, [jnp.stack([low + corner[k] for corner in corners], 1) for k, low in enumerate(lows)])
    return _weighted_sum(values, weights)


def _bicubic_grid_sample(x, coordinates, padding_mode, align_corners):
    """Bicubic: 4x4 taps around the unnormalized point, each tap's index padded on its own;
    rows interpolated first, then the column of row results."""
    height, width = x.shape[2:]
    y, x_coordinate = (_unnormalize(c, size, align_corners) for c, size in zip(coordinates, (height, width)))
    y0, x0 = jnp.floor(y), jnp.floor(x_coordinate)
    rows = jnp.stack([_pad_coordinate(y0 - 1 + i, height, padding_mode, align_corners) for i in range(4)], 1)
    columns = jnp.stack(
        [_pad_coordinate(x0 - 1 + j, width, padding_mode, align_corners) for j in range(4)], 1
    )
    values = _read(x, [jnp.expand_dims(rows, 2), jnp.expand_dims(columns, 1)])  # (N, C, 4, 4, ...)
    column_weights = _cubic_coefficients(x_coordinate - x0)
    row_results = jnp.stack([_weighted_sum(values[:, :, i], column_weights) for i in range(4)], 2)
    return _weighted_sum(row_results, _cubic_coefficients(y - y0))


@lower(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners)


@lower(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def grid_sampler_backward(grad_output, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    _, vjp = jax.vjp(
        lambda image, points: grid_sampler(image, points, interpolation_mode, padding_mode, align_corners),
        x,
        grid,
    )
    return vjp(grad_output.astype(x.dtype))  # output_mask only saves work on CPU


def _linspace_from_neg_one(steps: int, align_corners: bool, dtype) -> jax.Array:
    """``linspace_from_neg_one``: pixel centres (or corners) in [-1, 1]."""
    if steps <= 1:
        return jnp.zeros((steps,), dtype)
    points = jnp.linspace(-1, 1, steps, dtype=dtype)
    return points if align_corners else points * (steps - 1) / steps


@lower(aten.affine_grid_generator.default)
def affine_grid_generator(theta, size, align_corners):
    """The base grid (x, y[, z], 1) of every output position times ``theta`` transposed."""
    spatial = size[2:]
    axes = [_linspace_from_neg_one(n, align_corners, theta.dtype) for n in reversed(spatial)]
    mesh = jnp.meshgrid(*axes[::-1], indexing="ij")[::-1]  # x varies along the last dim
    base = jnp.stack([*mesh, jnp.ones(spatial, theta.dtype)], -1).reshape(
        math.prod(spatial), len(spatial) + 1
    )
    grid = jnp.einsum("pk,nik->npi", base, theta, precision=jax.lax.Precision.HIGHEST)
    return grid.reshape(size[0], *spatial, len(spatial))
