"""Elementwise lowerings: unary math, binary arithmetic, comparisons, ternary ops, activations."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..runtime.buffer import apply
from ..runtime.dtypes import cast, check_scalar, overflow_error, to_jax
from ._helpers import (
    accumulator,
    binary,
    check_nonzero,
    converted,
    host_number,
    predicate,
    type_name,
    unary,
)
from ._nn_helpers import require
from .dispatch import fitted_dtype
from .registry import Promote, Runs, Types, lower, runtime

aten = __import__("torch").ops.aten
INT_TO_FLOAT, BOOL = Promote.INT_TO_FLOAT, Promote.ALWAYS_BOOL


# ----------------------------------------------------------------------------- unary
def _digamma(x):
    """torch puts digamma's pole at 0 as -inf at +0 and +inf at -0; jax returns NaN there."""
    pole = jnp.copysign(jnp.inf, -x).astype(x.dtype)
    return jnp.where(x == 0, pole, jax.scipy.special.digamma(x))


for _op, _fn in [
    (aten.neg, jnp.negative),
    (aten.sign, lambda x: x if x.dtype == jnp.bool_ else jnp.sign(x)),
    (aten.sgn, lambda x: x if x.dtype == jnp.bool_ else jnp.sign(x)),
    (aten.ceil, jnp.ceil),
    (aten.floor, jnp.floor),
    (aten.trunc, jnp.trunc),
    (aten.round, jnp.round),
    (aten.bitwise_not, jnp.invert),
    (aten.frac, lambda x: x - jnp.trunc(x)),
]:
    unary(_op.default, _fn)


@lower(aten.relu.default, promote=Promote.DEFAULT, promote_args=("self",))
def relu(x, *, types):
    if x.dtype == jnp.bool_:
        raise RuntimeError("Boolean inputs not supported for relu")
    return jax.nn.relu(x.astype(types.compute)).astype(types.result)


for _op, _fn in [
    (aten.exp, jnp.exp),
    (aten.exp2, jnp.exp2),
    (aten.expm1, jnp.expm1),
    (aten.log, jnp.log),
    (aten.log2, jnp.log2),
    (aten.log10, jnp.log10),
    (aten.log1p, jnp.log1p),
    (aten.sqrt, jnp.sqrt),
    (aten.rsqrt, lax.rsqrt),
    (aten.reciprocal, jnp.reciprocal),
    (aten.sin, jnp.sin),
    (aten.cos, jnp.cos),
    (aten.tan, jnp.tan),
    (aten.asin, jnp.arcsin),
    (aten.acos, jnp.arccos),
    (aten.atan, jnp.arctan),
    (aten.sinh, jnp.sinh),
    (aten.cosh, jnp.cosh),
    (aten.tanh, jnp.tanh),
    (aten.asinh, jnp.arcsinh),
    (aten.acosh, jnp.arccosh),
    (aten.atanh, jnp.arctanh),
    (aten.sigmoid, jax.nn.sigmoid),
    (aten.erf, jax.scipy.special.erf),
    (aten.erfc, jax.scipy.special.erfc),
    (aten.erfinv, jax.scipy.special.erfinv),
    (aten.lgamma, jax.scipy.special.gammaln),
    (aten.digamma, _digamma),
    (aten.silu, jax.nn.silu),
    (aten.mish, lambda x: x * jnp.tanh(jax.nn.softplus(x))),
    (aten.hardsigmoid, jax.nn.hard_sigmoid),
    (aten.hardswish, jax.nn.hard_swish),
    (aten.sinc, jnp.sinc),
]:
    unary(_op.default, _fn, promote=INT_TO_FLOAT)

unary(aten.abs.default, jnp.abs, promote=Promote.COMPLEX_TO_FLOAT)

for _op, _fn in [
    (aten.isnan, jnp.isnan),
    (aten.isinf, jnp.isinf),
    (aten.isposinf, jnp.isposinf),
    (aten.isneginf, jnp.isneginf),
    (aten.signbit, jnp.signbit),
    (aten.logical_not, jnp.logical_not),
]:
    unary(_op.default, _fn, promote=BOOL)


def _real_only(fn):
    """``fn``, refusing complex inputs as PyTorch does (deg2rad, rad2deg)."""

    def real(x):
        require(not jnp.issubdtype(x.dtype, jnp.complexfloating))
        return fn(x)

    return real


