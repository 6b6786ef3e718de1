"""Random sampling: the functional fills (``uniform``, ``cauchy``...; their in-place forms such as
``x.cauchy_()`` are derived), tensor-parameter distributions, and the random factories.

Every lowering takes a fresh key from the tpu generator (``random=True``), so values are
reproducible under ``torch.manual_seed`` but are not CPU's values (the bit generators differ).
Half types are sampled in float32 and rounded, as torch does. Argument checks raise PyTorch CPU's
exceptions; the ones that depend on tensor values run before the jitted sampler (``check=``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.scipy.special import digamma

from ..runtime import padding as padding_state
from ..runtime.buffer import Padded
from ..runtime.random import key_of
from ._helpers import accumulator, check_values, result_dtype, type_name
from .creation import _factory_out, _float_or_default
from .padding import DRAWN, leading_only
from .registry import Layout, OutDtype, Runs, lower, runtime

aten = torch.ops.aten


# ----------------------------------------------------------------------------- dtype checks
def _is_floating(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def _is_complex(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.complexfloating)


def _require_dtype(
    kernel: str, dtype, *, floating=True, complex_=False, integral=False, boolean=False
) -> None:
    """PyTorch CPU's NotImplementedError for a dtype its kernel is not built for."""
    allowed = (
        (floating and _is_floating(dtype))
        or (complex_ and _is_complex(dtype))
        or (integral and jnp.issubdtype(dtype, jnp.integer))
        or (boolean and dtype == jnp.bool_)
    )
    if not allowed:
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{type_name(dtype)}'")


def _require_continuous(distribution: str, dtype) -> None:
    if not _is_floating(dtype):
        raise RuntimeError(
            f"{distribution} distribution is a continuous probability distribution. "
            f"dtype must be a floating point but you specified {type_name(dtype)}"
        )


# ----------------------------------------------------------------------------- samplers
def _continuous(key, shape, dtype, draw):
    """``draw(key, shape, float_dtype)`` as ``dtype``: half types drawn in float32 then rounded;
    complex ones with real and imaginary parts drawn independently."""
    shape = tuple(shape)
    if _is_complex(dtype):
        parts = draw(key, shape + (2,), np.dtype(jnp.finfo(dtype).dtype))
        return jax.lax.complex(parts[..., 0], parts[..., 1]).astype(dtype)
    return draw(key, shape, accumulator(dtype)).astype(dtype)


def _uniform(key, shape, dtype, low=0.0, high=1.0):
    return _continuous(key, shape, dtype, lambda k, s, d: jax.random.uniform(k, s, d, low, high))


def _normal(key, shape, dtype, mean=0.0, std=1.0):
    # complex normals split the variance between the two parts, as torch does
    scale = std / math.sqrt(2) if _is_complex(dtype) else std
    return _continuous(key, shape, dtype, lambda k, s, d: mean + scale * jax.random.normal(k, s, d))


def _integers(key, shape, low, high):
    """int64 integers in [low, high); the span may be 2**64 (int64's full range), which
    ``jax.random.randint`` cannot express: offsets are drawn as uint64 bits."""
    bits = jax.random.bits(key, tuple(shape), jnp.uint64)
    span = high - low
    if isinstance(span, int):
        offset = bits if span == 2**64 else bits % np.uint64(span)
    else:
        offset = bits % span.astype(jnp.uint64)
    start = jnp.asarray(low).astype(jnp.int64).astype(jnp.uint64)  # two's complement
    return jax.lax.bitcast_convert_type(start + offset, jnp.int64)


# ----------------------------------------------------------------------------- fills
@lower(aten.uniform.default, random=True, pad=DRAWN)
def uniform(x, low=0.0, high=1.0, generator=None, *, key):
    _require_dtype("check_uniform_bounds", x.dtype, complex_=True)
    if low > high:
        raise RuntimeError(
            f"uniform_ expects to return a [from, to) range, but found from={low:g} > to={high:g}"
        )
    return _uniform(key, x.shape, x.dtype, low, high)


