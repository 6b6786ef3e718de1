"""nn lowerings: convolution, normalization, activation backwards, softmax, embedding,
dropout and attention (losses and pooling have their own modules).

Backward ops are ``jax.vjp`` of the forward lowering wherever PyTorch's formula is the exact
derivative of its forward; they are written out where PyTorch's formula differs at the edges
(clamps, thresholds) or where PyTorch hands in saved statistics.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..runtime import buffer, platform, tensor
from ..runtime import padding as padding_state
from ..runtime.buffer import Padded, apply
from ..runtime.lru import cached
from ..runtime.precision import matmul_precision
from ..runtime.random import key_of, next_key
from ._helpers import check_bounds
from ._nn_helpers import compute_dtype, ntuple, require, vjp, wrap_dim
from .padding import ATTENTION_BACKWARD, TAKE, TAKE_BACKWARD, Along, Rowwise, attention
from .registry import Layout, Promote, lower, runtime

aten = torch.ops.aten


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


@lower(aten.convolution.default, layout=Layout.CONVOLUTION)
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if any(p < 0 for p in padding):  # CPU's first check, which the meta kernel lacks
        raise RuntimeError("negative padding is not supported")
    n = x.ndim - 2
    stride, padding, dilation = ntuple(stride, n), ntuple(padding, n), ntuple(dilation, n)
    compute = compute_dtype(x.dtype)
    options = dict(
        rhs_dilation=dilation,
        feature_group_count=groups,
        dimension_numbers=_conv_dimension_numbers(n),
        precision=lax.Precision.HIGHEST,  # (the matmul precision setting is not for convolutions)
        preferred_element_type=compute,
    )
    if transposed:
        kernel = weight.shape[2:]
        output_padding = ntuple(output_padding, n)
        pads = [
            (d * (k - 1) - p, d * (k - 1) - p + op)
            for k, p, d, op in zip(kernel, padding, dilation, output_padding)
        ]
        out = lax.conv_general_dilated(
            x, _transposed_weight(weight, groups), (1,) * n, pads, lhs_dilation=stride, **options
        )
    else:
        out = lax.conv_general_dilated(x, weight, stride, [(p, p) for p in padding], **options)
    if bias is not None:
        out = out + bias.astype(compute).reshape((-1,) + (1,) * n)
    return out.astype(x.dtype)


@lower(aten.convolution_backward.default, layout=Layout.CONVOLUTION)
def convolution_backward(
    grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    def forward(x, weight):
        return convolution(x, weight, None, stride, padding, dilation, transposed, output_padding, groups)

    grad_input, grad_weight = vjp(forward, (x, weight), grad, output_mask[:2])
    grad_bias = None
    if output_mask[2]:
        axes = (0,) + tuple(range(2, grad.ndim))
        grad_bias = grad.astype(compute_dtype(grad.dtype)).sum(axes).astype(grad.dtype)
    return grad_input, grad_weight, grad_bias


@lower(aten.conv_tbc.default)
def conv_tbc(x, weight, bias, pad=0):
    """A 1-d convolution in (time, batch, channel) layout with a (kernel, in, out) weight."""
    out = convolution(
        jnp.transpose(x, (1, 2, 0)),
        jnp.transpose(weight, (2, 1, 0)),
        bias,
        (1,),
        (pad,),
        (1,),
        False,
        (0,),
        1,
    )
    return jnp.transpose(out, (2, 0, 1))


# ----------------------------------------------------------------------------- normalization
def _channel_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var). Statistics keep the
    parameters' dtype; outside training PyTorch saves empty statistics."""
    compute = compute_dtype(x.dtype)
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
    return (
        out.astype(x.dtype),
        mean.astype(params.dtype),
        invstd.astype(params.dtype),
        running_mean,
        running_var,
    )


@lower(aten._native_batch_norm_legit_functional.default, layout=Layout.META)
def native_batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)


@lower(aten._native_batch_norm_legit.no_stats, layout=Layout.META)
def native_batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    return _batch_norm(x, weight, bias, None, None, training, momentum, eps)[:3]


@lower(aten._native_batch_norm_legit_no_training.default, layout=Layout.META)
def native_batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@runtime(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """The training step updates the running statistics in place: the pure functional
    lowering computes them, this kernel writes them back into the caller's buffers."""
    out, mean, invstd, new_mean, new_var = aten._native_batch_norm_legit_functional(
        x, weight, bias, running_mean, running_var, training, momentum, eps
    )
    if training:
        tensor.write(running_mean, tensor.read(new_mean))
        tensor.write(running_var, tensor.read(new_var))
    return out, mean, invstd


@runtime(aten.native_batch_norm.default)
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if running_mean is None:
        return aten._native_batch_norm_legit.no_stats(x, weight, bias, training, momentum, eps)
    return native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps)


# The batch_norm ops that torch.export / functionalization produce (eager uses those above).
def _reserve():
    return jnp.zeros((0,), jnp.uint8)


@lower(aten._batch_norm_with_update_functional.default, layout=Layout.META)
def batch_norm_with_update_functional(x, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        x, weight, bias, running_mean, running_var, True, momentum, eps
    )
    return out, mean, invstd, _reserve(), new_mean, new_var


