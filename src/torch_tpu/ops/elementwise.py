"""Elementwise lowerings: unary math, binary arithmetic, comparisons, ternary ops, activations."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .._registry import Promote, lower
from ._helpers import binary, overload, predicate, unary

aten = __import__("torch").ops.aten
INT_TO_FLOAT, BOOL = Promote.INT_TO_FLOAT, Promote.ALWAYS_BOOL

# ----------------------------------------------------------------------------- unary
def _digamma(x):
    """torch puts digamma's pole at 0 as -inf at +0 and +inf at -0; jax returns NaN there."""
    pole = jnp.copysign(jnp.inf, -x).astype(x.dtype)
    return jnp.where(x == 0, pole, jax.scipy.special.digamma(x))


for _op, _fn in [
    (aten.neg, jnp.negative), (aten.sign, lambda x: x if x.dtype == jnp.bool_ else jnp.sign(x)),
    (aten.sgn, lambda x: x if x.dtype == jnp.bool_ else jnp.sign(x)),
    (aten.ceil, jnp.ceil), (aten.floor, jnp.floor), (aten.trunc, jnp.trunc),
    (aten.round, jnp.round), (aten.relu, jax.nn.relu),
    (aten.bitwise_not, jnp.invert), (aten.frac, lambda x: x - jnp.trunc(x)),
]:
    unary(_op.default, _fn)

for _op, _fn in [
    (aten.exp, jnp.exp), (aten.exp2, jnp.exp2), (aten.expm1, jnp.expm1), (aten.log, jnp.log),
    (aten.log2, jnp.log2), (aten.log10, jnp.log10), (aten.log1p, jnp.log1p),
    (aten.sqrt, jnp.sqrt), (aten.rsqrt, lax.rsqrt), (aten.reciprocal, jnp.reciprocal),
    (aten.sin, jnp.sin), (aten.cos, jnp.cos), (aten.tan, jnp.tan), (aten.asin, jnp.arcsin),
    (aten.acos, jnp.arccos), (aten.atan, jnp.arctan), (aten.sinh, jnp.sinh),
    (aten.cosh, jnp.cosh), (aten.tanh, jnp.tanh), (aten.asinh, jnp.arcsinh),
    (aten.acosh, jnp.arccosh), (aten.atanh, jnp.arctanh), (aten.sigmoid, jax.nn.sigmoid),
    (aten.erf, jax.scipy.special.erf), (aten.erfc, jax.scipy.special.erfc),
    (aten.erfinv, jax.scipy.special.erfinv), (aten.lgamma, jax.scipy.special.gammaln),
    (aten.digamma, _digamma), (aten.silu, jax.nn.silu),
    (aten.mish, lambda x: x * jnp.tanh(jax.nn.softplus(x))),
    (aten.hardsigmoid, jax.nn.hard_sigmoid), (aten.hardswish, jax.nn.hard_swish),
    (aten.sinc, jnp.sinc),
]:
    unary(_op.default, _fn, promote=INT_TO_FLOAT)

unary(aten.abs.default, jnp.abs, promote=Promote.COMPLEX_TO_FLOAT)

for _op, _fn in [(aten.isnan, jnp.isnan), (aten.isinf, jnp.isinf), (aten.isposinf, jnp.isposinf),
                 (aten.isneginf, jnp.isneginf), (aten.signbit, jnp.signbit),
                 (aten.logical_not, jnp.logical_not)]:
    unary(_op.default, _fn, promote=BOOL)


@lower(aten.gelu.default, promote=INT_TO_FLOAT, promote_args=("self",))
def gelu(x, approximate="none", *, types):
    return jax.nn.gelu(x.astype(types.compute), approximate=approximate == "tanh").astype(types.result)


@lower(aten.leaky_relu.default, promote=Promote.DEFAULT, promote_args=("self",))
def leaky_relu(x, negative_slope=0.01, *, types):
    x = x.astype(types.compute)
    return jnp.where(x > 0, x, x * negative_slope).astype(types.result)


@lower(aten.elu.default, promote=INT_TO_FLOAT, promote_args=("self",))
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0, *, types):
    x = x.astype(types.compute)
    return (scale * jnp.where(x > 0, x, alpha * jnp.expm1(x * input_scale))).astype(types.result)