def _check_std(std: float) -> None:
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")


@lower(aten.normal_functional.default, random=True, pad=DRAWN)
def normal_functional(x, mean=0.0, std=1.0, generator=None, *, key):
    _require_dtype("normal_kernel_cpu", x.dtype, complex_=True)
    _check_std(std)
    return _normal(key, x.shape, x.dtype, mean, std)


@runtime(aten.normal_.default)
def normal_(self, mean=0.0, std=1.0, generator=None):
    """The in-place form cannot be derived: its functional overload is named
    ``normal_functional``, not ``normal``. Copying writes through views."""
    return self.copy_(aten.normal_functional.default(self, mean, std, generator=generator))


def _random_bounds(dtype) -> tuple[int, int]:
    """The [min, max] integers ``random_`` may produce in ``dtype`` (floats: the exactly
    representable ones)."""
    if dtype == jnp.bool_:
        return 0, 1
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        return int(info.min), int(info.max)
    digits = 2 ** (jnp.finfo(dtype).nmant + 1)
    return -digits, digits


def _integer_bounds(dtype, low: int, high: int | None) -> tuple[int, int]:
    """``random_(from, to)``'s bounds, checked as CPU checks them: [low, high), or up to the
    dtype's limit when ``high`` is None."""
    _require_dtype("random_from_to_kernel_cpu", dtype, integral=True, boolean=True)
    smallest, largest = _random_bounds(dtype)
    if high is None:
        high = largest + 1
    elif low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    for name, bound in (("from", low), ("to - 1", high - 1)):
        if not smallest <= bound <= largest:
            raise RuntimeError(f"{name} is out of bounds for {type_name(dtype)}")
    return low, high


def _random_integers(key, shape, dtype, low: int, high: int | None):
    """``random_(from, to)``'s semantics (:func:`_integer_bounds`)."""
    low, high = _integer_bounds(dtype, low, high)
    return _integers(key, shape, low, high).astype(dtype)


def _integers_between(key, shape, dtype, low, high):
    """:func:`_integers` as ``dtype`` with the int64 bounds as runtime values: one program per
    shape whatever the range. The span is taken modulo 2**64, as :func:`_integers` does (0:
    the full range)."""
    start = jnp.asarray(low).astype(jnp.uint64)
    span = jnp.asarray(high).astype(jnp.uint64) - start
    bits = jax.random.bits(key, tuple(shape), jnp.uint64)
    offset = jnp.where(span == 0, bits, bits % jnp.maximum(span, np.uint64(1)))
    return jax.lax.bitcast_convert_type(start + offset, jnp.int64).astype(dtype)


@lower(getattr(aten.random, "from"), random=True, pad=DRAWN)
def random_from(x, low, high=None, generator=None, *, key):
    return _random_integers(key, x.shape, x.dtype, low, high)


@lower(aten.random.to, random=True, pad=DRAWN)
def random_to(x, high, generator=None, *, key):
    return _random_integers(key, x.shape, x.dtype, 0, high)


@lower(aten.random.default, random=True, pad=DRAWN)
def random(x, generator=None, *, key):
    return _random_integers(key, x.shape, x.dtype, 0, None)


def _bernoulli(key, probability, shape, dtype):
    wide = jnp.asarray(probability).astype(accumulator(jnp.result_type(probability, jnp.float32)))
    return jax.random.bernoulli(key, jnp.broadcast_to(wide, shape), shape).astype(dtype)


@lower(aten.bernoulli.p, random=True, pad=DRAWN)
def bernoulli_p(x, p, generator=None, *, key):
    _require_dtype("bernoulli_scalar_cpu_", x.dtype, integral=True, boolean=True)
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p:g}")
    return _bernoulli(key, p, x.shape, x.dtype)


@jax.jit
def _are_probabilities(p):
    return jnp.all((p >= 0) & (p <= 1))


