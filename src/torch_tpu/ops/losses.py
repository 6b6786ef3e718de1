"""Loss lowerings; backward ops are ``jax.vjp`` of the forward where PyTorch's formula is the
exact derivative, and written out where PyTorch clamps or divides differently.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..runtime.dtypes import type_name
from ._helpers import check_bounds, host_number
from ._nn_helpers import REDUCTIONS, compute_dtype, vjp
from .padding import NLL_LOSS, NLL_LOSS_BACKWARD
from .registry import lower, runtime

aten = torch.ops.aten


def _reduce(loss, reduction: int):
    name = REDUCTIONS[reduction]
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
    if REDUCTIONS[reduction] == "none":
        return losses, jnp.zeros((), x.dtype)
    total_weight = weights.sum()
    total = losses.sum()
    return (total / total_weight if REDUCTIONS[reduction] == "mean" else total), total_weight


def _nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    class_axis = 0 if x.ndim == 1 else 1
    weights, safe, valid = _nll_weights(x, target, weight, ignore_index)
    if REDUCTIONS[reduction] == "mean":
        grad = grad / total_weight
    # ignored targets get no gradient even when total_weight is 0 (PyTorch never writes them)
    values = jnp.where(valid, -grad * weights, 0)
    picked = jax.nn.one_hot(safe, x.shape[class_axis], dtype=x.dtype, axis=class_axis)
    return picked * jnp.expand_dims(values, class_axis)


def _check_targets(x, target, weight, reduction, ignore_index, *_):
    classes = x.shape[0 if x.ndim == 1 else 1]
    check_bounds(
        [(target, classes, False)],
        lambda _, value, size: IndexError(f"Target {value} is out of bounds."),
        ignore=ignore_index,
    )


lower(aten.nll_loss_forward.default, check=_check_targets, pad=NLL_LOSS)(_nll_loss)
lower(aten.nll_loss2d_forward.default, check=_check_targets)(_nll_loss)
lower(aten.nll_loss_backward.default, pad=NLL_LOSS_BACKWARD)(_nll_loss_backward)
lower(aten.nll_loss2d_backward.default)(_nll_loss_backward)


def _loss_entries(forward, backward, loss, check=None):
    """A pointwise loss ``loss(x, target, *args)`` reduced by ``reduction``; the backward is its
    vjp with respect to ``self``."""

    @lower(forward, check=check)
    def loss_forward(x, target, reduction=1, *args):
        compute = compute_dtype(x.dtype)
        return _reduce(loss(x.astype(compute), target.astype(compute), *args), reduction).astype(x.dtype)

    if backward is not None:

        @lower(backward)
        def loss_backward(grad, x, target, reduction, *args):
            return vjp(lambda x: loss_forward(x, target, reduction, *args), (x,), grad, (True,))[0]


def _smooth_l1(x, target, beta):
    diff = jnp.abs(x - target)
    if beta == 0:
        return diff
    return jnp.where(diff < beta, 0.5 * diff * diff / beta, diff - 0.5 * beta)


def _huber(x, target, delta):
    diff = x - target
    return jnp.where(jnp.abs(diff) < delta, 0.5 * diff * diff, delta * (jnp.abs(diff) - 0.5 * delta))


_loss_entries(aten.mse_loss.default, aten.mse_loss_backward.default, lambda x, target: jnp.square(x - target))
_loss_entries(aten.smooth_l1_loss.default, aten.smooth_l1_loss_backward.default, _smooth_l1)


def _check_delta(x, target, reduction=1, delta=1.0):
    delta = host_number(delta)
    if delta is not None and not delta > 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")


_loss_entries(aten.huber_loss.default, aten.huber_loss_backward.default, _huber, check=_check_delta)

_LOG_FLOOR, _BCE_EPSILON = -100.0, 1e-12  # PyTorch's clamps for log(0) and the grad's division


@lower(aten.binary_cross_entropy.default)
def binary_cross_entropy(x, target, weight=None, reduction=1):
    compute = compute_dtype(x.dtype)
    xc, t = x.astype(compute), target.astype(compute)
    loss = -(t * jnp.maximum(jnp.log(xc), _LOG_FLOOR) + (1 - t) * jnp.maximum(jnp.log1p(-xc), _LOG_FLOOR))
    if weight is not None:
        loss = loss * weight.astype(compute)
    return _reduce(loss, reduction).astype(x.dtype)


@lower(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad, x, target, weight=None, reduction=1):
    compute = compute_dtype(x.dtype)
    xc, t = x.astype(compute), target.astype(compute)
    result = grad.astype(compute) * (xc - t) / jnp.maximum((1 - xc) * xc, _BCE_EPSILON)
    if weight is not None:
        result = result * weight.astype(compute)
    if REDUCTIONS[reduction] == "mean":
        result = result / x.size
    return jnp.broadcast_to(result, x.shape).astype(x.dtype)


def _check_bce_target(x, target, *_) -> None:
    """CPU computes the loss in the target's dtype, in place: an integer or bool target refuses."""
    if target.dtype == jnp.bool_:
        raise RuntimeError(
            "Subtraction, the `-` operator, with two bool tensors is not supported. "
            "Use the `^` or `logical_xor()` operator instead."
        )
    if not jnp.issubdtype(target.dtype, jnp.inexact):
        result, desired = type_name(x.dtype), type_name(target.dtype)
        raise RuntimeError(f"result type {result} can't be cast to the desired output type {desired}")