@lower(aten._batch_norm_no_update.default, layout=Layout.META)
def batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    training = running_mean is None  # without running statistics only the batch's exist
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)[:3] + (
        _reserve(),
    )


@runtime(aten._batch_norm_with_update.default)
def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    return native_batch_norm_legit(x, weight, bias, running_mean, running_var, True, momentum, eps) + (
        tensor.wrap(_reserve()),
    )


def _normalization_grad(grad_normalized, normalized, rstd, axes):
    """d(input) given d(normalized) for ``normalized = (x - mean(x)) * rstd`` over ``axes``."""

    def mean(v):
        return v.mean(axes, keepdims=True)

    return rstd * (grad_normalized - mean(grad_normalized) - normalized * mean(grad_normalized * normalized))


def _masked(values, dtypes, mask):
    return tuple(v.astype(d) if wanted else None for v, d, wanted in zip(values, dtypes, mask))


@lower(aten.native_batch_norm_backward.default, layout=Layout.META)
def native_batch_norm_backward(
    grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    compute = compute_dtype(x.dtype)
    shape, axes = _channel_shape(x), (0,) + tuple(range(2, x.ndim))
    if train:
        mean, invstd = save_mean.astype(compute), save_invstd.astype(compute)
    else:
        mean, invstd = running_mean.astype(compute), lax.rsqrt(running_var.astype(compute) + eps)
    mean, invstd = mean.reshape(shape), invstd.reshape(shape)
    g = grad.astype(compute)
    normalized = (x.astype(compute) - mean) * invstd
    grad_normalized = g if weight is None else g * weight.astype(compute).reshape(shape)
    grad_input = (
        _normalization_grad(grad_normalized, normalized, invstd, axes) if train else grad_normalized * invstd
    )
    param_dtype = x.dtype if weight is None else weight.dtype
    return _masked(
        (grad_input, (g * normalized).sum(axes), g.sum(axes)),
        (x.dtype, param_dtype, param_dtype),
        output_mask,
    )


@lower(aten.batch_norm_backward.default, layout=Layout.META)
def batch_norm_backward(
    grad, x, weight, running_mean, running_var, save_mean, save_invstd, update, eps, output_mask, reserve
):
    return native_batch_norm_backward(
        grad, x, weight, running_mean, running_var, save_mean, save_invstd, update, eps, output_mask
    )


def _update_stats(x, running_mean, running_var, momentum):
    """(batch mean, biased batch variance, new running mean, new running variance)."""
    _, mean, _, new_mean, new_var = _batch_norm(x, None, None, running_mean, running_var, True, momentum, 0.0)
    axes = (0,) + tuple(range(2, x.ndim))
    variance = x.astype(compute_dtype(x.dtype)).var(axes).astype(mean.dtype)
    return mean, variance, new_mean, new_var


_update_stats_jit = jax.jit(_update_stats)


@runtime(aten.batch_norm_update_stats.default)
def batch_norm_update_stats(x, running_mean, running_var, momentum):
    """A runtime entry because PyTorch updates the running statistics in place although the
    schema does not mark them written."""
    stats = [None if t is None else tensor.read(t) for t in (running_mean, running_var)]
    mean, variance, new_mean, new_var = apply(_update_stats_jit, tensor.read(x), *stats, momentum)
    if running_mean is not None:
        tensor.write(running_mean, new_mean)
        tensor.write(running_var, new_var)
    return tensor.wrap(mean), tensor.wrap(variance)


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


@lower(aten.native_layer_norm.default, pad=Rowwise())
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    require(len(normalized_shape) > 0)  # PyTorch's meta kernel words the errors
    require(tuple(x.shape[x.ndim - len(normalized_shape) :]) == tuple(normalized_shape))
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    out, mean, rstd = _normalize(x.astype(compute_dtype(x.dtype)), axes, eps)
    out = _affine(out, weight, bias, normalized_shape)
    return out.astype(x.dtype), mean.astype(x.dtype), rstd.astype(x.dtype)


@lower(aten.native_layer_norm_backward.default, pad=Rowwise(input=1, stats=0, fills={0: 0, 1: 0, 3: 0, 4: 0}))
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    compute = compute_dtype(x.dtype)
    batch_axes = tuple(range(x.ndim - len(normalized_shape)))
    axes = tuple(range(len(batch_axes), x.ndim))
    rstd = rstd.astype(compute)
    normalized = (x.astype(compute) - mean.astype(compute)) * rstd
    g = grad.astype(compute)
    grad_normalized = g if weight is None else g * weight.astype(compute)
    grad_input = _normalization_grad(grad_normalized, normalized, rstd, axes)
    param_dtype = x.dtype if weight is None else weight.dtype
    return _masked(
        (grad_input, (g * normalized).sum(batch_axes), g.sum(batch_axes)),
        (x.dtype, param_dtype, param_dtype),
        output_mask,
    )


def _grouped(x, n, group):
    return x.reshape(n, group, math.prod(x.shape[1:]) // group)  # no -1: the batch may be empty


@lower(aten.native_group_norm.default, layout=Layout.SUGGESTED)
def native_group_norm(x, weight, bias, n, channels, hxw, group, eps):
    require(channels % group == 0)
    compute = compute_dtype(x.dtype)
    out, mean, rstd = _normalize(_grouped(x.astype(compute), n, group), (2,), eps)
    out = _affine(out.reshape(x.shape), weight, bias, (channels,) + (1,) * (x.ndim - 2))
    return out.astype(x.dtype), mean[..., 0].astype(x.dtype), rstd[..., 0].astype(x.dtype)


@lower(aten.native_group_norm_backward.default, layout=Layout.SUGGESTED)
def native_group_norm_backward(grad, x, mean, rstd, weight, n, channels, hxw, group, output_mask):
    compute = compute_dtype(x.dtype)
    channel_shape = (channels,) + (1,) * (x.ndim - 2)
    rstd = rstd.astype(compute)[..., None]
    normalized = (_grouped(x.astype(compute), n, group) - mean.astype(compute)[..., None]) * rstd
    g = grad.astype(compute)
    grad_normalized = g if weight is None else g * weight.astype(compute).reshape(channel_shape)
    grad_input = _normalization_grad(_grouped(grad_normalized, n, group), normalized, rstd, (2,))
    per_channel = tuple(a for a in range(x.ndim) if a != 1)
    param_dtype = x.dtype if weight is None else weight.dtype
    return _masked(
        (grad_input.reshape(x.shape), (g * normalized.reshape(x.shape)).sum(per_channel), g.sum(per_channel)),
        (x.dtype, param_dtype, param_dtype),
        output_mask,
    )


def _weight_norm(v, g, dim):
    """(v * g / ||v||, ||v||): the norm over every axis but ``dim`` (all axes for -1), kept
    as size-1 axes and in the opmath dtype, as PyTorch's kernel keeps it."""
    compute = compute_dtype(v.dtype)
    axes = tuple(a for a in range(v.ndim) if dim == -1 or a != dim % v.ndim)
    vc = v.astype(compute)
    norms = jnp.sqrt(jnp.square(vc).sum(axes, keepdims=True))
    return (vc * (g.astype(compute) / norms)).astype(v.dtype), norms


lower(aten._weight_norm_interface.default)(lambda v, g, dim=0: _weight_norm(v, g, dim))


@lower(aten._weight_norm_interface_backward.default)
def weight_norm_interface_backward(grad_w, v, g, norms, dim):
    compute = compute_dtype(v.dtype)
    grad_v, grad_g = vjp(
        lambda v, g: _weight_norm(v, g, dim)[0],
        (v.astype(compute), g.astype(compute)),
        grad_w.astype(compute),
        (True, True),
    )
    return grad_v.astype(v.dtype), grad_g.astype(g.dtype)


# ----------------------------------------------------------------------------- activations
@lower(
    aten.threshold.default,
    promote=Promote.DEFAULT,
    promote_args=("self",),
    fitted=("value",),
    fitted_in_opmath=("threshold",),
)
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
_GELU_PDF = 2 / math.sqrt(math.pi) * _SQRT_HALF * 0.5  # 1/sqrt(2 pi)
_GELU_TANH_BETA, _GELU_TANH_KAPPA = math.sqrt(2) * 2 / math.sqrt(math.pi) * 0.5, 0.044715


def _gelu_grad(g, x, approximate="none"):
    if approximate == "tanh":
        inner = _GELU_TANH_BETA * (x + _GELU_TANH_KAPPA * x**3)
        tanh_inner = jnp.tanh(inner)
        derivative = 0.5 * (1 + tanh_inner) + 0.5 * x * (1 - tanh_inner**2) * _GELU_TANH_BETA * (
            1 + 3 * _GELU_TANH_KAPPA * x * x
        )
        return g * derivative
    cdf = 0.5 * (1 + jax.scipy.special.erf(x * _SQRT_HALF))
    return g * (cdf + x * _GELU_PDF * jnp.exp(-0.5 * x * x))


def _silu_grad(g, x):
    sigmoid = jax.nn.sigmoid(x)
    return g * sigmoid * (1 + x * (1 - sigmoid))


def _mish_grad(g, x):
    tanh_softplus = jnp.tanh(jax.nn.softplus(x))
    return g * (tanh_softplus + x * jax.nn.sigmoid(x) * (1 - tanh_softplus**2))


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
    (aten.leaky_relu_backward.default, lambda g, x, slope, self_is_result: jnp.where(x > 0, g, g * slope)),
    (aten.hardtanh_backward.default, lambda g, x, low, high: jnp.where((x <= low) | (x >= high), 0, g)),
    (
        aten.softplus_backward.default,
        lambda g, x, beta, threshold: jnp.where(x * beta > threshold, g, g * jax.nn.sigmoid(x * beta)),
    ),
    (aten.hardsigmoid_backward.default, lambda g, x: jnp.where((x > -3) & (x < 3), g / 6, 0)),
    (
        aten.hardswish_backward.default,
        lambda g, x: jnp.where(x <= -3, 0, jnp.where(x >= 3, g, g * (x / 3 + 0.5))),
    ),
]:
    _activation_backward(_op, _formula)


def _glu(x, dim):
    first, second = jnp.split(x, 2, axis=dim)
    return first * jax.nn.sigmoid(second)


_activation_backward(aten.log_sigmoid_backward.default, lambda g, x, buffer: g * jax.nn.sigmoid(-x))
lower(aten.glu.default)(lambda x, dim=-1: _glu(x, dim))
lower(aten.glu_backward.default)(lambda grad, x, dim: vjp(lambda x: _glu(x, dim), (x,), grad, (True,))[0])


@lower(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(x):
    """(output, buffer). The buffer stays empty, as on CUDA (CPU's kernel fills one as large as
    the input for its backward, which tpu's backward does not read)."""
    compute = compute_dtype(x.dtype)
    return jax.nn.log_sigmoid(x.astype(compute)).astype(x.dtype), jnp.zeros((0,), x.dtype)


@lower(aten.elu_backward.default, promote=Promote.DEFAULT, promote_args=("grad_output", "self_or_result"))
def elu_backward(grad, alpha, scale, input_scale, is_result, x, *, types):
    c = types.compute
    return _elu_grad(grad.astype(c), alpha, scale, input_scale, is_result, x.astype(c)).astype(types.result)


# ----------------------------------------------------------------------------- softmax
def _along(fn, x, dim):
    """``fn(x, axis)`` that also accepts 0-d tensors (PyTorch treats them as one element)."""
    dim = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return fn(x.reshape(1), 0).reshape(())
    return fn(x, dim)


def _softmax_entry(op, fn):
    @lower(op, pad=Along("dim", {0: -np.inf}))
    def softmax(x, dim, half_to_float):
        result = jnp.float32 if half_to_float else x.dtype
        return _along(fn, x.astype(compute_dtype(x.dtype)), dim).astype(result)


_softmax_entry(aten._softmax.default, lambda x, axis: jax.nn.softmax(x, axis=axis))
_softmax_entry(aten._log_softmax.default, lambda x, axis: jax.nn.log_softmax(x, axis=axis))


@lower(aten._safe_softmax.default, pad=Along("dim", {0: -np.inf}))
def safe_softmax(x, dim, dtype=None):
    """softmax whose fully masked rows (all -inf) are zeros instead of NaN."""
    x = x.astype(dtype or x.dtype)
    compute = compute_dtype(x.dtype)

    def fn(x, axis):
        masked = jnp.all(x == -jnp.inf, axis=axis, keepdims=True)
        return jnp.where(masked, 0, jax.nn.softmax(x, axis=axis))

    return _along(fn, x.astype(compute), dim).astype(x.dtype)


def _softmax_backward_entry(op, fn):
    @lower(op, pad=Along("dim", {0: 0, 1: 0}))
    def backward(grad, output, dim, input_dtype):
        compute = compute_dtype(grad.dtype)
        return _along(
            lambda out, axis: fn(grad.astype(compute).reshape(out.shape), out, axis),
            output.astype(compute),
            dim,
        ).astype(input_dtype)


_softmax_backward_entry(
    aten._softmax_backward_data.default, lambda g, y, axis: y * (g - (g * y).sum(axis, keepdims=True))
)
_softmax_backward_entry(
    aten._log_softmax_backward_data.default, lambda g, y, axis: g - jnp.exp(y) * g.sum(axis, keepdims=True)
)


def _softmax_mask(mask, shape, mask_type):
    """The boolean mask (True: left out) broadcast to the input: mask_type 1 is a (B, T) key
    padding mask of a (B, heads, T, T) input, 0 a (T, T) attention mask, 2 the input's shape."""
    if len(shape) == 4 and mask_type == 1 and mask.shape == (shape[0], shape[3]):
        mask = mask[:, None, None, :]
    elif not (len(shape) == 4 and mask_type == 0 and mask.shape == shape[2:]):
        require(mask.shape == shape)
    return jnp.broadcast_to(mask, shape)


@lower(aten._masked_softmax.default)
def masked_softmax(x, mask, dim=None, mask_type=None):
    """Rows with every entry masked are NaN, as PyTorch's kernel leaves them."""
    compute = compute_dtype(x.dtype)
    masked = _softmax_mask(mask, x.shape, mask_type)
    axis = x.ndim - 1 if dim is None else dim
    scores = jnp.where(masked, -jnp.inf, x.astype(compute))
    return _along(lambda s, axis: jax.nn.softmax(s, axis=axis), scores, axis).astype(x.dtype)


@lower(aten._masked_softmax_backward.default)
def masked_softmax_backward(grad, output, mask, dim=None):
    compute = compute_dtype(output.dtype)
    masked = _softmax_mask(mask, output.shape, None)
    g = jnp.where(masked, 0, grad.astype(compute))
    y = jnp.where(masked, 0, output.astype(compute))
    axis = wrap_dim(output.ndim - 1 if dim is None else dim, output.ndim)
    return (y * (g - (g * y).sum(axis, keepdims=True))).astype(output.dtype)


# ----------------------------------------------------------------------------- embedding
def _check_embedding_indices(weight, indices, *_):
    check_bounds([(indices, weight.shape[0], False)], lambda *_: IndexError("index out of range in self"))


def _check_embedding_bag_indices(weight, indices, *_):
    def error(position: int, value: int, size: int) -> RuntimeError:
        return RuntimeError(
            f"Index {position} of input takes value {value} which is not in the valid range [0, {size})"
        )

    check_bounds([(indices, weight.shape[0], False)], error, by_element=True)


def _check_embedding(weight, indices, *_):
    if weight.ndim != 2:
        raise RuntimeError("'weight' must be 2-D")
    _check_embedding_indices(weight, indices)


@lower(aten.embedding.default, check=_check_embedding, pad=TAKE)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lower(aten.embedding_renorm.default)
def embedding_renorm(weight, indices, max_norm, norm_type):
    """Rescales the looked-up rows whose norm exceeds ``max_norm`` (``embedding_renorm_`` is
    derived from this)."""
    rows = weight[indices.reshape(-1)].astype(compute_dtype(weight.dtype))
    norms = jnp.linalg.norm(rows, ord=norm_type, axis=1, keepdims=True)
    scale = jnp.where(norms > max_norm, max_norm / (norms + 1e-7), 1)
    return weight.at[indices.reshape(-1)].set((rows * scale).astype(weight.dtype))


@lower(aten.embedding_dense_backward.default, pad=TAKE_BACKWARD)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """Row sums of the output gradient per index; the padding row gets none."""
    compute = compute_dtype(grad.dtype)
    flat = indices.reshape(-1)
    rows = grad.reshape(flat.size, -1).astype(compute)
    rows = jnp.where((flat != padding_idx)[:, None], rows, 0)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), compute).at[flat].add(1)
        rows = rows / counts[flat][:, None]
    return jnp.zeros((num_weights, rows.shape[1]), compute).at[flat].add(rows).astype(grad.dtype)