def _check_probabilities(p) -> None:
    check_values(
        _are_probabilities,
        [p],
        lambda: RuntimeError("Expected p_in >= 0 && p_in <= 1 to be true, but got false."),
    )


@lower(aten.bernoulli.Tensor, random=True, check=lambda x, p, generator: _check_probabilities(p))
def bernoulli_tensor(x, p, generator=None, *, key):
    _require_dtype("bernoulli_tensor_cpu_self_", x.dtype, integral=True, boolean=True)
    return _bernoulli(key, p, x.shape, x.dtype)


@lower(aten.bernoulli.default, random=True, check=lambda x, generator: _check_probabilities(x))
def bernoulli(x, generator=None, *, key):
    _require_dtype("bernoulli_tensor_cpu_p_", x.dtype)
    return _bernoulli(key, x, x.shape, x.dtype)


@lower(aten.exponential.default, random=True, pad=DRAWN)
def exponential(x, lambd=1.0, generator=None, *, key):
    _require_continuous("Exponential", x.dtype)
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd:g}")
    return _continuous(key, x.shape, x.dtype, lambda k, s, d: jax.random.exponential(k, s, d) / lambd)


@lower(aten.cauchy.default, random=True, pad=DRAWN)
def cauchy(x, median=0.0, sigma=1.0, generator=None, *, key):
    _require_continuous("Cauchy", x.dtype)
    if not sigma > 0:
        raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={sigma:g}")
    return _continuous(key, x.shape, x.dtype, lambda k, s, d: median + sigma * jax.random.cauchy(k, s, d))


@lower(aten.geometric.default, random=True, pad=DRAWN)
def geometric(x, p, generator=None, *, key):
    _require_dtype("geometric_cpu", x.dtype, integral=True)
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p:g}")
    return jax.random.geometric(key, p, x.shape, jnp.int64).astype(x.dtype)


@lower(aten.log_normal.default, random=True, pad=DRAWN)
def log_normal(x, mean=1.0, std=2.0, generator=None, *, key):
    _require_dtype("log_normal_cpu", x.dtype)
    if not std > 0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={std:g}")
    return _continuous(
        key, x.shape, x.dtype, lambda k, s, d: jnp.exp(mean + std * jax.random.normal(k, s, d))
    )


# ----------------------------------------------------------------------------- normal(Tensor...)
@jax.jit
def _all_non_negative(x):
    return jnp.all(x >= 0)


def _check_std_tensor(std) -> None:
    check_values(_all_non_negative, [std], lambda: RuntimeError("normal expects all elements of std >= 0.0"))


def _normal_around(key, mean, std, dtype):
    _require_dtype("normal_kernel_cpu", dtype)
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    wide = accumulator(dtype)
    noise = jax.random.normal(key, shape, wide)
    return (jnp.asarray(mean, wide) + jnp.asarray(std, wide) * noise).astype(dtype)


@lower(aten.normal.Tensor_float, random=True)
def normal_tensor_float(mean, std=1.0, generator=None, *, key):
    _check_std(std)
    return _normal_around(key, mean, std, mean.dtype)


@lower(aten.normal.float_Tensor, random=True, check=lambda mean, std, generator: _check_std_tensor(std))
def normal_float_tensor(mean, std, generator=None, *, key):
    return _normal_around(key, mean, std, std.dtype)


@lower(aten.normal.Tensor_Tensor, random=True, check=lambda mean, std, generator: _check_std_tensor(std))
def normal_tensor_tensor(mean, std, generator=None, *, key):
    return _normal_around(key, mean, std, result_dtype(mean.dtype, std.dtype))


# ----------------------------------------------------------------------------- distributions
def _check_rates(rates) -> None:
    check_values(
        _all_non_negative,
        [rates],
        lambda: RuntimeError("invalid Poisson rate, expected rate to be non-negative"),
    )


