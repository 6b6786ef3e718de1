"""Linear-algebra and FFT overloads the OpInfo samples do not reach (integer products, LAPACK
driver variants, 2x2 Bunch-Kaufman pivots, frequency grids, error paths), each compared with
PyTorch CPU on the same call."""

from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401

from .cases import assert_build_matches_cpu, assert_gradient_matches_cpu, seeded

aten = torch.ops.aten


_x = seeded


def _int8(*shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-100, 100, shape, generator=generator, dtype=torch.int8)


def _symmetric(n, dtype=torch.float32, hermitian=False, seed=0):
    a = _x(n, n, dtype=dtype, seed=seed)
    return a + (a.mH if hermitian else a.mT)


def _ldl_solve(d, dtype, hermitian):
    """Seed 2 pivots with 2x2 blocks for every dtype/hermitian pair used below."""
    factors = torch.linalg.ldl_factor(_symmetric(6, dtype, hermitian, seed=2).to(d), hermitian=hermitian)
    return torch.linalg.ldl_solve(*factors, _x(6, 2, dtype=dtype, seed=4).to(d), hermitian=hermitian)


def _check_ldl_pivots_2x2():
    for dtype in (torch.float32, torch.complex64):
        for hermitian in (False, True):
            _, pivots = torch.linalg.ldl_factor(_symmetric(6, dtype, hermitian, seed=2), hermitian=hermitian)
            assert (pivots < 0).any(), (dtype, hermitian)