@lower(aten.softplus.default, promote=INT_TO_FLOAT, promote_args=("self",))
def softplus(x, beta=1.0, threshold=20.0, *, types):
    x = x.astype(types.compute)
    scaled = x * beta
    return jnp.where(scaled > threshold, x, jnp.log1p(jnp.exp(scaled)) / beta).astype(types.result)


@lower(aten.hardtanh.default, promote=Promote.DEFAULT, promote_args=("self",))
def hardtanh(x, min_val=-1.0, max_val=1.0, *, types):
    return jnp.clip(x.astype(types.compute), min_val, max_val).astype(types.result)


@lower(aten.logit.default, promote=INT_TO_FLOAT, promote_args=("self",))
def logit(x, eps=None, *, types):
    x = x.astype(types.compute)
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x)).astype(types.result)


@lower(aten.nan_to_num.default, promote=Promote.DEFAULT, promote_args=("self",))
def nan_to_num(x, nan=None, posinf=None, neginf=None, *, types):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    return jnp.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


# ----------------------------------------------------------------------------- binary
def _floor_divide(x, y):
    if jnp.issubdtype(x.dtype, jnp.integer):
        return jnp.floor_divide(x, y)
    return jnp.floor(x / y)


def _remainder(x, y):
    return jnp.remainder(x, y)


def _fmod(x, y):
    return jnp.fmod(x, y)


def _divide(x, y, rounding_mode):
    if rounding_mode is None:
        return x / y
    if rounding_mode == "floor":
        return _floor_divide(x, y)
    if jnp.issubdtype(x.dtype, jnp.integer):
        return lax.div(*jnp.broadcast_arrays(x, y))  # C-style truncation
    return jnp.trunc(x / y)


for _name, _fn in [("mul", jnp.multiply), ("maximum", jnp.maximum), ("minimum", jnp.minimum),
                   ("fmax", jnp.fmax), ("fmin", jnp.fmin), ("bitwise_and", jnp.bitwise_and),
                   ("bitwise_or", jnp.bitwise_or), ("bitwise_xor", jnp.bitwise_xor),
                   ("remainder", _remainder), ("fmod", _fmod), ("floor_divide", _floor_divide),
                   ("bitwise_left_shift", jnp.left_shift),
                   ("bitwise_right_shift", jnp.right_shift)]:
    for _overload in ("Tensor", "Scalar", "default"):
        _op = overload(getattr(aten, _name), _overload)
        if _op is not None and [a.name for a in _op._schema.arguments] == ["self", "other"]:
            binary(_op, _fn)

for _name, _fn in [("atan2", jnp.arctan2), ("hypot", jnp.hypot), ("logaddexp", jnp.logaddexp),
                   ("logaddexp2", jnp.logaddexp2), ("copysign", jnp.copysign),
                   ("xlogy", jax.scipy.special.xlogy), ("nextafter", jnp.nextafter)]:
    for _overload in ("default", "Tensor"):
        _op = overload(getattr(aten, _name), _overload)
        if _op is not None:
            binary(_op, _fn, promote=INT_TO_FLOAT)

for _name, _fn in [("eq", jnp.equal), ("ne", jnp.not_equal), ("lt", jnp.less),
                   ("le", jnp.less_equal), ("gt", jnp.greater), ("ge", jnp.greater_equal)]:
    predicate(getattr(aten, _name).Tensor, _fn)
    predicate(getattr(aten, _name).Scalar, _fn)

for _name, _fn in [("logical_and", jnp.logical_and), ("logical_or", jnp.logical_or),
                   ("logical_xor", jnp.logical_xor)]:
    predicate(getattr(aten, _name).default, _fn)


@lower(aten.add.Tensor, aten.add.Scalar, promote=Promote.DEFAULT, promote_args=("self", "other"))
def add(x, y, alpha=1, *, types):
    x, y = jnp.asarray(x, types.compute), jnp.asarray(y, types.compute)
    return (x + y * jnp.asarray(alpha, types.compute)).astype(types.result)


@lower(aten.sub.Tensor, aten.sub.Scalar, promote=Promote.DEFAULT, promote_args=("self", "other"))
def sub(x, y, alpha=1, *, types):
    x, y = jnp.asarray(x, types.compute), jnp.asarray(y, types.compute)
    return (x - y * jnp.asarray(alpha, types.compute)).astype(types.result)


@lower(aten.rsub.Tensor, aten.rsub.Scalar, promote=Promote.DEFAULT, promote_args=("self", "other"))
def rsub(x, y, alpha=1, *, types):
    return sub(y, x, alpha, types=types)


