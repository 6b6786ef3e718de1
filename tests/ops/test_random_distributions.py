"""The tpu samplers draw from the right distributions (mean, variance and support on 2*10^4
samples, with loose bounds and a fixed seed, so the checks cannot flake), are reproducible under
``torch.manual_seed``, and give fresh values on every call."""

from __future__ import annotations

import math

import pytest
import torch

import torch_tpu  # noqa: F401

N = 20_000


def _sample(fill, dtype=torch.float32, n=N):
    return fill(torch.empty(n, dtype=dtype, device="tpu")).cpu().double()


def _check_moments(values: torch.Tensor, mean: float, variance: float) -> None:
    """Sample mean within 6 standard errors, sample variance within 8% of the truth."""
    n = values.numel()
    assert abs(values.mean().item() - mean) < 6 * math.sqrt(variance / n), values.mean()
    assert abs(values.var().item() - variance) < 0.08 * variance, values.var()


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(1234)


# name -> (draw on the tpu, mean, variance, lowest allowed value, highest allowed value)
FILLS = {
    "uniform_": (lambda: _sample(lambda t: t.uniform_(-2, 3)), 0.5, 25 / 12, -2, 3),
    "uniform_ bfloat16": (lambda: _sample(lambda t: t.uniform_(), torch.bfloat16), 0.5, 1 / 12, 0, 1),
    "normal_": (lambda: _sample(lambda t: t.normal_(1.5, 2.0)), 1.5, 4.0, -math.inf, math.inf),
    "normal_ float16": (lambda: _sample(lambda t: t.normal_(), torch.float16), 0, 1, -math.inf, math.inf),
    "exponential_": (lambda: _sample(lambda t: t.exponential_(4.0)), 0.25, 1 / 16, 0, math.inf),
    "geometric_": (lambda: _sample(lambda t: t.geometric_(0.3)), 1 / 0.3, 0.7 / 0.09, 1, math.inf),
    "geometric_ int64": (lambda: _sample(lambda t: t.geometric_(0.5), torch.int64), 2, 2, 1, math.inf),
    "log_normal_ (log)": (
        lambda: _sample(lambda t: t.log_normal_(0.5, 0.25)).log(),
        0.5,
        1 / 16,
        -math.inf,
        math.inf,
    ),
    "random_ from/to": (lambda: _sample(lambda t: t.random_(-3, 5), torch.int32), 0.5, 63 / 12, -3, 4),
    "random_ to": (lambda: _sample(lambda t: t.random_(10)), 4.5, 99 / 12, 0, 9),
    "random_ uint8": (lambda: _sample(lambda t: t.random_(), torch.uint8), 127.5, (256**2 - 1) / 12, 0, 255),
    "random_ bool": (lambda: _sample(lambda t: t.random_(), torch.bool), 0.5, 0.25, 0, 1),
    "bernoulli_": (lambda: _sample(lambda t: t.bernoulli_(0.2)), 0.2, 0.16, 0, 1),
    "bernoulli_ int8": (lambda: _sample(lambda t: t.bernoulli_(0.7), torch.int8), 0.7, 0.21, 0, 1),
    "bernoulli": (
        lambda: torch.bernoulli(torch.full((N,), 0.4, device="tpu")).cpu().double(),
        0.4,
        0.24,
        0,
        1,
    ),
    "rand": (lambda: torch.rand(N, device="tpu").cpu().double(), 0.5, 1 / 12, 0, 1),
    "randn": (lambda: torch.randn(N, device="tpu", dtype=torch.float64).cpu(), 0, 1, -math.inf, math.inf),
    "randint": (lambda: torch.randint(2, 12, (N,), device="tpu").cpu().double(), 6.5, 99 / 12, 2, 11),
    "rand_like": (lambda: torch.rand_like(torch.empty(N, device="tpu")).cpu().double(), 0.5, 1 / 12, 0, 1),
    "randn_like": (
        lambda: torch.randn_like(torch.empty(N, device="tpu")).cpu().double(),
        0,
        1,
        -math.inf,
        math.inf,
    ),
    "randint_like": (
        lambda: torch.randint_like(torch.empty(N, device="tpu"), 4).cpu().double(),
        1.5,
        15 / 12,
        0,
        3,
    ),
    "normal.float_float": (
        lambda: torch.normal(-1.0, 0.5, (N,), device="tpu").cpu().double(),
        -1,
        0.25,
        -math.inf,
        math.inf,
    ),
    "normal.Tensor_Tensor": (
        lambda: (
            torch.normal(torch.full((N,), 3.0, device="tpu"), torch.full((N,), 2.0, device="tpu"))
            .cpu()
            .double()
        ),
        3,
        4,
        -math.inf,
        math.inf,
    ),
    "poisson small rate": (
        lambda: torch.poisson(torch.full((N,), 2.5, device="tpu")).cpu().double(),
        2.5,
        2.5,
        0,
        math.inf,
    ),
    "poisson large rate": (
        lambda: torch.poisson(torch.full((N,), 400.0, device="tpu")).cpu().double(),
        400,
        400,
        0,
        math.inf,
    ),
    "binomial": (
        lambda: (
            torch.binomial(torch.full((N,), 20.0, device="tpu"), torch.full((N,), 0.3, device="tpu"))
            .cpu()
            .double()
        ),
        6,
        4.2,
        0,
        20,
    ),
    "_standard_gamma": (
        lambda: torch._standard_gamma(torch.full((N,), 3.0, device="tpu")).cpu().double(),
        3,
        3,
        0,
        math.inf,
    ),
    "_standard_gamma small alpha": (
        lambda: torch._standard_gamma(torch.full((N,), 0.5, device="tpu")).cpu().double(),
        0.5,
        0.5,
        0,
        math.inf,
    ),
}