CASES = {
    "_int_mm": lambda d: aten._int_mm.default(_int8(17, 24).to(d), _int8(24, 16, seed=1).to(d)),
    "_compute_linear_combination": lambda d: aten._compute_linear_combination.default(
        _x(3, 2, 4).to(d), _x(5, 3, seed=1).to(d)
    ),
    "_euclidean_dist": lambda d: aten._euclidean_dist.default(_x(2, 4, 3).to(d), _x(2, 5, 3, seed=1).to(d)),
    "cdist matrix-product form": lambda d: torch.cdist(_x(30, 3).to(d), _x(7, 3, seed=1).to(d)),
    "cdist compute_mode 2": lambda d: torch.cdist(
        _x(30, 3).to(d), _x(7, 3, seed=1).to(d), compute_mode="donot_use_mm_for_euclid_dist"
    ),
    "fft_fftfreq": lambda d: torch.fft.fftfreq(7, 0.3, device=d),
    "fft_fftfreq even float64": lambda d: torch.fft.fftfreq(8, dtype=torch.float64, device=d),
    "fft_rfftfreq": lambda d: torch.fft.rfftfreq(9, 2.0, device=d),
    "lstsq gels": lambda d: torch.linalg.lstsq(_x(6, 3).to(d), _x(6, 2, seed=1).to(d), driver="gels"),
    "lstsq gelss vector": lambda d: torch.linalg.lstsq(_x(6, 3).to(d), _x(6, seed=1).to(d), driver="gelss"),
    "lstsq gelsd batched": lambda d: torch.linalg.lstsq(
        _x(2, 6, 3).to(d), _x(1, 6, 2, seed=1).to(d), driver="gelsd"
    ),
    "ldl_solve 2x2 pivots float32": lambda d: _ldl_solve(d, torch.float32, False),
    "ldl_solve 2x2 pivots complex64": lambda d: _ldl_solve(d, torch.complex64, False),
    "ldl_solve 2x2 pivots hermitian": lambda d: _ldl_solve(d, torch.complex64, True),
    "ldl_factor_ex singular": lambda d: torch.linalg.ldl_factor_ex(torch.zeros(2, 3, 3).to(d)),
    "renorm float16": lambda d: torch.renorm(_x(3, 4, dtype=torch.float16).to(d), 3, 1, 0.5),
    "renorm inf": lambda d: torch.renorm(_x(3, 4).to(d), float("inf"), 0, 0.5),
    "ormqr right transpose": lambda d: torch.ormqr(
        *torch.geqrf(_x(5, 3).to(d)), _x(4, 5, seed=1).to(d), left=False, transpose=True
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_overload_matches_cpu(name):
    assert_build_matches_cpu(CASES[name])


def test_ldl_cases_pivot_2x2_blocks():
    _check_ldl_pivots_2x2()


GRADIENT_CASES = {
    "_euclidean_dist backward": lambda x: torch.cdist(x, x[:7] * 0.5),
    "_cdist_backward p=0.5": lambda x: torch.cdist(x[:5], x[5:9] + 1, p=0.5),
    "_cdist_backward p=3 batched": lambda x: torch.cdist(x[:6].reshape(2, 3, 3), x[6:9], p=3),
    "_cdist_backward p=inf": lambda x: torch.cdist(x[:5], x[5:9], p=float("inf")),
    "_pdist_backward p=1": lambda x: torch.pdist(x[:6], p=1),
    "_pdist_backward p=1.5": lambda x: torch.pdist(x[:6], p=1.5),
}


@pytest.mark.parametrize("name", list(GRADIENT_CASES))
def test_backward_overload_matches_cpu(name):
    fn = GRADIENT_CASES[name]
    x = _x(30, 3)
    assert_gradient_matches_cpu(fn, x)


ERROR_CASES = {
    "cholesky not positive-definite": lambda d: torch.cholesky(-torch.eye(3).to(d)),
    "ldl_factor_ex check_errors": lambda d: torch.linalg.ldl_factor_ex(
        torch.zeros(3, 3).to(d), check_errors=True
    ),
    "linalg_lu without pivoting": lambda d: torch.linalg.lu(_x(3, 3).to(d), pivot=False),
    "_linalg_check_errors": lambda d: torch.linalg.inv(torch.zeros(2, 3, 3).to(d)),
    "cdist negative p": lambda d: torch.cdist(_x(3, 2).to(d), _x(3, 2).to(d), p=-1),
    "renorm non-positive p": lambda d: torch.renorm(_x(3, 2).to(d), 0, 0, 1.0),
    "lstsq 1-d input": lambda d: torch.linalg.lstsq(_x(3).to(d), _x(3).to(d)),
    "lstsq 0-d other": lambda d: torch.linalg.lstsq(_x(3, 3).to(d), torch.ones(()).to(d)),
    "lstsq other's dtype": lambda d: torch.linalg.lstsq(_x(3, 3).to(d), _x(3).double().to(d)),
    "lstsq other's rank": lambda d: torch.linalg.lstsq(_x(3, 3).to(d), _x(2, 3, 3, 1).to(d)),
    "lstsq vector size": lambda d: torch.linalg.lstsq(_x(3, 3).to(d), _x(2).to(d)),
    "lstsq matrix size": lambda d: torch.linalg.lstsq(_x(3, 2).to(d), _x(2, 3).to(d)),
    "lstsq integers": lambda d: torch.linalg.lstsq(
        torch.eye(2, dtype=torch.int32).to(d), torch.ones(2, 2).int().to(d)
    ),
}


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_error_matches_cpu(name):
    build = ERROR_CASES[name]
    with pytest.raises(Exception) as expected:
        build("cpu")
    with pytest.raises(type(expected.value)) as actual:
        build("tpu")
    assert str(actual.value).split("\n")[0] == str(expected.value).split("\n")[0]


def test_baddbmm_into_batches_sharing_memory_accumulates_as_on_cpu():
    """CPU's baddbmm_ updates ``self`` batch after batch: an expanded batch dimension sees the
    batches before it (no overlap error). A matrix overlapping itself stays refused."""
    a = torch.arange(18.0).reshape(2, 3, 3)
    b = torch.arange(18.0).reshape(2, 3, 3) / 10
    for beta in (0.5, 0):
        expected = torch.ones(1, 3, 3).expand(2, 3, 3).baddbmm_(a, b, beta=beta, alpha=2)
        actual = (
            torch.ones(1, 3, 3, device="tpu")
            .expand(2, 3, 3)
            .baddbmm_(a.to("tpu"), b.to("tpu"), beta=beta, alpha=2)
        )
        torch.testing.assert_close(actual.cpu(), expected)
    with pytest.raises(RuntimeError, match="Bad in-place call: input tensor size \\[1, 3, 3\\]"):
        torch.ones(1, 3, 3, device="tpu").baddbmm_(a.to("tpu"), b.to("tpu"))
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        torch.ones(2, 3, 1, device="tpu").expand(2, 3, 3).baddbmm_(a.to("tpu"), b.to("tpu"))


def test_addbmm_into_an_expanded_tensor_is_refused_as_on_cpu():
    ones = torch.ones(2, 3, 3, device="tpu")
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        torch.zeros(3, 1, device="tpu").expand(3, 3).addbmm_(ones, ones)


def test_resize_to_the_same_size_keeps_the_strides():
    for device in ("cpu", "tpu"):
        expanded = torch.zeros(3, 1, device=device).expand(3, 3)
        assert expanded.resize_(3, 3).stride() == (1, 0)
        nchw = torch.zeros(2, 3, device=device)
        assert nchw.resize_(4, 3, 2, 2, memory_format=torch.channels_last).stride() == (12, 1, 6, 3)
        with pytest.raises(RuntimeError, match="Unsupported memory format"):
            nchw.resize_(1, memory_format=torch.preserve_format)
