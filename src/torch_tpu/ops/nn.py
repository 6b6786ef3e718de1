"""nn lowerings: convolution, pooling, normalization, activation backwards, softmax, losses,
embedding, dropout and fused attention.

Backward ops are ``jax.vjp`` of the forward lowering wherever PyTorch's formula is the exact
derivative of its forward; they are written out where PyTorch's formula differs at the edges
(clamps, thresholds) or where PyTorch hands in saved statistics.
"""
from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .. import _random, _tensor
from .._registry import Promote, lower, runtime
from ._helpers import check_bounds

aten = torch.ops.aten
_HALF_TYPES = (jnp.float16, jnp.bfloat16)
_REDUCTIONS = ("none", "mean", "sum")  # at::Reduction enum order


def _compute_dtype(dtype) -> np.dtype:
    """PyTorch's opmath type: half types compute in float32."""
    return jnp.dtype(jnp.float32) if dtype in _HALF_TYPES else jnp.dtype(dtype)


def _precision(dtype):
    """Full float32 accuracy for matmul-like ops, as PyTorch CPU computes them."""
    return lax.Precision.HIGHEST if jnp.dtype(dtype) in (jnp.float32, jnp.float64) else None


def _vjp(fn, primals, cotangent, mask):
    """Gradients of ``fn`` at ``primals`` for the entries ``mask`` asks for (None elsewhere)."""
    _, pullback = jax.vjp(fn, *primals)
    grads = pullback(cotangent)
    return tuple(g if wanted else None for g, wanted in zip(grads, mask))


def _require(valid: bool) -> None:
    """Rejects arguments PyTorch rejects, at trace time (shapes are static, so this costs
    nothing per call). The ValueError makes the dispatcher replay the call on PyTorch's meta
    kernels, which raise PyTorch's own error."""
    if not valid:
        raise ValueError("invalid arguments")


def _wrap_dim(dim: int, ndim: int) -> int:
    bound = max(ndim, 1)
    if not -bound <= dim < bound:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-bound}, "
                         f"{bound - 1}], but got {dim})")
    return dim % bound


def _ntuple(value, n: int):
    """An ``int[n]`` argument as n ints (PyTorch lets a single value stand for all)."""
    value = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    return value * n if len(value) == 1 else value


# ----------------------------------------------------------------------------- convolution
def _conv_dimension_numbers(spatial_dims: int) -> tuple[str, str, str]:
    """PyTorch's layouts: input/output (N, C, *spatial), weight (O, I, *spatial)."""
    spatial = "DHW"[-spatial_dims:]
    return "NC" + spatial, "OI" + spatial, "NC" + spatial


