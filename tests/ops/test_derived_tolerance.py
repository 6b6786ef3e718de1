"""The OpInfo harness's tolerance, derived from a float64 reference, lets rounding-level
differences through and still catches wrong results: checked on addbmm, a float32 op whose sums
round differently in every summation order, and on a sum whose cancellation makes CPU's own
result far from exact (the derived tolerance at its cap)."""

from __future__ import annotations

import pytest
import torch

from torch_tpu.testing.reference import FACTOR, MAX_SCALE, cpu_error, derived_tolerance, widened

from .cases import seeded
from .test_opinfo import _compare


def _addbmm_inputs():
    """8 batches of 5x64 @ 64x5: sums of 512 products up to ~30."""
    return [seeded(5, 5, seed=0), seeded(8, 5, 64, seed=1) * 3, seeded(8, 64, 5, seed=2) * 3]


def _addbmm():
    """CPU's addbmm, its float64 reference and the same sum in another order."""
    inputs = _addbmm_inputs()
    expected = torch.addbmm(*inputs)
    reordered = inputs[0] + (inputs[1] @ inputs[2]).flip(0).sum(0)
    return expected, torch.addbmm(*map(widened, inputs)), reordered


def _cancelling_sum():
    """Row sums of large terms that nearly cancel: CPU's float32 result is many plain
    tolerances from the float64 one, so the derived tolerance reaches its cap."""
    big = seeded(16, 256, seed=3) * 1e4
    x = torch.cat([big, -big + seeded(16, 256, seed=4) * 10], dim=1)
    return x.sum(1), widened(x).sum(1)


def _check(actual, expected, reference):
    _compare(actual, expected, "addbmm", torch.float32, "derived tolerance", reference=reference)


def test_rounding_level_differences_pass():
    expected, reference, reordered = _addbmm()
    _check(reordered, expected, reference)  # another summation order
    _check(reference.float(), expected, reference)  # the correctly rounded result
    _check(torch.addbmm(*[t.to("tpu") for t in _addbmm_inputs()]), expected, reference)


@pytest.mark.parametrize("case", [_addbmm, _cancelling_sum])
def test_a_relative_error_of_1e_3_fails(case):
    expected, reference, *_ = case()
    wrong = expected.clone()
    wrong[expected.abs() > 2] *= 1 + 1e-3  # above |x| ~ 1.15, 1e-3 relative is past even the cap
    with pytest.raises(AssertionError):
        _check(wrong, expected, reference)
    wrong = expected.clone()
    wrong.view(-1)[wrong.abs().view(-1).argmax()] *= 1 + 1e-3  # a single element
    with pytest.raises(AssertionError):
        _check(wrong, expected, reference)


def test_the_allowance_is_cpus_error_up_to_a_cap():
    expected, reference, _ = _addbmm()
    error, _ = cpu_error(expected, reference)
    assert derived_tolerance(expected, reference) == pytest.approx(
        {"atol": 1e-5 + FACTOR * error, "rtol": 1.3e-6}
    )
    expected, reference = _cancelling_sum()  # CPU's error is rounding of terms of size 1e4
    error, magnitude = cpu_error(expected, reference)
    cap = MAX_SCALE * (1e-5 + 1.3e-6 * magnitude)
    assert FACTOR * error > cap
    assert derived_tolerance(expected, reference) == pytest.approx({"atol": 1e-5 + cap, "rtol": 1.3e-6})
    exact = torch.tensor([1.0, 2.0])  # CPU exact: the plain tolerance
    assert derived_tolerance(exact, widened(exact)) == pytest.approx({"atol": 1e-5, "rtol": 1.3e-6})