@lower(aten.poisson.default, random=True, check=lambda rates, generator: _check_rates(rates))
def poisson(rates, generator=None, *, key):
    _require_dtype("poisson_cpu", rates.dtype)
    wide = rates.astype(accumulator(rates.dtype))
    return jax.random.poisson(key, wide, rates.shape, jnp.int64).astype(rates.dtype)


@lower(aten.binomial.default, random=True)
def binomial(count, prob, generator=None, *, key):
    _require_dtype("binomial_cpu", count.dtype)
    wide = accumulator(count.dtype)
    shape = jnp.broadcast_shapes(count.shape, prob.shape)
    return jax.random.binomial(key, count.astype(wide), prob.astype(wide), shape, wide).astype(count.dtype)


def _require_gamma_dtype(dtype) -> None:
    if dtype not in (jnp.float32, jnp.float64):
        raise NotImplementedError(f"\"gamma_cpu\" not implemented for '{type_name(dtype)}'")


@lower(aten._standard_gamma.default, random=True)
def standard_gamma(alpha, generator=None, *, key):
    _require_gamma_dtype(alpha.dtype)
    return jax.random.gamma(key, alpha, alpha.shape, alpha.dtype)


@lower(aten._sample_dirichlet.default, random=True)
def sample_dirichlet(alpha, generator=None, *, key):
    _require_gamma_dtype(alpha.dtype)
    gammas = jax.random.gamma(key, alpha, alpha.shape, alpha.dtype)
    total = gammas.sum(-1, keepdims=True)
    # torch's guard: a row of all-zero gammas (tiny alphas) divides by the smallest normal
    return gammas / jnp.maximum(total, jnp.finfo(alpha.dtype).tiny)


def _polynomial(coefficients, x):
    """c[0] + x * (c[1] + x * (c[2] + ...)) (Horner)."""
    result = coefficients[-1]
    for c in reversed(coefficients[:-1]):
        result = c + x * result
    return result


_GAMMA_GRAD_UV = np.array(
    [
        [0.16009398, -0.094634809, 0.025146376, -0.0030648343, 1, 0.32668115, 0.10406089, 0.0014179084],
        [
            0.53487893,
            0.1298071,
            0.065735949,
            -0.0015649758,
            0.16639465,
            0.020070113,
            -0.0035938915,
            -0.00058392623,
        ],
        [
            0.040121004,
            -0.0065914022,
            -0.0026286047,
            -0.0013441777,
            0.017050642,
            -0.0021309326,
            0.00085092367,
            -1.5247877e-07,
        ],
    ]
)


@lower(aten._standard_gamma_grad.default)
def standard_gamma_grad(alpha_in, sample):
    """d sample / d alpha for sample ~ Gamma(alpha, 1): torch's three approximations (Taylor
    series for small x, Rice saddle point for large alpha, a rational fit elsewhere), in double."""
    alpha, x = alpha_in.astype(jnp.float64), sample.astype(jnp.float64)
    # Taylor series of the CDF for small x
    numer, denom = jnp.ones_like(x), alpha
    series1, series2 = numer / denom, numer / (denom * denom)
    for i in range(1, 6):
        numer = numer * -x / i
        denom = denom + 1
        series1, series2 = series1 + numer / denom, series2 + numer / (denom * denom)
    pow_x_alpha = x**alpha
    gamma_pdf = x ** (alpha - 1) * jnp.exp(-x)
    gamma_cdf = pow_x_alpha * series1
    gamma_cdf_alpha = (jnp.log(x) - digamma(alpha)) * gamma_cdf - pow_x_alpha * series2
    small = -gamma_cdf_alpha / gamma_pdf
    small = jnp.where(jnp.isnan(small), 0.0, small)
    # Rice saddle point expansion for large alpha
    near_mean = (
        (1 + 24 * alpha * (1 + 12 * alpha))
        * (1440 * alpha**2 + 6 * x * (53 - 120 * x) - 65 * x * x / alpha + alpha * (107 + 3600 * x))
        / (1244160 * alpha**4)
    )
    saddle_denom = jnp.sqrt(8 * alpha)
    term2 = saddle_denom / (alpha - x)
    term3 = (x - alpha - alpha * jnp.log(x / alpha)) ** -1.5
    term23 = jnp.where(x < alpha, term2 - term3, term2 + term3)
    term1 = jnp.log(x / alpha) * term23 - jnp.sqrt(2 / alpha) * (alpha + x) / (alpha - x) ** 2
    stirling = 1 + 1 / (12 * alpha) * (1 + 1 / (24 * alpha))
    saddle = -stirling * x * term1 / saddle_denom
    large = jnp.where((0.9 * alpha <= x) & (x <= 1.1 * alpha), near_mean, saddle)
    # bivariate rational approximation
    u, v = jnp.log(x / alpha), jnp.log(alpha)
    coef = [c0 + u * (c1 + u * c2) for c0, c1, c2 in zip(*_GAMMA_GRAD_UV)]
    rational = jnp.exp(_polynomial(coef[:4], v) / _polynomial(coef[4:], v))
    result = jnp.where(x < 0.8, small, jnp.where(alpha > 8.0, large, rational))
    return result.astype(sample.dtype)