_BAG_SUM, _BAG_MEAN, _BAG_MAX = 0, 1, 2  # EmbeddingBag's mode enum


def _offset2bag(indices, offsets, bags: int):
    """The bag each index falls in: bag b holds positions offsets[b] <= i < offsets[b + 1]."""
    positions = jnp.arange(indices.shape[0])
    return jnp.searchsorted(offsets[:bags], positions, side="right").astype(jnp.int64) - 1


def _embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=_BAG_SUM,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    """(output, offset2bag, bag_size, max_indices) with PyTorch CPU's bookkeeping: bag sizes
    count the non-padding indices (zeros for sum), max_indices are the chosen rows' indices
    (max), a copy of the bag sizes (mean) or zeros (sum), and the sum's fast path (padding-free,
    non-double) leaves offset2bag empty."""
    require(indices.ndim == 1 and offsets.ndim == 1 and jnp.issubdtype(weight.dtype, jnp.floating))
    compute = compute_dtype(weight.dtype)
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    offset2bag = _offset2bag(indices, offsets, bags)
    kept = (indices != padding_idx) & (offset2bag >= 0) & (offset2bag < bags)
    slot = jnp.where(kept, offset2bag, bags)  # dropped rows go to an extra, discarded bag
    rows = weight[indices].astype(compute)
    sizes = jnp.zeros((bags + 1,), jnp.int64).at[slot].add(1)[:bags]
    if mode == _BAG_MAX:
        lowest = jnp.full((bags + 1, weight.shape[1]), -jnp.inf, compute)
        best = lowest.at[slot].max(rows)[:bags]
        output = jnp.where(sizes[:, None] > 0, best, 0)
        # the first row reaching each maximum, as CPU's strict ``>`` scan keeps
        is_best = kept[:, None] & (rows == best[jnp.minimum(slot, bags - 1)])
        first = (
            jnp.full((bags + 1, weight.shape[1]), indices.shape[0], jnp.int64)
            .at[slot]
            .min(jnp.where(is_best, jnp.arange(indices.shape[0])[:, None], indices.shape[0]))[:bags]
        )
        max_indices = jnp.where(sizes[:, None] > 0, indices[jnp.minimum(first, indices.shape[0] - 1)], 0)
    else:
        if per_sample_weights is not None:
            rows = rows * per_sample_weights.astype(compute)[:, None]
        totals = jnp.zeros((bags + 1, weight.shape[1]), compute).at[slot].add(rows)[:bags]
        if mode == _BAG_MEAN:
            output = totals / jnp.maximum(sizes, 1)[:, None].astype(compute)
            max_indices = sizes
        else:
            output, sizes = totals, jnp.zeros_like(sizes)
            max_indices = sizes
    if mode == _BAG_SUM and padding_idx < 0 and weight.dtype != jnp.float64:
        offset2bag = jnp.zeros((0,), jnp.int64)
    return output.astype(weight.dtype), offset2bag, sizes, max_indices.astype(jnp.int64)