@lower(aten.binary_cross_entropy_with_logits.default, check=_check_bce_target)
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, reduction=1):
    compute = compute_dtype(x.dtype)
    xc, t = x.astype(compute), target.astype(compute)
    log_sigmoid = jax.nn.log_sigmoid(xc)
    if pos_weight is None:
        loss = (1 - t) * xc - log_sigmoid
    else:
        loss = (1 - t) * xc - ((pos_weight.astype(compute) - 1) * t + 1) * log_sigmoid
    if weight is not None:
        loss = loss * weight.astype(compute)
    return _reduce(loss, reduction).astype(x.dtype)


def _check_float_result(x, *_) -> None:
    """CPU computes soft_margin_loss into a tensor of the input's dtype, a float result."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        result = type_name(torch.get_default_dtype())
        raise RuntimeError(
            f"result type {result} can't be cast to the desired output type {type_name(x.dtype)}"
        )


_loss_entries(
    aten.soft_margin_loss.default,
    aten.soft_margin_loss_backward.default,
    lambda x, target: jnp.log1p(jnp.exp(-target * x)),
    check=_check_float_result,
)


def _hinge(z, p):
    """``max(0, z) ** p`` whose gradient is zero at ``z == 0``, as PyTorch's ``z > 0`` test."""
    positive = jnp.where(z > 0, z, 0)
    return positive if p == 1 else positive * positive


def _multi_margin(x, target, p, margin, weight, reduction):
    """Per sample, the hinge of every other class's score against the target's, averaged over
    the classes (a 1-d input is one sample)."""
    compute = compute_dtype(x.dtype)
    scores = jnp.atleast_2d(x.astype(compute))
    target = target.reshape(-1)
    classes = scores.shape[1]
    target_score = jnp.take_along_axis(scores, target[:, None], 1)
    hinge = _hinge(margin - target_score + scores, p)
    if weight is not None:
        hinge = hinge * weight.astype(compute)[target][:, None]
    hinge = jnp.where(jnp.arange(classes) == target[:, None], 0, hinge)
    loss = hinge.sum(1) / classes
    return _reduce(loss.reshape(x.shape[:-1]), reduction).astype(x.dtype)


def _check_class_targets(x, target, *_):
    classes = x.shape[-1] if x.ndim else 1  # a 0-d input is one score
    check_bounds([(target, classes, False)], lambda *_: RuntimeError("target out of range"))


def _margin_shapes(x) -> tuple[int, int]:
    """(samples, classes) of a margin loss's input, refusing what CPU refuses."""
    if not (x.ndim == 0 or (x.ndim in (1, 2) and x.shape[-1] != 0)):
        raise RuntimeError(
            f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {list(x.shape)}"
        )
    return (x.shape[0], x.shape[1]) if x.ndim == 2 else (1, x.shape[0] if x.ndim else 1)


def _check_multi_margin(x, target, p, margin, weight=None, reduction=1):
    samples, classes = _margin_shapes(x)
    if target.ndim > 1 or target.size != samples:
        raise RuntimeError(
            "multi_margin_loss: target tensor should be 1-D with size equal to the number of input "
            f"samples (batch size). Expected target size [{samples}], but got {list(target.shape)}. "
            f"Input has shape {list(x.shape)}."
        )
    if weight is not None and (weight.ndim > 1 or weight.size != classes):
        raise RuntimeError(f"inconsistent weight size, expected {classes} but got {list(weight.shape)}")
    if target.dtype != jnp.int64:
        raise RuntimeError(f"expected scalar type Long but found {type_name(target.dtype)}")
    _check_class_targets(x, target)