unary(aten.deg2rad.default, _real_only(lambda x: x * (math.pi / 180)), promote=INT_TO_FLOAT)
unary(aten.rad2deg.default, _real_only(lambda x: x * (180 / math.pi)), promote=INT_TO_FLOAT)


@lower(aten.round.decimals, promote=Promote.DEFAULT, promote_args=("self",))
def round_decimals(x, decimals, *, types):
    """PyTorch's kernel: scale by 10^|decimals| (divide for negative decimals), round half to
    even, scale back, all in the compute dtype."""
    x = x.astype(types.compute)
    scale = jnp.asarray(10.0 ** abs(decimals), types.compute)
    if decimals < 0:
        return (jnp.round(x / scale) * scale).astype(types.result)
    return (jnp.round(x * scale) / scale).astype(types.result)


@lower(aten.frexp.Tensor)
def frexp(x):
    require(jnp.issubdtype(x.dtype, jnp.floating))
    mantissa, exponent = jnp.frexp(x)
    return mantissa.astype(x.dtype), exponent.astype(jnp.int32)


@lower(aten.ldexp.Tensor, promote=Promote.INT_TO_FLOAT)
def ldexp(x, other, *, types):
    """PyTorch's ``self * pow(2.0, other)``: the power in the dtype of a float ``other`` (else
    the result's, at least float32), the product in the promotion of both with integers as the
    default float (a float ``self`` keeps its dtype for an integer ``other``)."""
    power_dtype = other.dtype if jnp.issubdtype(other.dtype, jnp.inexact) else accumulator(types.result)
    wide = accumulator(power_dtype)
    power = jnp.power(jnp.asarray(2, wide), other.astype(wide)).astype(power_dtype)  # exact, unlike exp2
    dtype = accumulator(types.result)
    return (x.astype(dtype) * power.astype(dtype)).astype(types.result)


@lower(aten.fill.Scalar, aten.fill.Tensor)
def fill(x, value):
    require(jnp.ndim(value) == 0)
    return jnp.full(x.shape, converted(value, x.dtype))


@lower(aten.gelu.default, promote=INT_TO_FLOAT, promote_args=("self",))
def gelu(x, approximate="none", *, types):
    if approximate not in ("none", "tanh"):
        raise RuntimeError("approximate argument must be either none or tanh.")
    return jax.nn.gelu(x.astype(types.compute), approximate=approximate == "tanh").astype(types.result)


@lower(
    aten.leaky_relu.default,
    promote=Promote.DEFAULT,
    promote_args=("self",),
    fitted_in_opmath=("negative_slope",),
)
def leaky_relu(x, negative_slope=0.01, *, types):
    x = x.astype(types.compute)
    return jnp.where(x > 0, x, x * negative_slope).astype(types.result)


@lower(
    aten.elu.default,
    promote=INT_TO_FLOAT,
    promote_args=("self",),
    fitted_in_opmath=("alpha", "scale", "input_scale"),
)
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0, *, types):
    x = x.astype(types.compute)
    # (CPU's branch: 0 is positive, so an infinite alpha gives 0 there, not NaN)
    return (scale * jnp.where(x < 0, alpha * jnp.expm1(x * input_scale), x)).astype(types.result)


@lower(aten.celu.default, promote=INT_TO_FLOAT, promote_args=("self",), fitted_in_opmath=("alpha",))
def celu(x, alpha=1.0, *, types):
    """PyTorch's ``elu(x, alpha, scale=1, input_scale=1/alpha)``."""
    return elu(x, alpha, 1.0, 1 / alpha, types=types)


def _shrinks(x, lambd):
    """Where hardshrink and softshrink zero their input (and their gradients)."""
    return (x >= -lambd) & (x <= lambd)


@lower(aten.hardshrink.default, promote=Promote.DEFAULT, promote_args=("self",), fitted=("lambd",))
def hardshrink(x, lambd=0.5, *, types):
    # CPU compares with lambd rounded to the input's dtype
    return jnp.where(_shrinks(x, jnp.asarray(lambd, x.dtype)), 0, x).astype(types.result)