def _beta_grad_alpha_small(x, alpha, beta):
    factor = digamma(alpha) - digamma(alpha + beta) - jnp.log(x)
    numer = jnp.ones_like(x)
    series = numer / alpha * (factor + 1 / alpha)
    for i in range(1, 11):
        numer = numer * (i - beta) * x / i
        denom = alpha + i
        series = series + numer / denom * (factor + 1 / denom)
    result = x * (1 - x) ** -beta * series
    return jnp.where(jnp.isnan(result), 0.0, result)


def _beta_grad_beta_small(x, alpha, beta):
    factor = digamma(alpha + beta) - digamma(beta)
    numer, betas, dbetas = jnp.ones_like(x), jnp.ones_like(x), jnp.zeros_like(x)
    series = factor / alpha
    for i in range(1, 9):
        numer = numer * -x / i
        dbetas = dbetas * (beta - i) + betas
        betas = betas * (beta - i)
        series = series + numer / (alpha + i) * (dbetas + factor * betas)
    result = -((1 - x) ** (1 - beta)) * series
    return jnp.where(jnp.isnan(result), 0.0, result)


def _beta_grad_alpha_mid(x, alpha, beta):
    total = alpha + beta
    mean = alpha / total
    std = jnp.sqrt(alpha * beta / (total + 1)) / total
    poly = 47 * x * beta**4 + alpha * (
        (43 + 20 * (16 + 27 * beta) * x) * beta**3
        + alpha
        * (
            3 * (59 + 180 * beta - 90 * x) * beta**2
            + alpha
            * ((453 + 1620 * beta * (1 - x) - 455 * x) * beta + alpha * (8 * (1 - x) * (135 * beta - 11)))
        )
    )
    prefactor_num = (1 + 12 * alpha) * (1 + 12 * beta) / (total * total)
    prefactor_den = 12960 * alpha**3 * beta**2 * (1 + 12 * total)
    at_mean = prefactor_num / (1 - x) * poly / prefactor_den
    prefactor = -x / jnp.sqrt(2 * alpha * beta / total)
    stirling = (
        (1 + 1 / (12 * alpha) + 1 / (288 * alpha * alpha))
        * (1 + 1 / (12 * beta) + 1 / (288 * beta * beta))
        / (1 + 1 / (12 * total) + 1 / (288 * total * total))
    )
    term1_num = 2 * alpha**2 * (x - 1) + alpha * beta * (x - 1) - x * beta**2
    axbx = alpha * (x - 1) + beta * x
    term1 = term1_num / (jnp.sqrt(2 * alpha / beta) * total**1.5 * axbx * axbx)
    term2 = 0.5 * jnp.log(alpha / (total * x))
    term3 = jnp.sqrt(8 * alpha * beta / total) / (beta * x + alpha * (x - 1))
    term4 = (beta * jnp.log(beta / (total * (1 - x))) + alpha * jnp.log(alpha / (total * x))) ** -1.5
    away = stirling * prefactor * (term1 + term2 * (term3 + jnp.where(x < mean, term4, -term4)))
    return jnp.where((mean - 0.1 * std <= x) & (x <= mean + 0.1 * std), at_mean, away)