def _transposed_weight(weight, groups: int):
    """(C_in, C_out/g, k...) -> (C_out, C_in/g, k...), spatially flipped: a transposed
    convolution is a convolution of the stride-dilated input with this kernel."""
    c_in, c_out_per_group, *kernel = weight.shape
    w = weight.reshape(groups, c_in // groups, c_out_per_group, *kernel)
    w = jnp.swapaxes(w, 1, 2).reshape(groups * c_out_per_group, c_in // groups, *kernel)
    return jnp.flip(w, axis=tuple(range(2, w.ndim)))


@lower(aten.convolution.default)
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    n = x.ndim - 2
    stride, padding, dilation = _ntuple(stride, n), _ntuple(padding, n), _ntuple(dilation, n)
    compute = _compute_dtype(x.dtype)
    options = dict(rhs_dilation=dilation, feature_group_count=groups,
                   dimension_numbers=_conv_dimension_numbers(n),
                   precision=_precision(compute), preferred_element_type=compute)
    if transposed:
        kernel = weight.shape[2:]
        output_padding = _ntuple(output_padding, n)
        pads = [(d * (k - 1) - p, d * (k - 1) - p + op)
                for k, p, d, op in zip(kernel, padding, dilation, output_padding)]
        out = lax.conv_general_dilated(x, _transposed_weight(weight, groups), (1,) * n, pads,
                                       lhs_dilation=stride, **options)
    else:
        out = lax.conv_general_dilated(x, weight, stride, [(p, p) for p in padding], **options)
    if bias is not None:
        out = out + bias.astype(compute).reshape((-1,) + (1,) * n)
    return out.astype(x.dtype)


@lower(aten.convolution_backward.default)
def convolution_backward(grad, x, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    def forward(x, weight):
        return convolution(x, weight, None, stride, padding, dilation, transposed,
                           output_padding, groups)
    grad_input, grad_weight = _vjp(forward, (x, weight), grad, output_mask[:2])
    grad_bias = None
    if output_mask[2]:
        axes = (0,) + tuple(range(2, grad.ndim))
        grad_bias = grad.astype(_compute_dtype(grad.dtype)).sum(axes).astype(grad.dtype)
    return grad_input, grad_weight, grad_bias


# ----------------------------------------------------------------------------- pooling
def _pooled_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling_output_shape: with ceil_mode the last window must start inside the
    input or its left padding."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_geometry(x, kernel_size, stride, padding, dilation, ceil_mode, n):
    kernel = _ntuple(kernel_size, n)
    stride = _ntuple(stride, n) if stride else kernel
    padding, dilation = _ntuple(padding, n), _ntuple(dilation, n)
    out = tuple(_pooled_size(size, k, s, p, d, ceil_mode) for size, k, s, p, d in
                zip(x.shape[-n:], kernel, stride, padding, dilation))
    _require(all(o > 0 for o in out) and all(
        2 * p <= (k - 1) * d + 1 for k, p, d in zip(kernel, padding, dilation)))
    return kernel, stride, padding, dilation, out


def _pad_spatial(x, n, low, high, value):
    pads = [(0, 0)] * (x.ndim - n) + list(zip(low, high))
    return jnp.pad(x, pads, constant_values=value)


def _max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, n):
    """Max over each window, and the argmax as a flat index into the input's spatial plane
    (PyTorch's convention). Windows are gathered as one strided slice per kernel offset."""
    kernel, stride, padding, dilation, out = _pool_geometry(
        x, kernel_size, stride, padding, dilation, ceil_mode, n)
    spatial = x.shape[-n:]
    lowest = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    high = [max(0, (o - 1) * s + d * (k - 1) + 1 - p - size)
            for o, s, d, k, p, size in zip(out, stride, dilation, kernel, padding, spatial)]
    padded = _pad_spatial(x, n, padding, high, lowest)
    offsets = list(itertools.product(*(range(k) for k in kernel)))
    windows = jnp.stack([
        padded[(...,) + tuple(slice(o * d, o * d + (size - 1) * s + 1, s)
                              for o, d, size, s in zip(offset, dilation, out, stride))]
        for offset in offsets], axis=-n - 1)
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
    g = grad.reshape(-1, math.prod(grad.shape[-n:]))
    idx = indices.reshape(g.shape)
    rows = jnp.arange(g.shape[0])[:, None]
    return jnp.zeros((g.shape[0], plane), grad.dtype).at[rows, idx].add(g).reshape(x.shape)


def _max_pool_entries(forward, backward, n):
    @lower(forward)
    def max_pool(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        return _max_pool_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, n)

    @lower(backward)
    def max_pool_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
        return _scatter_to_plane(grad, x, indices, n)


_max_pool_entries(aten.max_pool2d_with_indices.default,
                  aten.max_pool2d_with_indices_backward.default, 2)
_max_pool_entries(aten.max_pool3d_with_indices.default,
                  aten.max_pool3d_with_indices_backward.default, 3)


def _window_counts(k, s, out, covered):
    """Per output position, how many of the positions ``covered`` (on the padded axis) its
    window holds: the avg-pool divisor along one axis."""
    return np.array([covered[o * s: o * s + k].sum() for o in range(out)], np.float64)


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, n):
    kernel, stride, padding, _, out = _pool_geometry(x, kernel_size, stride, padding, 1,
                                                     ceil_mode, n)
    spatial = x.shape[-n:]
    compute = _compute_dtype(x.dtype)
    high = [max(0, (o - 1) * s + k - p - size)
            for o, s, k, p, size in zip(out, stride, kernel, padding, spatial)]
    padded = _pad_spatial(x.astype(compute), n, padding, high, 0)
    lead = (1,) * (x.ndim - n)
    sums = lax.reduce_window(padded, np.zeros((), compute), lax.add, lead + kernel,
                             lead + stride, "VALID")
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
            covered[p: p + size] = 1
        divisor = np.multiply.outer(divisor, _window_counts(k, s, o, covered))
    return (sums / divisor.astype(compute)).astype(x.dtype)


def _avg_pool_entries(forward, backward, n):
    @lower(forward)
    def avg_pool(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override, n)

    @lower(backward)
    def avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                          divisor_override):
        return _vjp(lambda x: avg_pool(x, kernel_size, stride, padding, ceil_mode,
                                       count_include_pad, divisor_override), (x,), grad, (True,))[0]


_avg_pool_entries(aten.avg_pool2d.default, aten.avg_pool2d_backward.default, 2)
_avg_pool_entries(aten.avg_pool3d.default, aten.avg_pool3d_backward.default, 3)


