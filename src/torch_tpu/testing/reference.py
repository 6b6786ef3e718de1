"""Tolerances derived from a float64 reference, not from one machine's rounding.

tpu and PyTorch CPU round differently (another summation order, another approximation of a
transcendental, float32 accumulation of a half-precision op), so their results differ by
rounding noise whose size depends on the op, its inputs and the machine. A fixed tolerance is
either too loose to catch bugs or a knife edge that a new machine falls off. Instead, the same
computation runs once more on CPU in float64 (complex128): how far CPU's own result is from that
reference says how much rounding noise this computation has, and tpu may differ from CPU by a
small multiple of it. In words: tpu must be about as close to the exact answer as CPU is.

Concretely, with ``(atol, rtol)`` the tolerance ``torch.testing.assert_close`` would use for a
result (what covers tpu's own rounding), and ``E = max |cpu - ref|`` CPU's largest error over the
elements where both are finite, tpu may differ from CPU by

    atol + FACTOR * E + rtol * |cpu|

The extra allowance is absolute, the size of CPU's worst error, because that is how rounding
noise spreads in sums, products of matrices, convolutions and factorizations: an element whose
terms nearly cancel carries the rounding of its large terms, whichever element that is on a given
machine. It never exceeds ``MAX_SCALE`` plain tolerances at the result's largest magnitude
(``MAX_SCALE_HALF`` for half-precision results): a float64 result that differs in kind (across a
discontinuity such as ``floor``, or a sign an eigenvector may take either way) or a CPU kernel
far worse than rounding must not switch the check off.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.testing._comparison import default_tolerances

#: tpu may be this many times as far from the float64 result as CPU is (beyond its own rounding):
#: |tpu - cpu| is at most |tpu - ref| + |cpu - ref|, so 4 lets tpu be up to 3x CPU's error.
FACTOR = 4.0
#: The extra allowance is at most this many plain tolerances at the result's largest magnitude
#: ``m``: for float32, 1e-3 + 1.3e-4 * m, so a 1e-3 relative error in the largest elements still
#: fails.
MAX_SCALE = 100.0
#: The same for float16/bfloat16 results, whose plain tolerance is already ~2 bfloat16 ulp.
MAX_SCALE_HALF = 10.0
_HALF = (torch.float16, torch.bfloat16)

#: The dtype each computation is widened to for the reference.
WIDER = {
    torch.float32: torch.float64,
    torch.float16: torch.float64,
    torch.bfloat16: torch.float64,
    torch.complex64: torch.complex128,
}


def widened(value: Any) -> Any:
    """``value`` with float32/half (complex64) tensors and dtypes turned into float64
    (complex128); anything else unchanged. A leaf that requires grad stays a leaf that does."""
    if isinstance(value, torch.dtype):
        return WIDER.get(value, value)
    if not isinstance(value, torch.Tensor) or value.dtype not in WIDER:
        return value
    if value.is_leaf:
        return value.detach().to(WIDER[value.dtype]).requires_grad_(value.requires_grad)
    return value.to(WIDER[value.dtype])


#: assert_close's dtype for a Python number (its default tolerances follow it)
_SCALAR_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


def _as_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    return torch.as_tensor(value, dtype=_SCALAR_DTYPES.get(type(value)))


def cpu_error(result: Any, reference: Any) -> tuple[float, float]:
    """``(max |result - reference|, max |reference|)`` over the elements where both are finite;
    (0, 0) if they cannot be compared (other shapes, not floating point)."""
    result, reference = _as_tensor(result), _as_tensor(reference)
    comparable = (
        result.shape == reference.shape
        and result.is_complex() == reference.is_complex()
        and (result.is_floating_point() or result.is_complex())
    )
    if not comparable:
        return 0.0, 0.0
    wide = torch.complex128 if result.is_complex() else torch.float64
    result, reference = result.to(wide), reference.to(wide)
    finite = result.isfinite() & reference.isfinite()
    if not finite.any():
        return 0.0, 0.0
    return (result - reference)[finite].abs().max().item(), reference[finite].abs().max().item()


def derived_tolerance(
    expected: Any, reference: Any | None, atol: float | None = None, rtol: float | None = None
) -> dict[str, float]:
    """``assert_close`` keyword arguments for comparing a result with CPU's ``expected``, given
    the float64 ``reference`` of the same computation (None: the plain tolerance). ``atol`` and
    ``rtol`` default to ``assert_close``'s for ``expected``'s dtype."""
    if atol is None or rtol is None:
        default_rtol, default_atol = default_tolerances(_as_tensor(expected).dtype)
        atol, rtol = default_atol if atol is None else atol, default_rtol if rtol is None else rtol
    error, magnitude = (0.0, 0.0) if reference is None else cpu_error(expected, reference)
    limit = MAX_SCALE_HALF if _as_tensor(expected).dtype in _HALF else MAX_SCALE
    return {"atol": atol + min(FACTOR * error, limit * (atol + rtol * magnitude)), "rtol": rtol}


def assert_matches_cpu(
    actual: torch.Tensor, expected: torch.Tensor, reference: torch.Tensor, what: str = "", **unit: float
) -> None:
    """``torch.testing.assert_close(actual, expected)`` (a device result against CPU's) with the
    tolerance :func:`derived_tolerance` gives for ``expected`` and its float64 ``reference``;
    ``unit`` (``atol``, ``rtol``) replaces assert_close's default plain tolerance."""
    torch.testing.assert_close(
        actual.detach().cpu(),
        expected.detach(),
        **derived_tolerance(expected, reference, **unit),
        msg=lambda message: f"{what}: {message}" if what else message,
    )