_DIRICHLET_GRAD_P = np.array(
    [
        [
            [1.003668233, -0.01061107488, -0.0657888334, 0.01201642863],
            [0.6336835991, -0.3557432599, 0.05486251648, -0.001465281033],
            [-0.03276231906, 0.004474107445, 0.002429354597, -0.0001557569013],
        ],
        [
            [0.221950385, -0.3187676331, 0.01799915743, 0.01074823814],
            [-0.2951249643, 0.06219954479, 0.01535556598, 0.001550077057],
            [0.02155310298, 0.004170831599, 0.001292462449, 6.976601077e-05],
        ],
        [
            [-0.05980841433, 0.008441916499, 0.01085618172, 0.002319392565],
            [0.02911413504, 0.01400243777, -0.002721828457, 0.000751041181],
            [0.005900514878, -0.001936558688, -9.495446725e-06, 5.385558597e-05],
        ],
    ]
)
_DIRICHLET_GRAD_Q = np.array(
    [
        [
            [1, -0.02924021934, -0.04438342661, 0.007285809825],
            [0.6357567472, -0.3473456711, 0.05454656494, -0.002407477521],
            [-0.03301322327, 0.004845219414, 0.00231480583, -0.0002307248149],
        ],
        [
            [0.5925320577, -0.1757678135, 0.01505928619, 0.000564515273],
            [0.1014815858, -0.06589186703, 0.01272886114, -0.0007316646956],
            [-0.007258481865, 0.001096195486, 0.0003934994223, -4.12701925e-05],
        ],
        [
            [0.06469649321, -0.0236701437, 0.002902096474, -5.896963079e-05],
            [0.001925008108, -0.002869809258, 0.0008000589141, -6.063713228e-05],
            [-0.0003477407336, 6.959756487e-05, 1.097287507e-05, -1.650964693e-06],
        ],
    ]
)


@lower(aten._dirichlet_grad.default)
def dirichlet_grad(x_in, alpha_in, total_in):
    """The reparameterized gradient of a Beta(alpha, total - alpha) sample with respect to alpha:
    torch's asymptotic expansions near 0, near 1 and for large parameters, a rational fit
    elsewhere (computed in double)."""
    x, alpha, total = (a.astype(jnp.float64) for a in (x_in, alpha_in, total_in))
    beta = total - alpha
    boundary = total * x * (1 - x)
    u = jnp.log(x)
    a = jnp.log(alpha) - u
    b = jnp.log(total) - a
    p = q = jnp.zeros_like(x)
    for i in range(3):
        for j in range(3):
            ua = u**i * a**j
            p = p + ua * _polynomial(list(_DIRICHLET_GRAD_P[i, j]), b)
            q = q + ua * _polynomial(list(_DIRICHLET_GRAD_Q[i, j]), b)
    rational = p / q * x * (digamma(total) - digamma(alpha)) / beta
    result = jnp.where(
        (x <= 0.5) & (boundary < 2.5),
        _beta_grad_alpha_small(x, alpha, beta),
        jnp.where(
            (x >= 0.5) & (boundary < 0.75),
            -_beta_grad_beta_small(1 - x, beta, alpha),
            jnp.where((alpha > 6) & (beta > 6), _beta_grad_alpha_mid(x, alpha, beta), rational),
        ),
    )
    return result.astype(x_in.dtype)