binary(aten.div.Tensor, lambda x, y: x / y, promote=INT_TO_FLOAT)
binary(aten.div.Scalar, lambda x, y: x / y, promote=INT_TO_FLOAT)


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode, promote=Promote.DEFAULT,
       promote_args=("self", "other"))
def div_mode(x, y, rounding_mode=None, *, types):
    compute = types.compute
    if rounding_mode is None and not jnp.issubdtype(compute, jnp.inexact):
        compute = jnp.float32
    out = _divide(jnp.asarray(x, compute), jnp.asarray(y, compute), rounding_mode)
    return out.astype(types.result if rounding_mode is not None else out.dtype)


@lower(aten.pow.Tensor_Scalar, promote=Promote.DEFAULT, promote_args=("self", "exponent"),
       static=("exponent",))
def pow_tensor_scalar(x, exponent, *, types):
    x = x.astype(types.compute)
    if isinstance(exponent, int) and not isinstance(exponent, bool):
        if exponent >= 0:
            return lax.integer_pow(x, exponent).astype(types.result)
        return _power(x, jnp.asarray(exponent, types.compute)).astype(types.result)
    return jnp.power(x, jnp.asarray(exponent, types.compute)).astype(types.result)


def _power(base, exponent):
    """``base ** exponent``; for integers a negative exponent gives 0 (1 and -1 excepted), as in
    PyTorch, where ``jnp.power`` would overflow."""
    if not jnp.issubdtype(exponent.dtype, jnp.integer):
        return jnp.power(base, exponent)
    negative = exponent < 0
    safe = jnp.power(base, jnp.where(negative, 0, exponent))
    odd = (exponent % 2) == 1
    reciprocal = jnp.where(base == 1, 1, jnp.where(base == -1, jnp.where(odd, -1, 1), 0))
    return jnp.where(negative, reciprocal.astype(safe.dtype), safe)


binary(aten.pow.Tensor_Tensor, _power)


@lower(aten.pow.Scalar, promote=Promote.DEFAULT, promote_args=("self", "exponent"))
def pow_scalar(base, exponent, *, types):
    return _power(jnp.asarray(base, types.compute), exponent.astype(types.compute)).astype(types.result)


# ----------------------------------------------------------------------------- ternary
@lower(aten.where.self, promote=Promote.DEFAULT, promote_args=("self", "other"))
def where(condition, x, y, *, types):
    return jnp.where(condition, jnp.asarray(x, types.result), jnp.asarray(y, types.result))


@lower(aten.clamp.default, aten.clamp.Tensor, promote=Promote.DEFAULT)
def clamp(x, min=None, max=None, *, types):
    x = x.astype(types.compute)
    if min is not None:
        x = jnp.maximum(x, jnp.asarray(min, types.compute))
    if max is not None:
        x = jnp.minimum(x, jnp.asarray(max, types.compute))
    return x.astype(types.result)


@lower(aten.clamp_min.default, aten.clamp_min.Tensor, promote=Promote.DEFAULT)
def clamp_min(x, min, *, types):
    return clamp(x, min, None, types=types)


@lower(aten.clamp_max.default, aten.clamp_max.Tensor, promote=Promote.DEFAULT)
def clamp_max(x, max, *, types):
    return clamp(x, None, max, types=types)


@lower(aten.lerp.Scalar, aten.lerp.Tensor, promote=Promote.DEFAULT)
def lerp(x, end, weight, *, types):
    x, end = x.astype(types.compute), jnp.asarray(end, types.compute)
    weight = jnp.asarray(weight, types.compute)
    # torch's formulation: exact at both ends
    return jnp.where(jnp.abs(weight) < 0.5, x + weight * (end - x),
                     end - (end - x) * (1 - weight)).astype(types.result)


@lower(aten.addcmul.default, promote=Promote.DEFAULT, promote_args=("self", "tensor1", "tensor2"))
def addcmul(x, t1, t2, value=1, *, types):
    c = types.compute
    return (x.astype(c) + jnp.asarray(value, c) * t1.astype(c) * t2.astype(c)).astype(types.result)


@lower(aten.addcdiv.default, promote=Promote.DEFAULT, promote_args=("self", "tensor1", "tensor2"))
def addcdiv(x, t1, t2, value=1, *, types):
    c = types.compute
    return (x.astype(c) + jnp.asarray(value, c) * (t1.astype(c) / t2.astype(c))).astype(types.result)