@pytest.mark.parametrize("name", list(FILLS))
def test_moments_and_support(name):
    draw, mean, variance, low, high = FILLS[name]
    values = draw()
    assert values.numel() == N
    assert bool(((values >= low) & (values <= high)).all()), name
    if name.startswith(("random_", "randint", "bernoulli")):
        # uniform integers and coin flips: both ends of the support are drawn
        assert values.min().item() == low and values.max().item() == high
    _check_moments(values, mean, variance)


def test_complex_fills_draw_parts_independently():
    uniform = torch.empty(N, dtype=torch.complex64, device="tpu").uniform_(1, 2).cpu()
    normal = torch.empty(N, dtype=torch.complex64, device="tpu").normal_(0, 2).cpu()
    for part in (uniform.real, uniform.imag):
        _check_moments(part.double(), 1.5, 1 / 12)
    for part in (normal.real, normal.imag):  # the variance splits between the two parts
        _check_moments(part.double(), 0, 2.0)
    assert abs(torch.corrcoef(torch.stack([uniform.real, uniform.imag]))[0, 1]) < 0.05


def test_cauchy_quartiles():
    values = _sample(lambda t: t.cauchy_(2.0, 0.5))
    quartiles = values.quantile(torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    torch.testing.assert_close(
        quartiles, torch.tensor([1.5, 2.0, 2.5], dtype=torch.float64), atol=0.05, rtol=0
    )


def test_bernoulli_tensor_probabilities():
    p = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0], device="tpu")
    draws = torch.empty(N // 5, 5, device="tpu").bernoulli_(p).cpu().double()
    torch.testing.assert_close(draws.mean(0), p.cpu().double(), atol=0.03, rtol=0)


def test_multinomial_with_replacement_follows_probabilities():
    probs = torch.tensor([[1.0, 0.0, 3.0, 6.0], [5.0, 5.0, 0.0, 0.0]], device="tpu")
    draws = torch.multinomial(probs, N, replacement=True).cpu()
    assert draws.shape == (2, N) and draws.dtype == torch.int64
    frequencies = torch.stack([torch.bincount(row, minlength=4) for row in draws]).double() / N
    torch.testing.assert_close(
        frequencies, (probs / probs.sum(1, keepdim=True)).cpu().double(), atol=0.015, rtol=0
    )


def test_multinomial_without_replacement():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.2], device="tpu").expand(N // 4, 4)
    draws = torch.multinomial(probs, 3).cpu()
    assert draws.shape == (N // 4, 3)
    assert (draws.sort(1).values == torch.tensor([0, 2, 3])).all()  # distinct, never the 0-prob one
    first = torch.bincount(draws[:, 0], minlength=4).double() / draws.shape[0]
    torch.testing.assert_close(
        first, torch.tensor([0.5, 0.0, 0.3, 0.2], dtype=torch.float64), atol=0.03, rtol=0
    )


def test_randperm_is_a_permutation():
    perm = torch.randperm(1000, device="tpu").cpu()
    assert torch.equal(perm.sort().values, torch.arange(1000))
    assert not torch.equal(perm, torch.arange(1000))


def test_dirichlet_rows_sum_to_one_with_the_right_means():
    alpha = torch.tensor([1.0, 2.0, 7.0], device="tpu").expand(N // 2, 3)
    samples = torch._sample_dirichlet(alpha).cpu().double()
    assert bool((samples >= 0).all())
    torch.testing.assert_close(samples.sum(1), torch.ones(N // 2, dtype=torch.float64))
    torch.testing.assert_close(
        samples.mean(0), torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64), atol=0.01, rtol=0
    )


def test_fills_write_through_views():
    base = torch.zeros(4, 6, device="tpu")
    base[:, 1::2].uniform_(5, 6)
    base.t()[2].exponential_()
    host = base.cpu()
    assert bool(((host[:, 1::2] >= 5) & (host[:, 1::2] < 6)).all())
    assert bool((host[:, 2] > 0).all())
    assert bool((host[:, [0, 4]] == 0).all())  # untouched by either fill


SAMPLERS = {
    "uniform_": lambda: torch.empty(64, device="tpu").uniform_(),
    "normal_": lambda: torch.empty(64, device="tpu").normal_(),
    "cauchy_": lambda: torch.empty(64, device="tpu").cauchy_(),
    "random_": lambda: torch.empty(64, device="tpu").random_(1000),
    "rand": lambda: torch.rand(64, device="tpu"),
    "randint": lambda: torch.randint(1000, (64,), device="tpu"),
    "randperm": lambda: torch.randperm(64, device="tpu"),
    "multinomial": lambda: torch.multinomial(torch.ones(64, device="tpu"), 64),
    "poisson": lambda: torch.poisson(torch.full((64,), 50.0, device="tpu")),
}


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_reproducible_under_manual_seed_and_fresh_per_call(name):
    draw = SAMPLERS[name]
    torch.manual_seed(7)
    first, second = draw().cpu(), draw().cpu()
    torch.manual_seed(7)
    assert torch.equal(draw().cpu(), first)
    assert torch.equal(draw().cpu(), second)
    assert not torch.equal(first, second)