def _check_multilabel_margin(x, target, *_):
    samples, classes = _margin_shapes(x)
    expected = (samples, classes) if x.ndim == 2 else None
    if (target.shape != expected) if expected else (target.ndim > 1 or target.size != classes):
        raise RuntimeError(
            f"inconsistent target size: {list(target.shape)} for input of size: {list(x.shape)}"
        )
    _check_class_targets(x, jnp.maximum(target, 0))


lower(aten.multi_margin_loss.default, static=("p",), check=_check_multi_margin)(_multi_margin)


@lower(aten.multi_margin_loss_backward.default, static=("p",))
def multi_margin_loss_backward(grad, x, target, p, margin, weight=None, reduction=1):
    return vjp(
        lambda x: _multi_margin(x, target, p, margin, weight, reduction), (x,), grad.astype(x.dtype), (True,)
    )[0]


def _multilabel_margin(x, target, reduction):
    """(loss, is_target): for every listed target (labels up to the first -1, a repeated label
    counting again, as CPU's loop does) the hinge ``1 - (x_target - x_j)`` against every class
    j not targeted, summed and averaged over the classes."""
    compute = compute_dtype(x.dtype)
    scores = jnp.atleast_2d(x.astype(compute))
    labels = jnp.atleast_2d(target)
    classes = scores.shape[1]
    listed = jnp.cumprod(labels >= 0, axis=1).astype(jnp.bool_)
    safe = jnp.where(listed, labels, 0)
    is_target = jax.nn.one_hot(jnp.where(listed, labels, classes), classes, dtype=jnp.bool_).any(1)
    target_scores = jnp.take_along_axis(scores, safe, 1)
    hinge = _hinge(1 - target_scores[:, :, None] + scores[:, None, :], 1)
    pairs = listed[:, :, None] & ~is_target[:, None, :]
    loss = jnp.where(pairs, hinge, 0).sum((1, 2)) / classes
    return (
        _reduce(loss.reshape(x.shape[:-1]), reduction).astype(x.dtype),
        is_target.reshape(x.shape).astype(x.dtype),
    )


lower(
    aten.multilabel_margin_loss_forward.default,
    check=_check_multilabel_margin,
)(_multilabel_margin)


@lower(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad, x, target, reduction, is_target):
    return vjp(lambda x: _multilabel_margin(x, target, reduction)[0], (x,), grad.astype(x.dtype), (True,))[0]


# ----------------------------------------------------------------------------- CTC
def _log_add(*terms):
    """log(sum(exp(terms))) as PyTorch's CTC computes it: shifted by the largest term, and
    -inf (with a zero gradient, not NaN) where every term is -inf."""
    top = lax.stop_gradient(jnp.maximum(jnp.maximum(terms[0], terms[1]), terms[2]))
    top = jnp.where(jnp.isfinite(top), top, 0)
    total = sum(jnp.exp(t - top) for t in terms)
    reachable = total > 0
    return jnp.where(reachable, jnp.log(jnp.where(reachable, total, 1)) + top, -jnp.inf)