lower(
    aten._embedding_bag.default,
    aten._embedding_bag_forward_only.default,
    check=_check_embedding_bag_indices,
)(_embedding_bag)


def _bag_frequency_divisor(indices, num_weights: int, compute):
    """How often each index occurs, scale_grad_by_freq's divisor (as in ``embedding`` and on
    CUDA). PyTorch CPU's embedding_bag kernel divides the k-th distinct index's gradient by the
    count of ``sorted_indices[k]`` instead, wrong for repeated indices; tpu does not copy that."""
    return jnp.zeros((num_weights,), compute).at[indices].add(1)[indices]


@lower(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(
    grad,
    indices,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights=None,
    padding_idx=-1,
):
    """Each bag's gradient back to the rows it used: all of them (sum, mean: divided by the
    bag size, scaled by the sample weights) or the chosen one per column (max)."""
    compute = compute_dtype(grad.dtype)
    g = grad.astype(compute)
    columns = grad.shape[1]
    if mode == _BAG_MAX:
        chosen = jnp.where(bag_size[:, None] > 0, maximum_indices, num_weights)
        column = jnp.broadcast_to(jnp.arange(columns), chosen.shape)
        result = jnp.zeros((num_weights + 1, columns), compute).at[chosen, column].add(g)
        return result[:num_weights].astype(grad.dtype)
    rows = g[offset2bag]
    if mode == _BAG_MEAN:
        rows = rows / jnp.maximum(bag_size[offset2bag], 1)[:, None].astype(compute)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(compute)[:, None]
    if scale_grad_by_freq:
        rows = rows / _bag_frequency_divisor(indices, num_weights, compute)[:, None]
    target = jnp.where(indices == padding_idx, num_weights, indices)
    result = jnp.zeros((num_weights + 1, columns), compute).at[target].add(rows)
    return result[:num_weights].astype(grad.dtype)


def _filled_offset2bag(indices, offsets, offset2bag):
    """The sum's fast path hands backward an empty offset2bag: rebuild it from the offsets."""
    if offset2bag.shape[0] == indices.shape[0]:
        return offset2bag
    return jnp.maximum(_offset2bag(indices, offsets, offsets.shape[0]), 0)


@lower(aten._embedding_bag_backward.default)
def embedding_bag_backward(
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights=None,
    padding_idx=-1,
):
    require(not sparse)
    return embedding_bag_dense_backward(
        grad,
        indices,
        _filled_offset2bag(indices, offsets, offset2bag),
        bag_size,
        maximum_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )


@lower(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(
    grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1
):
    """d(sum of weighted rows)/d(sample weight): each row dotted with its bag's gradient."""
    require(mode == _BAG_SUM)
    compute = compute_dtype(grad.dtype)
    bag = _filled_offset2bag(indices, offsets, offset2bag)
    products = (grad.astype(compute)[bag] * weight.astype(compute)[indices]).sum(1)
    return jnp.where(indices == padding_idx, 0, products).astype(grad.dtype)


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


@lower(
    aten.native_dropout_backward.default,
    promote=Promote.DEFAULT,
    promote_args=("grad_output", "mask", "scale"),
)
def native_dropout_backward(grad, mask, scale, *, types):
    """``grad * mask * scale`` as PyTorch computes it: an integer or bool gradient gives a
    floating result (the float ``scale`` promotes it)."""
    scaled = grad.astype(types.compute) * mask * jnp.asarray(scale, types.compute)
    return scaled.astype(types.result)


# ----------------------------------------------------------------------------- attention
@runtime(aten._fused_sdp_choice.default)
def fused_sdp_choice(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
) -> int:
    """The fused kernel below whenever the user leaves it enabled and it computes what the math
    path would; PyTorch's math path for the rest, which raises PyTorch's errors for bad input
    (heads that do not match, a mask of another shape, integer inputs)."""
    backend = torch.nn.attention.SDPBackend
    fused = torch._C._get_overrideable_sdp_enabled() and _fused_attention_fits(
        query, key, value, attn_mask, enable_gqa
    )
    return int(backend.OVERRIDEABLE if fused else backend.MATH)


def _fused_attention_fits(query, key, value, attn_mask, enable_gqa: bool) -> bool:
    # (the fused op takes (heads, length, width) or (batch, heads, length, width), as on MTIA)
    if (
        not query.is_floating_point()
        or query.dim() not in (3, 4)
        or not query.dim() == key.dim() == value.dim()
    ):
        return False
    if query.dim() >= 3:
        heads = query.shape[-3]
        for t in (key, value):
            if t.shape[-3] != heads and not (enable_gqa and heads % t.shape[-3] == 0):
                return False
    if attn_mask is None:
        return True
    try:
        batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
        scores = batch + (query.shape[-2], key.shape[-2])
        return torch.broadcast_shapes(attn_mask.shape, scores) == scores
    except RuntimeError:
        return False


@jax.jit
def _pack_key(key) -> jax.Array:
    """A PRNG key (as :func:`next_key` gives it) as one int64, PyTorch's shape for
    ``philox_seed``, so backward replays the forward's dropout mask."""
    high, low = jax.random.key_data(key_of(key)).astype(jnp.int64)
    return (high << 32) | low


@functools.cache
def _zero(index: int) -> jax.Array:
    """``philox_offset`` (always 0: each call draws a fresh key instead), and the seed of a call
    without dropout, which draws none; committed to ``tpu:index``, as every value we hold."""
    return jax.device_put(jnp.zeros((), jnp.int64), platform.jax_device(index))


def _unpack_key(seed):
    return jax.random.wrap_key_data(jnp.stack([seed >> 32, seed & 0xFFFF_FFFF]).astype(jnp.uint32))


def _attention(q, k, v, bias, seed, dropout_p, is_causal, scale, order=None):
    """(output, logsumexp). Grouped-query attention (fewer key/value heads) repeats the
    key/value heads; fully masked rows give zeros, as PyTorch's math path does. ``order``: the
    output's memory order where it is not row-major (``tensor.memory_order``): the output is
    returned transposed so, as its storage holds it."""
    dtype, compute = q.dtype, compute_dtype(q.dtype)
    matmul = matmul_precision(compute)
    q, k, v = (t.astype(compute) for t in (q, k, v))
    if q.ndim >= 3:
        k, v = (jnp.repeat(t, q.shape[-3] // t.shape[-3], axis=-3) for t in (k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = jnp.einsum("...ld,...sd->...ls", q, k, precision=matmul) * scale
    if is_causal:
        scores = jnp.where(jnp.tril(jnp.ones(scores.shape[-2:], jnp.bool_)), scores, -jnp.inf)
    if bias is not None:
        scores = (
            jnp.where(bias, scores, -jnp.inf) if bias.dtype == jnp.bool_ else scores + bias.astype(compute)
        )
    row_max = lax.stop_gradient(scores.max(-1, keepdims=True))
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0)
    exps = jnp.exp(scores - row_max)
    sums = exps.sum(-1, keepdims=True)
    weights = exps / jnp.where(sums == 0, 1, sums)
    if dropout_p > 0:
        weights = _dropout(weights, dropout_p, _unpack_key(seed))[0]
    out = jnp.einsum("...ls,...sd->...ld", weights, v, precision=matmul)
    logsumexp = (jnp.log(sums) + row_max)[..., 0]
    out = out.astype(dtype) if order is None else out.astype(dtype).transpose(order)
    # (batch, heads, length): a 3-D query's batch is 1, as PyTorch's meta kernel has it
    return out, logsumexp.reshape((-1, *logsumexp.shape[-2:])).astype(jnp.float32)


_attention_forward = jax.jit(tensor.reading_views(_attention, range(4)), static_argnums=(5, 6, 7, 8))


@runtime(aten._scaled_dot_product_fused_attention_overrideable.default)
def scaled_dot_product_fused_attention(
    query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None
):
    """A runtime entry only because the schema also returns ints (max_q, max_k)."""
    index = tensor.device_index(query)
    seed = apply(_pack_key, next_key(None, index)) if dropout_p > 0 else _zero(index)
    shape = (*query.shape[:-1], value.shape[-1])
    strides, order = _matching_layout(tuple(query.shape), query.stride(), shape)
    padded = _padded_attention(query, key, value, attn_bias, seed, dropout_p, is_causal, scale)
    if padded is not None:
        out, logsumexp = padded
        out = tensor.wrap_padded(out, strides)
    else:
        bias = None if attn_bias is None else tensor.read_in_program(attn_bias)
        out, logsumexp = apply(
            _attention_forward,
            tensor.read_in_program(query),
            tensor.read_in_program(key),
            tensor.read_in_program(value),
            bias,
            seed,
            dropout_p,
            is_causal,
            scale,
            order,
        )
        out = tensor.wrap(out) if strides is None else tensor.wrap_stored(out, shape, strides)
    return (
        out,
        tensor.wrap(logsumexp),
        None,
        None,
        query.shape[-2],
        key.shape[-2],
        tensor.wrap(seed),
        tensor.wrap(_zero(index)),
        None,
    )


def _padded_attention(query, key, value, bias, seed, dropout_p, is_causal, scale) -> tuple | None:
    """(output, logsumexp) as padded values, where query, key or value is padded and the call is
    one ``ops.padding.ATTENTION`` serves; else None."""
    if not (padding_state.live and (is_causal or bias is not None) and not dropout_p):
        return None
    if not any(type(buffer.peek(t.untyped_storage())) is Padded for t in (query, key, value)):
        return None
    operands = [tensor.read_keeping_padding(t) for t in (query, key, value)]
    if not any(type(v) is Padded for v in operands):
        return None
    mask = None if bias is None else tensor.read_keeping_padding(bias)
    return attention(_attention_forward, [*operands, mask, seed, dropout_p, is_causal, scale, None])


@cached
def _matching_layout(query_shape: tuple, query_strides: tuple, shape: tuple) -> tuple:
    """The strides PyTorch's fused attention gives its output of ``shape`` (its meta kernel's
    ``alloc_with_matching_layout``): laid out like the query (heads-major when the query is a
    transposed (B, T, H, D) projection), and their memory order (``tensor.memory_order``); a
    pair of None for contiguous. (Cached per geometry: about 3 us of Python a call.)"""
    if query_shape == shape:
        strides = tensor.strides_like(shape, query_strides)
    else:
        order = sorted(range(len(query_shape)), key=lambda d: query_strides[d], reverse=True)
        strides, step = [0] * len(order), 1
        for d in reversed(order):
            strides[d], step = step, step * shape[d]
        strides = None if tensor.is_row_major(shape, tuple(strides)) else tuple(strides)
    return (None, None) if strides is None else (strides, tensor.memory_order(shape, strides))


@lower(
    aten._scaled_dot_product_fused_attention_overrideable_backward.default,
    layout=Layout.META,
    pad=ATTENTION_BACKWARD,
)
def scaled_dot_product_fused_attention_backward(
    grad,
    query,
    key,
    value,
    attn_bias,
    grad_input_mask,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    scale=None,
):
    primals = (query, key, value) + (() if attn_bias is None else (attn_bias,))

    def forward(q, k, v, *bias):
        return _attention(q, k, v, bias[0] if bias else None, philox_seed, dropout_p, is_causal, scale)[0]

    grads = vjp(forward, primals, grad, grad_input_mask)
    return grads + (None,) * (4 - len(grads))


# ----------------------------------------------------------------------------- transformer fast path
# nn.MultiheadAttention and nn.TransformerEncoderLayer take these fused kernels in inference
# (eval mode, no grad, batch_first). Same math as PyTorch's: q, k, v projections from the packed
# weight, q scaled by 1/sqrt(head_dim), masked softmax (a float mask is masked where nonzero),
# heads merged and projected.
def _linear(x, weight, bias, matmul):
    return jnp.einsum("...i,oi->...o", x, weight, precision=matmul) + bias


def _heads(x, num_heads: int):
    """(B, T, E) -> (B, heads, T, E / heads)."""
    batch, length, embed = x.shape
    return x.reshape(batch, length, num_heads, embed // num_heads).transpose(0, 2, 1, 3)


def _multi_head_attention(
    query, key, value, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type
):
    """(output (B, T, E), attention weights (B, heads, T, S)), in the compute dtype."""
    require(query.ndim == 3 and query.shape == key.shape == value.shape)
    compute = compute_dtype(query.dtype)
    matmul = matmul_precision(compute)
    weights = (w.astype(compute) for w in jnp.split(qkv_weight, 3))
    biases = (b.astype(compute) for b in jnp.split(qkv_bias, 3))
    q, k, v = (
        _heads(_linear(x.astype(compute), w, b, matmul), num_heads)
        for x, w, b in zip((query, key, value), weights, biases)
    )
    scores = jnp.einsum("bhtd,bhsd->bhts", q / math.sqrt(q.shape[-1]), k, precision=matmul)
    if mask is not None:
        masked = _softmax_mask(mask.astype(jnp.bool_), scores.shape, mask_type)
        scores = jnp.where(masked, -jnp.inf, scores)
    attention = jax.nn.softmax(scores, axis=-1)
    context = jnp.einsum("bhts,bhsd->bhtd", attention, v, precision=matmul)
    merged = context.transpose(0, 2, 1, 3).reshape(query.shape)
    return _linear(merged, proj_weight.astype(compute), proj_bias.astype(compute), matmul), attention


@lower(aten._native_multi_head_attention.default)
def native_multi_head_attention(
    query,
    key,
    value,
    embed_dim,
    num_head,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    mask=None,
    need_weights=True,
    average_attn_weights=True,
    mask_type=None,
):
    out, attention = _multi_head_attention(
        query, key, value, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type
    )
    if not need_weights:
        return out.astype(query.dtype), None
    if average_attn_weights:
        attention = attention.sum(1) / num_head
    return out.astype(query.dtype), attention.astype(query.dtype)


@lower(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer_fwd(
    src,
    embed_dim,
    num_heads,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu,
    norm_first,
    eps,
    norm_weight_1,
    norm_bias_1,
    norm_weight_2,
    norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type=None,
):
    compute = compute_dtype(src.dtype)
    matmul = matmul_precision(compute)

    def norm(x, weight, bias):
        return native_layer_norm(x, (embed_dim,), weight, bias, eps)[0].astype(compute)

    def attend(x):
        return _multi_head_attention(
            x, x, x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type
        )[0]

    def feed_forward(x):
        hidden = _linear(x, ffn_weight_1.astype(compute), ffn_bias_1.astype(compute), matmul)
        hidden = jax.nn.gelu(hidden, approximate=False) if use_gelu else jax.nn.relu(hidden)
        return _linear(hidden, ffn_weight_2.astype(compute), ffn_bias_2.astype(compute), matmul)

    x = src.astype(compute)
    if norm_first:
        x = x + attend(norm(x, norm_weight_1, norm_bias_1))
        x = x + feed_forward(norm(x, norm_weight_2, norm_bias_2))
    else:
        x = norm(x + attend(x), norm_weight_1, norm_bias_1)
        x = norm(x + feed_forward(x), norm_weight_2, norm_bias_2)
    return x.astype(src.dtype)
