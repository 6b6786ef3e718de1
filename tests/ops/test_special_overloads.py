"""torch.special overloads and edge values the OpInfo samples do not reach (Scalar forms,
poles, infinities, NaN, the polynomials' closed forms and boundaries), each compared with
PyTorch CPU on the same call."""

from __future__ import annotations

import itertools

import pytest
import torch

import torch_tpu  # noqa: F401

aten = torch.ops.aten
INF, NAN = float("inf"), float("nan")

#: Values crossing every branch of the Cephes kernels: 0 and -0, the series/asymptotic cut
#: points (2, 5, 8, +-2.09), huge arguments, infinities and NaN.
EDGES = [
    0.0,
    -0.0,
    1e-6,
    0.3,
    -0.3,
    1.0,
    -1.0,
    2.0,
    2.1,
    -2.5,
    4.9,
    5.0,
    5.1,
    -5.5,
    7.9,
    8.0,
    8.1,
    20.0,
    -40.0,
    90.0,
    700.0,
    INF,
    -INF,
    NAN,
]

UNARY = [
    "i0",
    "special_i0e",
    "special_i1",
    "special_i1e",
    "special_ndtri",
    "special_log_ndtr",
    "special_erfcx",
    "special_entr",
    "special_bessel_j0",
    "special_bessel_j1",
    "special_bessel_y0",
    "special_bessel_y1",
    "special_modified_bessel_i0",
    "special_modified_bessel_i1",
    "special_modified_bessel_k0",
    "special_modified_bessel_k1",
    "special_scaled_modified_bessel_k0",
    "special_scaled_modified_bessel_k1",
    "special_spherical_bessel_j0",
    "special_airy_ai",
]

POLYNOMIALS = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]

# x at the boundaries (+-1; 0 and 1 for the shifted kinds), inside and outside [-1, 1];
# n negative, small (recurrence), large (closed forms), past Hermite's degree limit, non-finite
_POLY_X = [0.0, 1.0, -1.0, 0.25, 0.75, -0.6, 1.5, -2.0]
_POLY_N = [-1.0, 0.0, 1.0, 2.0, 5.0, 7.0, 9.0, 12.0, 200.0, INF, NAN]
POLY_X, POLY_N = (torch.tensor(v) for v in zip(*itertools.product(_POLY_X, _POLY_N)))

# (self, other) pairs over poles, negative and non-integer arguments, infinities and NaN
_PAIR_VALUES = [0.0, 0.5, 1.0, 2.0, 2.5, -2.0, -2.5, 30.0, INF, NAN]
PAIR_A, PAIR_B = (torch.tensor(v) for v in zip(*itertools.product(_PAIR_VALUES, _PAIR_VALUES)))


def _check(build, dtype):
    expected = build("cpu", dtype)
    actual = build("tpu", dtype).cpu()
    # the default float32 atol (1e-5) also covers XLA flushing subnormal results to zero (K0
    # and K1 past x ~ 88) and float32 phase rounding in Ai's oscillating tail (x = -40)
    torch.testing.assert_close(actual, expected, equal_nan=True)


@pytest.mark.parametrize("name", UNARY)
def test_unary_edges_match_cpu(name):
    op = getattr(aten, name).default
    _check(lambda d, t: op(torch.tensor(EDGES, dtype=t, device=d)), torch.float32)


@pytest.mark.parametrize("name", ["special_zeta", "igamma", "igammac", "special_xlog1py"])
def test_binary_edges_match_cpu(name):
    _check(lambda d, t: getattr(aten, name).default(PAIR_A.to(d, t), PAIR_B.to(d, t)), torch.float64)


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_polygamma_poles_match_cpu(n):
    _check(lambda d, t: aten.polygamma.default(n, torch.tensor(EDGES, dtype=t, device=d)), torch.float64)


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_boundaries_match_cpu(name):
    _check(
        lambda d, t: getattr(aten, f"special_{name}").default(POLY_X.to(d, t), POLY_N.to(d, t)), torch.float64
    )


# The Scalar overloads are CompositeExplicitAutograd (they wrap the Scalar and call the Tensor
# overload): these check that path end to end, with ints, floats and a float64 tensor, on one
# polynomial of each recurrence (the wrapping is the same for all twelve).
_SCALAR_POLYNOMIALS = [
    "chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]
SCALAR_CASES = {
    "special_xlog1py.self_scalar": lambda d: aten.special_xlog1py.self_scalar(2, POLY_X.to(d)),
    "special_xlog1py.other_scalar": lambda d: aten.special_xlog1py.other_scalar(POLY_X.to(d), 0.5),
    "special_zeta.self_scalar": lambda d: aten.special_zeta.self_scalar(3.0, PAIR_B.double().to(d)),
    "special_zeta.other_scalar": lambda d: aten.special_zeta.other_scalar(PAIR_A.to(d), 2),
    **{
        f"special_{name}.x_scalar": (
            lambda name: lambda d: getattr(aten, f"special_{name}").x_scalar(0.4, POLY_N.to(d))
        )(name)
        for name in _SCALAR_POLYNOMIALS
    },
    **{
        f"special_{name}.n_scalar": (
            lambda name: lambda d: getattr(aten, f"special_{name}").n_scalar(POLY_X.double().to(d), 6)
        )(name)
        for name in _SCALAR_POLYNOMIALS
    },
}


@pytest.mark.parametrize("name", list(SCALAR_CASES))
def test_scalar_overload_matches_cpu(name):
    expected = SCALAR_CASES[name]("cpu")
    actual = SCALAR_CASES[name]("tpu")
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)


def test_integer_inputs_promote_like_cpu():
    ints = torch.tensor([0, 1, 3])
    torch.testing.assert_close(aten.i0.default(ints.to("tpu")).cpu(), aten.i0.default(ints))
    legendre = aten.special_legendre_polynomial_p.default
    torch.testing.assert_close(legendre(ints.to("tpu"), ints.to("tpu")).cpu(), legendre(ints, ints))


def test_unsupported_dtypes_raise_like_cpu():
    half = torch.tensor([0.5], dtype=torch.float16)
    ints = torch.tensor([1, 2])
    for op, args in [
        (aten.special_ndtri.default, (half,)),
        (aten.igamma.default, (ints, ints)),
        (aten.special_zeta.default, (half, half)),
    ]:
        with pytest.raises(NotImplementedError):
            op(*args)
        with pytest.raises(NotImplementedError):
            op(*[a.to("tpu") for a in args])
    with pytest.raises(RuntimeError):
        aten.polygamma.default(-1, torch.tensor([1.0], device="tpu"))