def _check_lambda(x, lambd=0.5):
    """CPU refuses a negative threshold (one past the dtype's largest value cannot be given)."""
    lambd = host_number(lambd)
    if lambd is not None and not lambd >= 0 and jnp.issubdtype(x.dtype, jnp.floating):
        bounds = f"[0, {float(jnp.finfo(x.dtype).max):g}] for input dtype {type_name(x.dtype)}"
        raise RuntimeError(f"lambda must be in range {bounds}, but found {lambd:g}")


@lower(aten.softshrink.default, promote=Promote.DEFAULT, promote_args=("self",), check=_check_lambda)
def softshrink(x, lambd=0.5, *, types):
    x, lambd = x.astype(types.compute), jnp.asarray(lambd, types.compute)
    # 0 * x keeps NaN and the sign of zero, as CPU's kernel does
    shrunk = jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, 0 * x))
    return shrunk.astype(types.result)


def _shrink_backward(grad, x, lambd, *, types):
    grad, x = grad.astype(types.result), x.astype(types.result)
    return jnp.where(_shrinks(x, jnp.asarray(lambd, types.result)), 0, grad)


lower(aten.hardshrink_backward.default, promote=Promote.DEFAULT, promote_args=("grad_out", "self"))(
    _shrink_backward
)
lower(aten.softshrink_backward.default, promote=Promote.DEFAULT, promote_args=("grad_output", "self"))(
    _shrink_backward
)


@lower(
    aten.softplus.default,
    promote=INT_TO_FLOAT,
    promote_args=("self",),
    fitted_in_opmath=("beta", "threshold"),
)
def softplus(x, beta=1.0, threshold=20.0, *, types):
    x = x.astype(types.compute)
    scaled = x * beta
    return jnp.where(scaled > threshold, x, jnp.log1p(jnp.exp(scaled)) / beta).astype(types.result)


def _check_hardtanh(x, min_val=None, max_val=None) -> None:
    """CPU's refusals for an integer input, whose limits it first converts to int64 (truncated
    toward zero): one int64 cannot hold, and for uint8 one below 0 (-0.5 passes). None is the
    default, -1.0 or 1.0. (The limits are then clamped in the input's dtype: ``fitted``.)"""
    if x.dtype.kind not in "iu":  # (a cheap test: the core calls it at every call)
        return
    limits = [
        -1.0 if min_val is None else host_number(min_val),
        1.0 if max_val is None else host_number(max_val),
    ]
    for limit in limits:
        if limit is not None and not -(2.0**63) <= limit < 2.0**63:  # (NaN too)
            raise overflow_error(jnp.int64)
    if x.dtype == jnp.uint8 and any(limit is not None and limit <= -1 for limit in limits):
        raise RuntimeError("cannot do hardtanh on an unsigned type with negative limits")


@lower(
    aten.hardtanh.default,
    promote=Promote.DEFAULT,
    promote_args=("self",),
    check=_check_hardtanh,
    fitted=("min_val", "max_val"),  # (clamped in the input's dtype)
)
def hardtanh(x, min_val=-1.0, max_val=1.0, *, types):
    require(x.dtype != jnp.bool_)
    return jnp.clip(x.astype(types.compute), min_val, max_val).astype(types.result)


@lower(aten.logit.default, promote=INT_TO_FLOAT, promote_args=("self",))
def logit(x, eps=None, *, types):
    x = x.astype(types.compute)
    if eps is not None:  # (static: CPU's conversion into the result dtype, checked as it traces)
        check_scalar(eps, types.result, 2)
        low, high = jnp.asarray(eps, x.dtype), 1 - jnp.asarray(eps, x.dtype)
        # (CPU's comparisons, not a clip: NaN clamps nothing, and eps > 0.5 crosses the limits)
        x = jnp.where(x < low, low, jnp.where(x > high, high, x))
    return jnp.log(x / (1 - x)).astype(types.result)


@lower(aten.logit_backward.default, promote=Promote.DEFAULT, promote_args=("grad_output", "self"))
def logit_backward(grad, x, eps=None, *, types):
    """CPU's kernel: outside [eps, 1 - eps] the gradient is 0 (NaN outside [0, 1] without eps),
    and at exactly 0 or 1 it is ``grad * inf``."""
    grad, x = grad.astype(types.compute), x.astype(types.compute)
    low, high = (0.0, 1.0) if eps is None else (eps, 1 - eps)
    outside = jnp.nan if eps is None else 0.0
    at_pole = (x == 0) | (x == 1)
    inner = jnp.where(at_pole, grad * jnp.inf, grad / jnp.where(at_pole, 1, x * (1 - x)))
    return jnp.where((x < low) | (x > high), outside, inner).astype(types.result)