def _ctc_alpha(log_probs, targets, input_lengths, target_lengths, blank, max_target_length):
    """(neg_log_likelihood (N,), log_alpha (N, T, 2L+1)) by the forward recursion over the
    blank-interleaved targets. Lengths may be device arrays; only ``max_target_length`` (L)
    fixes a shape. Entries PyTorch leaves unwritten (past a sample's lengths) hold -inf."""
    time, batch, _ = log_probs.shape
    states = 2 * max_target_length + 1
    label_index = jnp.arange(max_target_length)
    if targets.ndim == 1:  # concatenated targets
        starts = jnp.cumsum(target_lengths) - target_lengths
        positions = jnp.clip(starts[:, None] + label_index, 0, max(targets.shape[0] - 1, 0))
        labels = targets[positions] if targets.shape[0] else jnp.zeros(positions.shape, jnp.int64)
    else:
        labels = targets[:, :max_target_length]
    labels = jnp.where(label_index < target_lengths[:, None], labels, blank).astype(jnp.int64)
    extended = jnp.full((batch, states), blank, jnp.int64).at[:, 1::2].set(labels)
    valid_state = jnp.arange(states) < (2 * target_lengths + 1)[:, None]
    # a label may skip the blank before it unless it repeats the label two states back
    previous = jnp.pad(extended, ((0, 0), (2, 0)), constant_values=blank)[:, :-2]
    can_skip = (extended != blank) & (extended != previous)
    emissions = jnp.take_along_axis(log_probs, jnp.broadcast_to(extended, (time, batch, states)), 2)
    emissions = jnp.where(valid_state, emissions, -jnp.inf)
    first = jnp.where(jnp.arange(states) < 2, emissions[0], -jnp.inf)

    def step(alpha, emission):
        stay = alpha
        advance = jnp.pad(alpha, ((0, 0), (1, 0)), constant_values=-jnp.inf)[:, :-1]
        skip = jnp.pad(alpha, ((0, 0), (2, 0)), constant_values=-jnp.inf)[:, :-2]
        alpha = _log_add(stay, advance, jnp.where(can_skip, skip, -jnp.inf)) + emission
        alpha = jnp.where(valid_state, alpha, -jnp.inf)
        return alpha, alpha

    _, rest = lax.scan(step, first, emissions[1:])
    log_alpha = jnp.concatenate([first[None], rest]).swapaxes(0, 1)  # (N, T, S)
    log_alpha = jnp.where((jnp.arange(time) < input_lengths[:, None])[..., None], log_alpha, -jnp.inf)
    last = jnp.take_along_axis(log_alpha, (input_lengths - 1)[:, None, None], 1)[:, 0]
    end = 2 * target_lengths[:, None]
    final = jnp.take_along_axis(last, end, 1)[:, 0]
    before_final = jnp.where(
        target_lengths > 0, jnp.take_along_axis(last, jnp.maximum(end - 1, 0), 1)[:, 0], -jnp.inf
    )
    nll = -_log_add(final, before_final, jnp.full_like(final, -jnp.inf))
    return nll, log_alpha


def _lengths(lengths):
    return jnp.asarray(lengths, jnp.int64)


@lower(aten._ctc_loss.default)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """PyTorch's CTC returns the raw likelihoods: ``ctc_loss`` zeroes infinities and reduces."""
    nll, log_alpha = _ctc_alpha(
        log_probs,
        targets,
        _lengths(input_lengths),
        _lengths(target_lengths),
        blank,
        max(target_lengths, default=0),
    )
    return nll.astype(log_probs.dtype), log_alpha.astype(log_probs.dtype)


@runtime(aten._ctc_loss.Tensor)
def ctc_loss_tensor_lengths(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    """The lengths fix log_alpha's shape, so they are read to the host, as PyTorch does."""
    return aten._ctc_loss.default(
        log_probs, targets, input_lengths.tolist(), target_lengths.tolist(), blank, zero_infinity
    )


def _ctc_backward(grad, log_probs, targets, input_lengths, target_lengths, log_alpha, blank, zero_infinity):
    """PyTorch's gradient assumes ``log_probs`` come from a log_softmax: it is the derivative
    of the likelihood plus ``exp(log_probs)`` (the softmax's share) over each sample's frames."""
    compute = compute_dtype(log_probs.dtype)
    lp = log_probs.astype(compute)
    max_target_length = (log_alpha.shape[2] - 1) // 2

    def nll(lp):
        return _ctc_alpha(lp, targets, input_lengths, target_lengths, blank, max_target_length)[0]

    likelihood, pullback = jax.vjp(nll, lp)
    g = grad.astype(compute)
    in_frame = (jnp.arange(lp.shape[0])[:, None] < input_lengths)[..., None]
    result = pullback(g)[0] + jnp.where(in_frame, jnp.exp(lp) * g[:, None], 0)
    # a sample no alignment reaches (infinite loss) gets zeros with zero_infinity; without it
    # CPU's exp(log(alpha * beta) + nll - log_probs) is exp(-inf + inf): NaN over its frames
    unreachable = jnp.isinf(likelihood)[:, None]
    result = jnp.where(unreachable, 0 if zero_infinity else jnp.where(in_frame, jnp.nan, 0), result)
    return result.astype(log_probs.dtype)


@lower(aten._ctc_loss_backward.default)
def ctc_loss_backward(
    grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank, zero_infinity=False
):
    return _ctc_backward(
        grad,
        log_probs,
        targets,
        _lengths(input_lengths),
        _lengths(target_lengths),
        log_alpha,
        blank,
        zero_infinity,
    )


@lower(aten._ctc_loss_backward.Tensor)
def ctc_loss_backward_tensor_lengths(
    grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank, zero_infinity=False
):
    return _ctc_backward(
        grad,
        log_probs,
        targets,
        input_lengths.astype(jnp.int64),
        target_lengths.astype(jnp.int64),
        log_alpha,
        blank,
        zero_infinity,
    )