def _adaptive_bounds(size: int, out: int):
    starts = [(i * size) // out for i in range(out)]
    ends = [-(-((i + 1) * size) // out) for i in range(out)]
    return starts, ends


def _adaptive_avg_pool(x, output_size, n):
    """Averages as one small (out, in) matrix per spatial axis, applied in turn."""
    compute = _compute_dtype(x.dtype)
    y = x.astype(compute)
    for axis, out in zip(range(x.ndim - n, x.ndim), _ntuple(output_size, n)):
        size = x.shape[axis]
        averaging = np.zeros((out, size))
        for row, (start, end) in enumerate(zip(*_adaptive_bounds(size, out))):
            averaging[row, start:end] = 1 / (end - start)
        y = jnp.moveaxis(jnp.tensordot(y, jnp.asarray(averaging.T, compute), ((axis,), (0,)),
                                       precision=_precision(compute)), -1, axis)
    return y.astype(x.dtype)


def _adaptive_avg_pool_entries(forward, backward, n):
    lower(forward)(lambda x, output_size: _adaptive_avg_pool(x, output_size, n))

    @lower(backward)
    def adaptive_avg_pool_backward(grad, x):
        return _vjp(lambda x: _adaptive_avg_pool(x, grad.shape[-n:], n), (x,), grad, (True,))[0]


_adaptive_avg_pool_entries(aten._adaptive_avg_pool2d.default,
                           aten._adaptive_avg_pool2d_backward.default, 2)
_adaptive_avg_pool_entries(aten._adaptive_avg_pool3d.default,
                           aten._adaptive_avg_pool3d_backward.default, 3)


def _adaptive_max_pool(x, output_size, n):
    """Each axis gathers its (uneven) windows padded to the widest by repeating their last
    element, which never changes the max nor PyTorch's first-max argmax."""
    output_size = _ntuple(output_size, n)
    windows, gathers = x, []
    for axis, out in zip(range(x.ndim - n, x.ndim), output_size):
        starts, ends = _adaptive_bounds(x.shape[axis], out)
        width = max(e - s for s, e in zip(starts, ends))
        idx = np.array([[min(s + j, e - 1) for j in range(width)] for s, e in zip(starts, ends)])
        gathers.append(idx)
        # axis -> (out, width), with the width axes collected at the end
        gathered = jnp.take(windows, jnp.asarray(idx.reshape(-1)), axis=axis)
        gathered = gathered.reshape(windows.shape[:axis] + idx.shape + windows.shape[axis + 1:])
        windows = jnp.moveaxis(gathered, axis + 1, -1)
    windows = windows.reshape(windows.shape[:x.ndim] + (-1,))
    best = jnp.argmax(windows, axis=-1)
    widths = tuple(g.shape[1] for g in gathers)
    offsets = jnp.unravel_index(best, widths)
    flat = jnp.zeros(best.shape, jnp.int64)
    for axis, (idx, offset) in enumerate(zip(gathers, offsets)):
        rows = lax.broadcasted_iota(jnp.int64, output_size, axis)
        flat = flat * x.shape[x.ndim - n + axis] + jnp.asarray(idx, jnp.int64)[rows, offset]
    return jnp.max(windows, axis=-1), flat


def _adaptive_max_pool_entries(forward, backward, n):
    lower(forward)(lambda x, output_size: _adaptive_max_pool(x, output_size, n))
    lower(backward)(lambda grad, x, indices: _scatter_to_plane(grad, x, indices, n))


_adaptive_max_pool_entries(aten.adaptive_max_pool2d.default,
                           aten.adaptive_max_pool2d_backward.default, 2)
_adaptive_max_pool_entries(aten.adaptive_max_pool3d.default,
                           aten.adaptive_max_pool3d_backward.default, 3)


# ----------------------------------------------------------------------------- normalization
def _channel_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var). Statistics keep the
    parameters' dtype; outside training PyTorch saves empty statistics."""
    compute = _compute_dtype(x.dtype)
    params = next((p for p in (running_mean, weight) if p is not None), x)
    axes = (0,) + tuple(range(2, x.ndim))
    xc = x.astype(compute)
    if training:
        mean, var = xc.mean(axes), xc.var(axes)
        invstd = lax.rsqrt(var + eps)
        count = x.size // x.shape[1]
        if running_mean is not None:
            running_mean = (1 - momentum) * running_mean + momentum * mean.astype(params.dtype)
            unbiased = var * (count / max(count - 1, 1))
            running_var = (1 - momentum) * running_var + momentum * unbiased.astype(params.dtype)
    else:
        mean, invstd = running_mean.astype(compute), lax.rsqrt(running_var.astype(compute) + eps)
    shape = _channel_shape(x)
    out = _affine((xc - mean.reshape(shape)) * invstd.reshape(shape), weight, bias, shape)
    if not training:
        mean = invstd = jnp.zeros((0,), compute)
    return (out.astype(x.dtype), mean.astype(params.dtype), invstd.astype(params.dtype),
            running_mean, running_var)


@lower(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum,
                                 eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)


@lower(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    return _batch_norm(x, weight, bias, None, None, training, momentum, eps)[:3]


@lower(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@runtime(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """The training step updates the running statistics in place: the pure functional
    lowering computes them, this kernel writes them back into the caller's buffers."""
    out, mean, invstd, new_mean, new_var = aten._native_batch_norm_legit_functional(
        x, weight, bias, running_mean, running_var, training, momentum, eps)
    if training:
        _tensor.write(running_mean, _tensor.read(new_mean))
        _tensor.write(running_var, _tensor.read(new_var))
    return out, mean, invstd


@runtime(aten.native_batch_norm.default)
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if running_mean is None:
        return aten._native_batch_norm_legit.no_stats(x, weight, bias, training, momentum, eps)
    return native_batch_norm_legit(x, weight, bias, running_mean, running_var, training,
                                   momentum, eps)


# The batch_norm ops that torch.export / functionalization produce (eager uses those above).
def _reserve():
    return jnp.zeros((0,), jnp.uint8)


@lower(aten._batch_norm_with_update_functional.default)
def batch_norm_with_update_functional(x, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, new_mean, new_var = _batch_norm(x, weight, bias, running_mean, running_var,
                                                       True, momentum, eps)
    return out, mean, invstd, _reserve(), new_mean, new_var


@lower(aten._batch_norm_no_update.default)
def batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    training = running_mean is None  # without running statistics only the batch's exist
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum,
                       eps)[:3] + (_reserve(),)


@runtime(aten._batch_norm_with_update.default)
def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    return native_batch_norm_legit(x, weight, bias, running_mean, running_var, True, momentum,
                                   eps) + (_tensor.wrap(_reserve()),)


def _normalization_grad(grad_normalized, normalized, rstd, axes):
    """d(input) given d(normalized) for ``normalized = (x - mean(x)) * rstd`` over ``axes``."""
    def mean(v):
        return v.mean(axes, keepdims=True)
    return rstd * (grad_normalized - mean(grad_normalized)
                   - normalized * mean(grad_normalized * normalized))


def _masked(values, dtypes, mask):
    return tuple(v.astype(d) if wanted else None for v, d, wanted in zip(values, dtypes, mask))


@lower(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean,
                               save_invstd, train, eps, output_mask):
    compute = _compute_dtype(x.dtype)
    shape, axes = _channel_shape(x), (0,) + tuple(range(2, x.ndim))
    if train:
        mean, invstd = save_mean.astype(compute), save_invstd.astype(compute)
    else:
        mean, invstd = running_mean.astype(compute), lax.rsqrt(running_var.astype(compute) + eps)
    mean, invstd = mean.reshape(shape), invstd.reshape(shape)
    g = grad.astype(compute)
    normalized = (x.astype(compute) - mean) * invstd
    grad_normalized = g if weight is None else g * weight.astype(compute).reshape(shape)
    grad_input = _normalization_grad(grad_normalized, normalized, invstd, axes) if train \
        else grad_normalized * invstd
    param_dtype = x.dtype if weight is None else weight.dtype
    return _masked((grad_input, (g * normalized).sum(axes), g.sum(axes)),
                   (x.dtype, param_dtype, param_dtype), output_mask)


@lower(aten.batch_norm_backward.default)
def batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd,
                        update, eps, output_mask, reserve):
    return native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean,
                                      save_invstd, update, eps, output_mask)


def _normalize(x, axes, eps):
    """(normalized, mean, rstd) over ``axes`` (kept)."""
    mean = x.mean(axes, keepdims=True)
    rstd = lax.rsqrt(jnp.square(x - mean).mean(axes, keepdims=True) + eps)
    return (x - mean) * rstd, mean, rstd


def _affine(x, weight, bias, shape):
    if weight is not None:
        x = x * weight.astype(x.dtype).reshape(shape)
    if bias is not None:
        x = x + bias.astype(x.dtype).reshape(shape)
    return x


@lower(aten.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    _require(tuple(x.shape[x.ndim - len(normalized_shape):]) == tuple(normalized_shape))
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    out, mean, rstd = _normalize(x.astype(_compute_dtype(x.dtype)), axes, eps)
    out = _affine(out, weight, bias, normalized_shape)
    return out.astype(x.dtype), mean.astype(x.dtype), rstd.astype(x.dtype)


@lower(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    compute = _compute_dtype(x.dtype)
    batch_axes = tuple(range(x.ndim - len(normalized_shape)))
    axes = tuple(range(len(batch_axes), x.ndim))
    rstd = rstd.astype(compute)
    normalized = (x.astype(compute) - mean.astype(compute)) * rstd
    g = grad.astype(compute)
    grad_normalized = g if weight is None else g * weight.astype(compute)
    grad_input = _normalization_grad(grad_normalized, normalized, rstd, axes)
    param_dtype = x.dtype if weight is None else weight.dtype
    return _masked((grad_input, (g * normalized).sum(batch_axes), g.sum(batch_axes)),
                   (x.dtype, param_dtype, param_dtype), output_mask)


def _grouped(x, n, group):
    return x.reshape(n, group, -1)


@lower(aten.native_group_norm.default)
def native_group_norm(x, weight, bias, n, channels, hxw, group, eps):
    _require(channels % group == 0)
    compute = _compute_dtype(x.dtype)
    out, mean, rstd = _normalize(_grouped(x.astype(compute), n, group), (2,), eps)
    out = _affine(out.reshape(x.shape), weight, bias, (channels,) + (1,) * (x.ndim - 2))
    return out.astype(x.dtype), mean[..., 0].astype(x.dtype), rstd[..., 0].astype(x.dtype)


@lower(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad, x, mean, rstd, weight, n, channels, hxw, group, output_mask):
    compute = _compute_dtype(x.dtype)
    channel_shape = (channels,) + (1,) * (x.ndim - 2)
    rstd = rstd.astype(compute)[..., None]
    normalized = (_grouped(x.astype(compute), n, group) - mean.astype(compute)[..., None]) * rstd
    g = grad.astype(compute)
    grad_normalized = g if weight is None else g * weight.astype(compute).reshape(channel_shape)
    grad_input = _normalization_grad(_grouped(grad_normalized, n, group), normalized, rstd, (2,))
    per_channel = tuple(a for a in range(x.ndim) if a != 1)
    param_dtype = x.dtype if weight is None else weight.dtype
    return _masked((grad_input.reshape(x.shape),
                    (g * normalized.reshape(x.shape)).sum(per_channel), g.sum(per_channel)),
                   (x.dtype, param_dtype, param_dtype), output_mask)


# ----------------------------------------------------------------------------- activations
@lower(aten.threshold.default, promote=Promote.DEFAULT, promote_args=("self",))
def threshold(x, threshold, value, *, types):
    x = x.astype(types.compute)
    return jnp.where(x <= threshold, jnp.asarray(value, types.compute), x).astype(types.result)


def _activation_backward(op, formula) -> None:
    """``op(grad_output, self_or_result, *scalars)``: PyTorch's own derivative formula, computed
    in the promoted dtype of the two tensors."""
    tensors = tuple(a.name for a in op._schema.arguments if str(a.type) == "Tensor")

    @lower(op, promote=Promote.DEFAULT, promote_args=tensors)
    def backward(grad, x, *args, types):
        c = types.compute
        return formula(grad.astype(c), x.astype(c), *args).astype(types.result)


_SQRT_HALF = math.sqrt(0.5)
_GELU_PDF = 2 / math.sqrt(math.pi) * _SQRT_HALF * 0.5   # 1/sqrt(2 pi)
_GELU_TANH_BETA, _GELU_TANH_KAPPA = math.sqrt(2) * 2 / math.sqrt(math.pi) * 0.5, 0.044715


def _gelu_grad(g, x, approximate="none"):
    if approximate == "tanh":
        inner = _GELU_TANH_BETA * (x + _GELU_TANH_KAPPA * x ** 3)
        tanh_inner = jnp.tanh(inner)
        derivative = 0.5 * (1 + tanh_inner) + 0.5 * x * (1 - tanh_inner ** 2) * _GELU_TANH_BETA * (
            1 + 3 * _GELU_TANH_KAPPA * x * x)
        return g * derivative
    cdf = 0.5 * (1 + jax.scipy.special.erf(x * _SQRT_HALF))
    return g * (cdf + x * _GELU_PDF * jnp.exp(-0.5 * x * x))


def _silu_grad(g, x):
    sigmoid = jax.nn.sigmoid(x)
    return g * sigmoid * (1 + x * (1 - sigmoid))


def _mish_grad(g, x):
    tanh_softplus = jnp.tanh(jax.nn.softplus(x))
    return g * (tanh_softplus + x * jax.nn.sigmoid(x) * (1 - tanh_softplus ** 2))


def _elu_grad(g, alpha, scale, input_scale, is_result, x):
    if is_result:  # x is elu's output
        return jnp.where(x <= 0, g * input_scale * (x + alpha * scale), g * scale)
    return jnp.where(x <= 0, g * input_scale * alpha * scale * jnp.exp(x * input_scale), g * scale)


for _op, _formula in [
    (aten.gelu_backward.default, _gelu_grad),
    (aten.silu_backward.default, _silu_grad),
    (aten.mish_backward.default, _mish_grad),
    (aten.sigmoid_backward.default, lambda g, y: g * (1 - y) * y),
    (aten.tanh_backward.default, lambda g, y: g * (1 - y * y)),
    (aten.threshold_backward.default, lambda g, x, threshold: jnp.where(x <= threshold, 0, g)),
    (aten.leaky_relu_backward.default,
     lambda g, x, slope, self_is_result: jnp.where(x > 0, g, g * slope)),
    (aten.hardtanh_backward.default,
     lambda g, x, low, high: jnp.where((x <= low) | (x >= high), 0, g)),
    (aten.softplus_backward.default, lambda g, x, beta, threshold: jnp.where(
        x * beta > threshold, g, g * jax.nn.sigmoid(x * beta))),
    (aten.hardsigmoid_backward.default, lambda g, x: jnp.where((x > -3) & (x < 3), g / 6, 0)),
    (aten.hardswish_backward.default, lambda g, x: jnp.where(
        x <= -3, 0, jnp.where(x >= 3, g, g * (x / 3 + 0.5)))),
]:
    _activation_backward(_op, _formula)


def _glu(x, dim):
    first, second = jnp.split(x, 2, axis=dim)
    return first * jax.nn.sigmoid(second)


_activation_backward(aten.log_sigmoid_backward.default,
                     lambda g, x, buffer: g * jax.nn.sigmoid(-x))
lower(aten.glu.default)(lambda x, dim=-1: _glu(x, dim))
lower(aten.glu_backward.default)(
    lambda grad, x, dim: _vjp(lambda x: _glu(x, dim), (x,), grad, (True,))[0])


@lower(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(x):
    """(output, buffer); PyTorch's CPU kernel leaves the buffer empty."""
    compute = _compute_dtype(x.dtype)
    return jax.nn.log_sigmoid(x.astype(compute)).astype(x.dtype), jnp.zeros((0,), x.dtype)


@lower(aten.elu_backward.default, promote=Promote.DEFAULT,
       promote_args=("grad_output", "self_or_result"))
def elu_backward(grad, alpha, scale, input_scale, is_result, x, *, types):
    c = types.compute
    return _elu_grad(grad.astype(c), alpha, scale, input_scale, is_result,
                     x.astype(c)).astype(types.result)


# ----------------------------------------------------------------------------- softmax
def _along(fn, x, dim):
    """``fn(x, axis)`` that also accepts 0-d tensors (PyTorch treats them as one element)."""
    dim = _wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return fn(x.reshape(1), 0).reshape(())
    return fn(x, dim)


def _softmax_entry(op, fn):
    @lower(op)
    def softmax(x, dim, half_to_float):
        result = jnp.float32 if half_to_float else x.dtype
        return _along(fn, x.astype(_compute_dtype(x.dtype)), dim).astype(result)


_softmax_entry(aten._softmax.default, lambda x, axis: jax.nn.softmax(x, axis=axis))
_softmax_entry(aten._log_softmax.default, lambda x, axis: jax.nn.log_softmax(x, axis=axis))


@lower(aten._safe_softmax.default)
def safe_softmax(x, dim, dtype=None):
    """softmax whose fully masked rows (all -inf) are zeros instead of NaN."""
    x = x.astype(dtype or x.dtype)
    compute = _compute_dtype(x.dtype)

    def fn(x, axis):
        masked = jnp.all(x == -jnp.inf, axis=axis, keepdims=True)
        return jnp.where(masked, 0, jax.nn.softmax(x, axis=axis))
    return _along(fn, x.astype(compute), dim).astype(x.dtype)


def _softmax_backward_entry(op, fn):
    @lower(op)
    def backward(grad, output, dim, input_dtype):
        compute = _compute_dtype(grad.dtype)
        return _along(lambda out, axis: fn(grad.astype(compute).reshape(out.shape), out, axis),
                      output.astype(compute), dim).astype(input_dtype)


_softmax_backward_entry(aten._softmax_backward_data.default,
                        lambda g, y, axis: y * (g - (g * y).sum(axis, keepdims=True)))
_softmax_backward_entry(aten._log_softmax_backward_data.default,
                        lambda g, y, axis: g - jnp.exp(y) * g.sum(axis, keepdims=True))


# ----------------------------------------------------------------------------- losses
def _reduce(loss, reduction: int):
    name = _REDUCTIONS[reduction]
    return loss if name == "none" else loss.mean() if name == "mean" else loss.sum()


def _nll_weights(x, target, weight, ignore_index):
    """Per-target class weights (zero where ignored), targets safe to gather with, and which
    targets count."""
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    weights = jnp.ones(safe.shape, x.dtype) if weight is None else weight.astype(x.dtype)[safe]
    return jnp.where(valid, weights, 0), safe, valid


def _nll_loss(x, target, weight, reduction, ignore_index):
    class_axis = 0 if x.ndim == 1 else 1
    weights, safe, _ = _nll_weights(x, target, weight, ignore_index)
    picked = jnp.take_along_axis(x, jnp.expand_dims(safe, class_axis), class_axis)
    losses = -jnp.squeeze(picked, class_axis) * weights
    if _REDUCTIONS[reduction] == "none":
        return losses, jnp.zeros((), x.dtype)
    total_weight = weights.sum()
    total = losses.sum()
    return (total / total_weight if _REDUCTIONS[reduction] == "mean" else total), total_weight


def _nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    class_axis = 0 if x.ndim == 1 else 1
    weights, safe, valid = _nll_weights(x, target, weight, ignore_index)
    if _REDUCTIONS[reduction] == "mean":
        grad = grad / total_weight
    # ignored targets get no gradient even when total_weight is 0 (PyTorch never writes them)
    values = jnp.where(valid, -grad * weights, 0)
    picked = jax.nn.one_hot(safe, x.shape[class_axis], dtype=x.dtype, axis=class_axis)
    return picked * jnp.expand_dims(values, class_axis)


def _check_targets(x, target, weight, reduction, ignore_index, *_):
    classes = x.shape[0 if x.ndim == 1 else 1]
    check_bounds([(jnp.where(target == ignore_index, 0, target), classes, False)],
                 lambda _, value, size: IndexError(f"Target {value} is out of bounds."))


lower(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default,
      check=_check_targets)(_nll_loss)
lower(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)(_nll_loss_backward)


def _loss_entries(forward, backward, loss):
    """A pointwise loss ``loss(x, target, *args)`` reduced by ``reduction``; the backward is its
    vjp with respect to ``self``."""
    @lower(forward)
    def loss_forward(x, target, reduction=1, *args):
        compute = _compute_dtype(x.dtype)
        return _reduce(loss(x.astype(compute), target.astype(compute), *args),
                       reduction).astype(x.dtype)

    if backward is not None:
        @lower(backward)
        def loss_backward(grad, x, target, reduction, *args):
            return _vjp(lambda x: loss_forward(x, target, reduction, *args), (x,), grad,
                        (True,))[0]


def _smooth_l1(x, target, beta):
    diff = jnp.abs(x - target)
    if beta == 0:
        return diff
    return jnp.where(diff < beta, 0.5 * diff * diff / beta, diff - 0.5 * beta)


def _huber(x, target, delta):
    diff = x - target
    return jnp.where(jnp.abs(diff) < delta, 0.5 * diff * diff,
                     delta * (jnp.abs(diff) - 0.5 * delta))


_loss_entries(aten.mse_loss.default, aten.mse_loss_backward.default,
              lambda x, target: jnp.square(x - target))
_loss_entries(aten.smooth_l1_loss.default, aten.smooth_l1_loss_backward.default, _smooth_l1)
_loss_entries(aten.huber_loss.default, aten.huber_loss_backward.default, _huber)

_LOG_FLOOR, _BCE_EPSILON = -100.0, 1e-12  # PyTorch's clamps for log(0) and the grad's division


@lower(aten.binary_cross_entropy.default)
def binary_cross_entropy(x, target, weight=None, reduction=1):
    compute = _compute_dtype(x.dtype)
    xc, t = x.astype(compute), target.astype(compute)
    loss = -(t * jnp.maximum(jnp.log(xc), _LOG_FLOOR)
             + (1 - t) * jnp.maximum(jnp.log1p(-xc), _LOG_FLOOR))
    if weight is not None:
        loss = loss * weight.astype(compute)
    return _reduce(loss, reduction).astype(x.dtype)


@lower(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad, x, target, weight=None, reduction=1):
    compute = _compute_dtype(x.dtype)
    xc, t = x.astype(compute), target.astype(compute)
    result = grad.astype(compute) * (xc - t) / jnp.maximum((1 - xc) * xc, _BCE_EPSILON)
    if weight is not None:
        result = result * weight.astype(compute)
    if _REDUCTIONS[reduction] == "mean":
        result = result / x.size
    return jnp.broadcast_to(result, x.shape).astype(x.dtype)


@lower(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, reduction=1):
    compute = _compute_dtype(x.dtype)
    xc, t = x.astype(compute), target.astype(compute)
    log_sigmoid = jax.nn.log_sigmoid(xc)
    if pos_weight is None:
        loss = (1 - t) * xc - log_sigmoid
    else:
        loss = (1 - t) * xc - ((pos_weight.astype(compute) - 1) * t + 1) * log_sigmoid
    if weight is not None:
        loss = loss * weight.astype(compute)
    return _reduce(loss, reduction).astype(x.dtype)


# ----------------------------------------------------------------------------- embedding
def _check_embedding_indices(weight, indices, *_):
    check_bounds([(indices, weight.shape[0], False)],
                 lambda *_: IndexError("index out of range in self"))


@lower(aten.embedding.default, check=_check_embedding_indices)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lower(aten.embedding_renorm.default)
def embedding_renorm(weight, indices, max_norm, norm_type):
    """Rescales the looked-up rows whose norm exceeds ``max_norm`` (``embedding_renorm_`` is
    derived from this)."""
    rows = weight[indices.reshape(-1)].astype(_compute_dtype(weight.dtype))
    norms = jnp.linalg.norm(rows, ord=norm_type, axis=1, keepdims=True)
    scale = jnp.where(norms > max_norm, max_norm / (norms + 1e-7), 1)
    return weight.at[indices.reshape(-1)].set((rows * scale).astype(weight.dtype))


@lower(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """Row sums of the output gradient per index; the padding row gets none."""
    compute = _compute_dtype(grad.dtype)
    flat = indices.reshape(-1)
    rows = grad.reshape(flat.size, -1).astype(compute)
    rows = jnp.where((flat != padding_idx)[:, None], rows, 0)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), compute).at[flat].add(1)
        rows = rows / counts[flat][:, None]
    return jnp.zeros((num_weights, rows.shape[1]), compute).at[flat].add(rows).astype(grad.dtype)


# ----------------------------------------------------------------------------- dropout
def _dropout(x, p, key):
    keep = jax.random.bernoulli(key, 1 - p, x.shape)
    scale = 1 / (1 - p) if p < 1 else 0.0
    return jnp.where(keep, x * jnp.asarray(scale, x.dtype), 0).astype(x.dtype), keep


@lower(aten.native_dropout.default, random=True)
def native_dropout(x, p, train, *, key):
    if train is not None and not train:
        return x, jnp.ones(x.shape, jnp.bool_)
    return _dropout(x, p, key)


@lower(aten.native_dropout_backward.default, promote=Promote.DEFAULT,
       promote_args=("grad_output", "mask", "scale"))
def native_dropout_backward(grad, mask, scale, *, types):
    """``grad * mask * scale`` as PyTorch computes it: an integer or bool gradient gives a
    floating result (the float ``scale`` promotes it)."""
    scaled = grad.astype(types.compute) * mask * jnp.asarray(scale, types.compute)
    return scaled.astype(types.result)


# ----------------------------------------------------------------------------- attention
@runtime(aten._fused_sdp_choice.default)
def fused_sdp_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                     scale=None, enable_gqa=False) -> int:
    """The fused kernel below whenever the user leaves it enabled, else PyTorch's math path."""
    backend = torch.nn.attention.SDPBackend
    if torch._C._get_overrideable_sdp_enabled():
        return int(backend.OVERRIDEABLE)
    return int(backend.MATH)


def _pack_key(key) -> jax.Array:
    """A PRNG key as one int64, PyTorch's shape for ``philox_seed``, so backward replays the
    forward's dropout mask."""
    high, low = jax.random.key_data(key).astype(jnp.int64)
    return (high << 32) | low


def _unpack_key(seed):
    return jax.random.wrap_key_data(jnp.stack([seed >> 32, seed & 0xFFFF_FFFF]).astype(jnp.uint32))


def _attention(q, k, v, bias, seed, dropout_p, is_causal, scale):
    """(output, logsumexp). Grouped-query attention (fewer key/value heads) repeats the
    key/value heads; fully masked rows give zeros, as PyTorch's math path does."""
    compute = _compute_dtype(q.dtype)
    precision = _precision(compute)
    q, k, v = (t.astype(compute) for t in (q, k, v))
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        k, v = (jnp.repeat(t, q.shape[-3] // t.shape[-3], axis=-3) for t in (k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = jnp.einsum("...ld,...sd->...ls", q, k, precision=precision) * scale
    if is_causal:
        scores = jnp.where(jnp.tril(jnp.ones(scores.shape[-2:], jnp.bool_)), scores, -jnp.inf)
    if bias is not None:
        scores = jnp.where(bias, scores, -jnp.inf) if bias.dtype == jnp.bool_ \
            else scores + bias.astype(compute)
    row_max = lax.stop_gradient(scores.max(-1, keepdims=True))
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0)
    exps = jnp.exp(scores - row_max)
    sums = exps.sum(-1, keepdims=True)
    weights = exps / jnp.where(sums == 0, 1, sums)
    if dropout_p > 0:
        weights = _dropout(weights, dropout_p, _unpack_key(seed))[0]
    out = jnp.einsum("...ls,...sd->...ld", weights, v, precision=precision)
    logsumexp = (jnp.log(sums) + row_max)[..., 0]
    return out.astype(q.dtype), logsumexp.astype(jnp.float32)


_attention_forward = jax.jit(_attention, static_argnums=(5, 6, 7))


@runtime(aten._scaled_dot_product_fused_attention_overrideable.default)
def scaled_dot_product_fused_attention(query, key, value, attn_bias=None, dropout_p=0.0,
                                       is_causal=False, return_debug_mask=False, *, scale=None):
    """A runtime entry only because the schema also returns ints (max_q, max_k)."""
    seed = _pack_key(_random.next_key())
    bias = None if attn_bias is None else _tensor.read(attn_bias)
    out, logsumexp = _attention_forward(_tensor.read(query), _tensor.read(key),
                                        _tensor.read(value), bias, seed, dropout_p, is_causal,
                                        scale)
    return (_tensor.wrap(out), _tensor.wrap(logsumexp), None, None, query.shape[-2],
            key.shape[-2], _tensor.wrap(seed), _tensor.wrap(jnp.zeros((), jnp.int64)), None)


@lower(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def scaled_dot_product_fused_attention_backward(
        grad, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
        cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, scale=None):
    primals = (query, key, value) + (() if attn_bias is None else (attn_bias,))

    def forward(q, k, v, *bias):
        return _attention(q, k, v, bias[0] if bias else None, philox_seed, dropout_p, is_causal,
                          scale)[0]
    grads = _vjp(forward, primals, grad, grad_input_mask)
    return grads + (None,) * (4 - len(grads))