@lower(aten._prelu_kernel.default, promote=Promote.DEFAULT, pad=None)  # (weight along dim 1)
def prelu(x, weight, *, types):
    x, weight = x.astype(types.compute), weight.astype(types.compute)
    return jnp.where(x > 0, x, weight * x).astype(types.result)


@lower(aten._prelu_kernel_backward.default, promote=Promote.DEFAULT, pad=None)
def prelu_backward(grad, x, weight, *, types):
    """(grad_input, grad_weight), both in the broadcast shape: autograd sums grad_weight down
    to the weight's shape itself."""
    grad, x, weight = (a.astype(types.compute) for a in jnp.broadcast_arrays(grad, x, weight))
    positive = x > 0
    return (
        jnp.where(positive, grad, weight * grad).astype(types.result),
        jnp.where(positive, 0, x * grad).astype(types.result),
    )


def _check_slopes(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    """CPU converts the slopes' bounds into the op's math type when training, and evaluates
    ``leaky_relu`` with their mean (computed in double), whose slope it converts alike."""
    lower, upper = host_number(lower), host_number(upper)
    if lower is None or upper is None:
        return
    dtype = fitted_dtype(x.dtype, in_opmath=True)
    for slope in (lower, upper) if training else ((lower + upper) / 2,):
        check_scalar(slope, dtype, 1)


@lower(aten.rrelu_with_noise_functional.default, random=True, check=_check_slopes)
def rrelu_with_noise(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None, *, key):
    """(output, noise). Training draws each non-positive element's slope from U(lower, upper)
    (noise 1 elsewhere); evaluation is leaky_relu with their mean, leaving noise as it was."""
    compute = accumulator(x.dtype)
    if not training:
        return jnp.where(x > 0, x, x.astype(compute) * ((lower + upper) / 2)).astype(x.dtype), noise
    slopes = jax.random.uniform(key, x.shape, compute, minval=lower, maxval=upper)
    noise = jnp.where(x <= 0, slopes, 1).astype(x.dtype)
    return (x.astype(compute) * noise.astype(compute)).astype(x.dtype), noise


@runtime(aten.rrelu_with_noise.default)
def rrelu_with_noise_updating_noise(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    """What ``F.rrelu`` calls: the functional op, then ``noise`` updated in place."""
    output, new_noise = aten.rrelu_with_noise_functional.default(x, noise, lower, upper, training, generator)
    noise.copy_(new_noise)
    return output


@runtime(aten.rrelu_with_noise_.default)
def rrelu_with_noise_in_place(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    """``F.rrelu(inplace=True)``: writes both the output (into ``x``) and the noise."""
    return x.copy_(rrelu_with_noise_updating_noise(x, noise, lower, upper, training, generator))


@lower(
    aten.rrelu_with_noise_backward.default,
    promote=Promote.DEFAULT,
    promote_args=("grad_output", "self"),
    static=("lower", "upper"),
)
def rrelu_with_noise_backward(grad, x, noise, lower, upper, training, self_is_result, *, types):
    """PyTorch's formula: the sampled slopes when training (with a real range), else
    leaky_relu's gradient with the mean slope."""
    grad, x = grad.astype(types.compute), x.astype(types.compute)
    if training and upper - lower > 1e-6:
        return (grad * noise.astype(types.compute)).astype(types.result)
    return jnp.where(x > 0, grad, grad * ((lower + upper) / 2)).astype(types.result)


def _glu_halves(x, dim):
    return jnp.split(x, 2, axis=dim)


@lower(aten.glu_jvp.default)
def glu_jvp(glu, x, dx, dim):
    """Forward-mode derivative of glu(x) = a * sigmoid(b) along dx = (da, db)."""
    (_, b), (da, db) = _glu_halves(x, dim), _glu_halves(dx, dim)
    sig_b = jax.nn.sigmoid(b)
    return da * sig_b + glu * (db - sig_b * db)


@lower(aten.glu_backward_jvp.default)
def glu_backward_jvp(grad_x, grad_glu, x, dgrad_glu, dx, dim):
    """Forward-mode derivative of glu_backward, PyTorch's formula (Activation.cpp)."""
    (a, b), (da, db) = _glu_halves(x, dim), _glu_halves(dx, dim)
    grad_x_a = _glu_halves(grad_x, dim)[0]
    sig_b = jax.nn.sigmoid(b)
    glu = a * sig_b
    db_neg_sig_b = db - db * sig_b
    dgrad_x_a = dgrad_glu * sig_b + grad_x_a * db_neg_sig_b
    dgrad_x_b = dgrad_x_a * (a - glu) + grad_x_a * (da - da * sig_b - glu * db_neg_sig_b)
    return jnp.concatenate([dgrad_x_a, dgrad_x_b], axis=dim)


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


def _trunc_divide(x, y):
    if jnp.issubdtype(x.dtype, jnp.integer):
        return lax.div(*jnp.broadcast_arrays(x, y))  # C-style truncation
    return jnp.trunc(x / y)


def _true_divide(x, y):
    return x / y


def _size(x) -> int:
    return math.prod(getattr(x, "shape", ()))


@functools.cache
def _divided(divide: Callable, types: Types) -> Callable:
    """The program of ``divide`` computing in ``types``: one per pair, as static arguments of
    one program would be hashed and compared at every call."""

    def program(x, y):
        return divide(jnp.asarray(x, types.compute), jnp.asarray(y, types.compute)).astype(types.result)

    return jax.jit(program)


@functools.cache
def _in_integers(types: Types) -> bool:
    return bool(jnp.issubdtype(types.compute, jnp.integer))


_BOOL = np.dtype(jnp.bool_)


def _division(divide, kernel: str):
    """The lowering of a division ``op(self, other)`` (``binary``'s promotion) that checks an
    integer divisor for zeros first, as CPU does (:func:`check_nonzero`). Not jitted itself, so
    the check sees the promoted dtype; the division is. ``kernel`` names CPU's kernel, which
    has no bool version."""

    def lowering(x, y, *, types):
        if types.compute == _BOOL:
            raise NotImplementedError(f"\"{kernel}\" not implemented for 'Bool'")
        if _in_integers(types) and _size(x) and _size(y):
            check_nonzero(y, types.compute)
        return apply(_divided(divide, types), x, y)

    return lowering


def _lcm(x, y):
    """PyTorch's ``|x / gcd * y|`` in the integer dtype itself, wrapping on overflow as it does."""
    divisor = jnp.gcd(x, y)
    return jnp.where(divisor == 0, 0, jnp.abs(x // jnp.where(divisor == 0, 1, divisor) * y))


def _tensor_binaries(name: str):
    """The overloads of ``aten.<name>`` computing ``op(self, other)`` with a Tensor on at least
    one side (``Tensor``, ``Scalar``, ``Scalar_Tensor``, ...; TorchScript's number-only forms and
    ``out=`` forms left out)."""
    packet = getattr(aten, name)
    for overload_name in packet.overloads():
        op = getattr(packet, overload_name)
        arguments = op._schema.arguments
        if [a.name for a in arguments] == ["self", "other"] and "Tensor" in [str(a.type) for a in arguments]:
            yield op


def _multiply(x, y):
    """``x * y``; float8 ones as CPU's kernel: the product of the widened values, rounded to
    float8 saturating (``cast``; XLA's own rounding makes an overflow NaN)."""
    if x.dtype.itemsize == 1 and jnp.issubdtype(x.dtype, jnp.floating):
        return cast(x.astype(jnp.float32) * y.astype(jnp.float32), x.dtype)
    return jnp.multiply(x, y)


# the shift operators (``x << 2``) share the bitwise shifts' CPU kernel
for _names, _fn in [
    (("mul",), _multiply),
    (("maximum",), jnp.maximum),
    (("minimum",), jnp.minimum),
    (("fmax",), jnp.fmax),
    (("fmin",), jnp.fmin),
    (("bitwise_and",), jnp.bitwise_and),
    (("bitwise_or",), jnp.bitwise_or),
    (("bitwise_xor",), jnp.bitwise_xor),
    (("gcd",), jnp.gcd),
    (("lcm",), _lcm),
    (("bitwise_left_shift", "__lshift__"), jnp.left_shift),
    (("bitwise_right_shift", "__rshift__"), jnp.right_shift),
]:
    for _name in _names:
        for _op in _tensor_binaries(_name):
            binary(_op, _fn)

for _name, _fn, _kernel in [
    ("remainder", jnp.remainder, "remainder_cpu"),
    ("fmod", jnp.fmod, "fmod_cpu"),
    ("floor_divide", _floor_divide, "div_floor_cpu"),
]:
    for _op in _tensor_binaries(_name):
        lower(_op, promote=Promote.DEFAULT, promote_args=("self", "other"), runs=Runs.EAGER)(
            _division(_fn, _kernel)
        )


def _shift_in_place(shift):
    """``x <<= y``/``x >>= y``: the shift, written back into ``x`` in its own dtype."""
    return lambda x, other: x.copy_(shift(x, other))


for _in_place, _shift in [(aten.__ilshift__, aten.__lshift__), (aten.__irshift__, aten.__rshift__)]:
    for _overload in ("Scalar", "Tensor"):
        runtime(getattr(_in_place, _overload))(_shift_in_place(getattr(_shift, _overload)))

for _name, _fn in [
    ("atan2", jnp.arctan2),
    ("hypot", jnp.hypot),
    ("logaddexp", jnp.logaddexp),
    ("logaddexp2", jnp.logaddexp2),
    ("copysign", jnp.copysign),
    ("xlogy", jax.scipy.special.xlogy),
    ("nextafter", jnp.nextafter),
]:
    for _op in _tensor_binaries(_name):
        binary(_op, _fn, promote=INT_TO_FLOAT)

for _name, _fn in [
    ("eq", jnp.equal),
    ("ne", jnp.not_equal),
    ("lt", jnp.less),
    ("le", jnp.less_equal),
    ("gt", jnp.greater),
    ("ge", jnp.greater_equal),
]:
    predicate(getattr(aten, _name).Tensor, _fn)
    predicate(getattr(aten, _name).Scalar, _fn)


def _check_isclose(x, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> None:
    """CPU's refusals, in its order."""
    if x.dtype != other.dtype:
        raise RuntimeError(f"{type_name(x.dtype)} did not match {type_name(other.dtype)}")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value < 0:
            raise RuntimeError(f"{name} must be greater than or equal to zero, but got {value:g}")


@lower(
    aten.isclose.default,
    promote=INT_TO_FLOAT,
    static=("rtol", "atol"),
    check=_check_isclose,
    nondifferentiable=True,
)
def isclose(x, other, rtol=1e-05, atol=1e-08, equal_nan=False, *, types):
    """PyTorch's decomposition of ``isclose`` as one program (``assert_close`` calls it on
    every comparison): each step rounded to the dtype it returns on CPU, computed in the op
    math dtype with the tolerances converted to it; integers and bools compared in the default
    float dtype."""
    close = x == other
    if equal_nan and jnp.issubdtype(x.dtype, jnp.inexact):
        close = close | (jnp.isnan(x) & jnp.isnan(other))
    if rtol == 0 and atol == 0:
        return close
    dtype, wide = types.result, types.compute
    real = jnp.finfo(dtype).dtype
    other = other.astype(wide)
    scaled = (other * jnp.asarray(rtol, wide)).astype(dtype)
    allowed = (jnp.abs(scaled).astype(accumulator(real)) + atol).astype(real)
    actual = jnp.abs((x.astype(wide) - other).astype(dtype))
    return close | (jnp.isfinite(actual) & (actual <= allowed))


for _name, _fn in [
    ("logical_and", jnp.logical_and),
    ("logical_or", jnp.logical_or),
    ("logical_xor", jnp.logical_xor),
]:
    predicate(getattr(aten, _name).default, _fn)


def _check_alpha(alpha, result) -> None:
    """CPU's refusals of an ``alpha`` of a kind the result's dtype cannot take (at trace time:
    the number's type is part of the call's key), which PyTorch's meta kernels do not make."""
    kind = jnp.result_type(alpha)
    if kind == jnp.bool_ and result != jnp.bool_:
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    inexact = jnp.issubdtype(kind, jnp.inexact)
    if inexact and not jnp.issubdtype(result, jnp.inexact):
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")
    if jnp.issubdtype(kind, jnp.complexfloating) and not jnp.issubdtype(result, jnp.complexfloating):
        raise RuntimeError("For non-complex input tensors, argument alpha must not be a complex number.")


#: The options of ``op(self, other, alpha)``: promoted together, ``alpha`` fitted into the result
_WITH_ALPHA = {"promote": Promote.DEFAULT, "promote_args": ("self", "other"), "fitted": ("alpha",)}


@lower(aten.add.Tensor, aten.add.Scalar, **_WITH_ALPHA, host=lambda x, y, alpha=1: x + y * alpha)
def add(x, y, alpha=1, *, types):
    _check_alpha(alpha, types.result)
    x, y = jnp.asarray(x, types.compute), jnp.asarray(y, types.compute)
    return (x + y * jnp.asarray(alpha, types.compute)).astype(types.result)


@lower(aten._add_relu.Tensor, aten._add_relu.Scalar, **_WITH_ALPHA)
def add_relu(x, y, alpha=1, *, types):
    # CPU's fused kernel exists for float32, float64 and the integer types only
    require(x.dtype not in (jnp.bool_, jnp.float16, jnp.bfloat16) and not jnp.iscomplexobj(x))
    return jax.nn.relu(add(x, y, alpha, types=types))


@lower(aten.heaviside.default, promote=Promote.DEFAULT)
def heaviside(x, values, *, types):
    require(x.dtype == values.dtype)  # PyTorch does not promote here
    return jnp.where(x == 0, values, (x > 0).astype(types.result))


@lower(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor, promote=BOOL, pad=None)
def isin(elements, test_elements, assume_unique=False, invert=False, *, types):
    """Membership by binary search in the sorted test elements, compared in the promoted dtype."""
    require(types.compute != jnp.bool_)
    elements = jnp.asarray(elements, types.compute)
    candidates = jnp.sort(jnp.asarray(test_elements, types.compute).reshape(-1))
    if candidates.size == 0:
        found = jnp.zeros(elements.shape, jnp.bool_)
    else:
        position = jnp.clip(jnp.searchsorted(candidates, elements), 0, candidates.size - 1)
        found = candidates[position] == elements
    return found != invert


def _check_not_bool(x, y) -> None:
    """CPU's refusal of ``-`` with bool operands (not in PyTorch's meta kernels)."""
    bools = [jnp.asarray(v).dtype == jnp.bool_ for v in (x, y)]
    if all(bools):
        raise RuntimeError(
            "Subtraction, the `-` operator, with two bool tensors is not supported. "
            "Use the `^` or `logical_xor()` operator instead."
        )
    if any(bools):
        raise RuntimeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. "
            "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
        )


@lower(aten.sub.Tensor, aten.sub.Scalar, **_WITH_ALPHA, host=lambda x, y, alpha=1: x - y * alpha)
def sub(x, y, alpha=1, *, types):
    _check_not_bool(x, y)
    _check_alpha(alpha, types.result)
    x, y = jnp.asarray(x, types.compute), jnp.asarray(y, types.compute)
    return (x - y * jnp.asarray(alpha, types.compute)).astype(types.result)


@lower(aten.rsub.Tensor, aten.rsub.Scalar, **_WITH_ALPHA)
def rsub(x, y, alpha=1, *, types):
    return sub(y, x, alpha, types=types)


binary(aten.div.Tensor, lambda x, y: x / y, promote=INT_TO_FLOAT)
binary(aten.div.Scalar, lambda x, y: x / y, promote=INT_TO_FLOAT)


_ROUNDED_DIVISIONS = {
    "trunc": _division(_trunc_divide, "div_trunc_cpu"),
    "floor": _division(_floor_divide, "div_floor_cpu"),
}


@lower(
    aten.div.Tensor_mode,
    aten.div.Scalar_mode,
    promote=Promote.DEFAULT,
    promote_args=("self", "other"),
    runs=Runs.EAGER,
)
def div_mode(x, y, rounding_mode=None, *, types):
    if rounding_mode is None:  # true division, in the default float dtype for integers
        if not jnp.issubdtype(types.compute, jnp.inexact):
            default = to_jax(__import__("torch").get_default_dtype())
            types = Types(default, default)
        return apply(_divided(_true_divide, types), x, y)
    return _ROUNDED_DIVISIONS[rounding_mode](x, y, types=types)


@lower(
    aten.pow.Tensor_Scalar, promote=Promote.DEFAULT, promote_args=("self", "exponent"), static=("exponent",)
)
def pow_tensor_scalar(x, exponent, *, types):
    _check_exponent(x.dtype, exponent, types.result)
    x = x.astype(types.compute)
    if isinstance(exponent, int) and not isinstance(exponent, bool):
        if exponent >= 0:
            return lax.integer_pow(x, exponent).astype(types.result)
        return _power(x, jnp.asarray(exponent, types.compute)).astype(types.result)
    with np.errstate(over="ignore"):  # (one past the dtype's range is infinite, as cast on CPU)
        exponent = jnp.asarray(exponent, types.compute)
    return jnp.power(x, exponent).astype(types.result)


def _check_exponent(base: np.dtype, exponent: bool | int | float | complex, result: np.dtype) -> None:
    """CPU's refusals of a number exponent (static here, so checked as it traces): a negative
    integer one for an integer or bool base (read as an int64 first), and one the kernel's
    exponent type cannot hold: the result dtype, but double for float32 and float64. (A traced
    exponent, a foreach op's list's, is not a number here.)"""
    if type(exponent) not in (bool, int, float, complex):
        return
    if base.kind in "biu" and type(exponent) in (bool, int):
        check_scalar(exponent, jnp.int64, 2)
        if exponent < 0:
            raise RuntimeError("Integers to negative integer powers are not allowed.")
    if result.kind in "biu" or result in (np.dtype(jnp.float16), np.dtype(jnp.bfloat16)):
        check_scalar(exponent, result, 2)


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
    return jnp.where(condition, converted(x, types.result), converted(y, types.result))


def _check_clamp(x, min=None, max=None):
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")


@lower(
    aten.clamp.default, aten.clamp.Tensor, promote=Promote.DEFAULT, check=_check_clamp, fitted=("min", "max")
)
def clamp(x, min=None, max=None, *, types):
    x = x.astype(types.compute)
    if min is not None:
        x = jnp.maximum(x, jnp.asarray(min, types.compute))
    if max is not None:
        x = jnp.minimum(x, jnp.asarray(max, types.compute))
    return x.astype(types.result)


@lower(aten.clamp_min.default, aten.clamp_min.Tensor, promote=Promote.DEFAULT, fitted=("min",))
def clamp_min(x, min, *, types):
    return clamp(x, min, None, types=types)


@lower(aten.clamp_max.default, aten.clamp_max.Tensor, promote=Promote.DEFAULT, fitted=("max",))
def clamp_max(x, max, *, types):
    return clamp(x, None, max, types=types)


@lower(aten.lerp.Scalar, aten.lerp.Tensor, promote=Promote.DEFAULT, fitted_in_opmath=("weight",))
def lerp(x, end, weight, *, types):
    x, end = x.astype(types.compute), jnp.asarray(end, types.compute)
    weight = jnp.asarray(weight, types.compute)
    # torch's formulation: exact at both ends
    return jnp.where(jnp.abs(weight) < 0.5, x + weight * (end - x), end - (end - x) * (1 - weight)).astype(
        types.result
    )


@lower(
    aten.addcmul.default,
    promote=Promote.DEFAULT,
    promote_args=("self", "tensor1", "tensor2"),
    fitted_in_opmath=("value",),
)
def addcmul(x, t1, t2, value=1, *, types):
    c = types.compute
    return (x.astype(c) + jnp.asarray(value, c) * t1.astype(c) * t2.astype(c)).astype(types.result)


_ADDCDIV_INTEGERS = (  # CPU's message (meta's spells it as a tuple)
    "Integer division with addcdiv is no longer supported, and in a future  release addcdiv will perform "
    "a true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as "
    "(input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as "
    "(input + value * tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the latter "
    "implementation: (input + value * tensor1 / tensor2), for all dtypes."
)


@lower(
    aten.addcdiv.default,
    promote=Promote.DEFAULT,
    promote_args=("self", "tensor1", "tensor2"),
    fitted_in_opmath=("value",),
)
def addcdiv(x, t1, t2, value=1, *, types):
    if not any(jnp.issubdtype(t.dtype, jnp.inexact) for t in (t1, t2)):
        raise RuntimeError(_ADDCDIV_INTEGERS)
    c = types.compute
    return (x.astype(c) + jnp.asarray(value, c) * (t1.astype(c) / t2.astype(c))).astype(types.result)