def _check_multinomial(probs, num_samples, replacement, generator=None) -> None:
    if probs.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not _is_floating(probs.dtype):
        raise RuntimeError(
            f"multinomial only supports floating-point dtypes for input, got: {type_name(probs.dtype)}"
        )
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > probs.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if probs.shape[-1] > 2**24:
        raise RuntimeError("number of categories cannot exceed 2^24")
    check_values(
        _valid_probabilities,
        [probs],
        lambda: RuntimeError("probability tensor contains either `inf`, `nan` or element < 0"),
    )
    check_values(
        _positive_sums,
        [probs],
        lambda: RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)"),
    )


@jax.jit
def _valid_probabilities(probs):
    wide = probs.astype(accumulator(probs.dtype))
    return jnp.all(jnp.isfinite(wide) & (wide >= 0))


@jax.jit
def _positive_sums(probs):
    return jnp.all(probs.astype(accumulator(probs.dtype)).sum(-1) > 0)


@lower(
    aten.multinomial.default,
    random=True,
    check=_check_multinomial,
    out_dtype=OutDtype(
        lambda *_: torch.int64,
        lambda want, got: f"multinomial expects Long tensor out, got: {type_name(got)}",
    ),
)
def multinomial(probs, num_samples, replacement=False, generator=None, *, key):
    logits = jnp.log(probs.astype(accumulator(probs.dtype)))
    if replacement:
        draws = jax.random.categorical(key, logits, shape=(num_samples,) + logits.shape[:-1])
        return jnp.moveaxis(draws, 0, -1).astype(jnp.int64)
    # Gumbel top-k: the k largest perturbed logits are k draws without replacement
    perturbed = logits + jax.random.gumbel(key, logits.shape, logits.dtype)
    return jax.lax.top_k(perturbed, num_samples)[1].astype(jnp.int64)


# ----------------------------------------------------------------------------- factories
@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _draw(sampler, key, shape, dtype, *params):
    """One compiled sampler per (sampler, shape, dtype); parameters stay dynamic."""
    return sampler(key_of(key), tuple(shape), dtype, *params)


def _lower_overloads(general, *narrower, missing: dict, **options):
    """Register ``fn`` for ``general`` and for overloads that lack some of its arguments
    (``rand`` vs ``rand.generator``), those filled in from ``missing``."""
    names = [a.name for a in general._schema.arguments]

    def adapt(fn, op):
        own = [a.name for a in op._schema.arguments]

        def adapted(*args, key):
            given = dict(zip(own, args))
            return fn(*(given[n] if n in given else missing[n] for n in names), key=key)

        return adapted

    def register(fn):
        lower(general, random=True, **options)(fn)
        for op in narrower:
            lower(op, random=True, **options)(adapt(fn, op))
        return fn

    return register


def _factory_dtype(dtype, kernel: str) -> np.dtype:
    """The default dtype is a global, so float factories resolve it outside any trace."""
    dtype = _float_or_default(dtype)
    _require_dtype(kernel, dtype, complex_=True)
    return dtype


_NO_GENERATOR = {"generator": None}


def _drawn(sampler, key, size, dtype, *params):
    """A random factory's draw (``params``: the sampler's runtime arguments); padded to its
    buckets where the user's line has made tensors whose first dim changed
    (``padding.learned_layout``) and no other did: the logical elements are then the unpadded
    draw's (:data:`~torch_tpu.ops.padding.DRAWN`)."""
    layout = padding_state.learned_layout("random", size, dtype)
    if layout is None or not leading_only(layout):
        return _draw(sampler, key, size, dtype, *params)
    return padding_state.made(Padded(_draw(sampler, key, layout.padded_shape, dtype, *params), layout))


@_lower_overloads(aten.rand.generator, aten.rand.default, missing=_NO_GENERATOR, runs=Runs.EAGER)
def rand(size, generator=None, dtype=None, layout=None, device=None, pin_memory=None, *, key):
    return _drawn(_uniform, key, size, _factory_dtype(dtype, "check_uniform_bounds"))


@_lower_overloads(aten.randn.generator, aten.randn.default, missing=_NO_GENERATOR, runs=Runs.EAGER)
def randn(size, generator=None, dtype=None, layout=None, device=None, pin_memory=None, *, key):
    return _drawn(_normal, key, size, _factory_dtype(dtype, "normal_kernel_cpu"))


@lower(aten.normal.float_float, random=True, runs=Runs.EAGER)
def normal_float_float(
    mean, std, size, generator=None, dtype=None, layout=None, device=None, pin_memory=None, *, key
):
    _check_std(std)
    return _draw(_normal, key, size, _factory_dtype(dtype, "normal_kernel_cpu"), mean, std)


_INT64 = np.dtype(jnp.int64)


@_lower_overloads(
    aten.randint.low_generator,
    aten.randint.low,
    aten.randint.generator,
    aten.randint.default,
    missing={"low": 0, "generator": None},
    runs=Runs.EAGER,
)
def randint(low, high, size, generator=None, dtype=_INT64, layout=None, device=None, pin_memory=None, *, key):
    """Its bounds are the program's arguments: ``randint(0, n, shape)`` for each new ``n`` (a
    test's indices into each size) draws with one program per shape."""
    dtype = _INT64 if dtype is None else dtype
    low, high = _integer_bounds(dtype, low, high)  # (PyTorch's parser refuses a bound past int64)
    return _drawn(_integers_between, key, size, dtype, np.int64(low), np.int64(high))


@_lower_overloads(aten.randperm.generator, aten.randperm.default, missing=_NO_GENERATOR)
def randperm(n, generator=None, dtype=_INT64, layout=None, device=None, pin_memory=None, *, key):
    if n < 0:
        raise RuntimeError(f"Trying to create tensor with negative dimension {n}: [{n}]")
    return jax.random.permutation(key, n).astype(_INT64 if dtype is None else dtype)


_factory_out(aten.randperm.generator_out, aten.randperm.generator)


@_lower_overloads(aten.rand_like.generator, aten.rand_like.default, missing=_NO_GENERATOR, layout=Layout.LIKE)
def rand_like(
    x, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, *, key
):
    dtype = x.dtype if dtype is None else dtype
    _require_dtype("check_uniform_bounds", dtype, complex_=True)
    return _uniform(key, x.shape, dtype)


@_lower_overloads(
    aten.randn_like.generator, aten.randn_like.default, missing=_NO_GENERATOR, layout=Layout.LIKE
)
def randn_like(
    x, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, *, key
):
    dtype = x.dtype if dtype is None else dtype
    _require_dtype("normal_kernel_cpu", dtype, complex_=True)
    return _normal(key, x.shape, dtype)


@_lower_overloads(
    aten.randint_like.low_generator_dtype,
    aten.randint_like.low_dtype,
    aten.randint_like.generator,
    aten.randint_like.default,
    missing={"low": 0, "generator": None},
    layout=Layout.LIKE,
)
def randint_like(
    x,
    low,
    high,
    generator=None,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    memory_format=None,
    *,
    key,
):
    return _random_integers(key, x.shape, x.dtype if dtype is None else dtype, low, high)


def _check_scalar_high(x, high, *rest) -> None:
    """PyTorch reads ``high`` on the host: a 0-dim CPU tensor (the dispatcher hands its value
    over as a number), never a device tensor (an array here)."""
    if not isinstance(high, (bool, int, float)):
        raise RuntimeError("high must be a scalar tensor and on CPU")


@_lower_overloads(
    aten.randint_like.Tensor_generator,
    aten.randint_like.Tensor,
    missing=_NO_GENERATOR,
    check=_check_scalar_high,
    layout=Layout.LIKE,
)
def randint_like_tensor(
    x, high, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, *, key
):
    """``high`` is a tensor here, so its bounds are the sampler's, not checked up front."""
    dtype = x.dtype if dtype is None else dtype
    _require_dtype("random_from_to_kernel_cpu", dtype, integral=True, boolean=True)
    return _integers(key, x.shape, 0, jnp.asarray(high).astype(jnp.int64)).astype(dtype)
