"""Output layouts are PyTorch's: an elementwise op's output follows its inputs' dense layout
(TensorIterator's rule: ``x.t() + 1`` is transposed, channels-last stays channels-last), copies
and ``*_like`` factories preserve the format, ``empty`` takes a memory format. Each case is
compared with CPU: same strides (of the dimensions longer than 1) and same values."""

from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401

from .cases import seeded


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last)


def _significant_strides(t: torch.Tensor) -> tuple:
    return tuple(s for n, s in zip(t.shape, t.stride()) if n > 1)


# each builds its result from ``x`` (a 3x4 matrix) and ``image`` (2x3x4x5) on one device
LAYOUTS = {
    "unary_transposed": lambda x, image: torch.exp(x.t()),
    "scalar_transposed": lambda x, image: x.t() + 1,
    "binary_transposed": lambda x, image: x.t() * x.t(),
    "first_input_decides": lambda x, image: x.t().contiguous() - x.t(),
    "broadcast_transposed": lambda x, image: x.t() + x[0].reshape(4, 1),
    "strided_transposed": lambda x, image: x.t()[::2] * 3,
    "comparison_transposed": lambda x, image: x.t() > 0,
    "where_condition_decides": lambda x, image: torch.where(x.t().contiguous() > 0, x.t(), 1.0),
    "clamp_transposed": lambda x, image: torch.clamp(x.t(), -0.5, 0.5),
    "permuted_3d": lambda x, image: x.reshape(3, 2, 2).permute(2, 0, 1) * 2,
    "channels_last_unary": lambda x, image: torch.sigmoid(_channels_last(image)),
    "channels_last_binary": lambda x, image: _channels_last(image) + image,
    "channels_last_broadcast": lambda x, image: _channels_last(image) * image[0, :, :1, :1],
    "to_dtype_transposed": lambda x, image: x.t().to(torch.float64),
    "to_channels_last": lambda x, image: image.to(memory_format=torch.channels_last),
    "empty_channels_last": lambda x, image: torch.empty(
        2, 3, 4, 5, device=image.device, memory_format=torch.channels_last
    ).fill_(2),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_matches_cpu(name):
    x, image = seeded(3, 4), seeded(2, 3, 4, 5, seed=1)
    expected = LAYOUTS[name](x, image)
    actual = LAYOUTS[name](x.to("tpu"), image.to("tpu"))
    assert _significant_strides(actual) == _significant_strides(expected)
    torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("transposed", ["cpu", "tpu"])
def test_device_copies_preserve_layout(transposed):
    """``.to(device)`` keeps a dense layout both ways, as PyTorch's ``_to_copy`` does."""
    x = seeded(3, 4).to(transposed).t()
    copy = x.to("tpu" if transposed == "cpu" else "cpu")
    assert copy.stride() == x.stride()
    torch.testing.assert_close(copy.cpu(), x.cpu())


def _spd(m: torch.Tensor) -> torch.Tensor:
    return m @ m.mT + 4 * torch.eye(m.shape[-1], device=m.device)


# Ops whose results PyTorch does not lay out row-major (``ops/layout.py``): factorizations are
# column-major per matrix (LAPACK's convention), rot90 is a transposed flip, FFTs follow the
# transformed dimensions, ``*_like`` factories preserve their input's layout. Only strides are
# compared here: the values are checked against CPU by the OpInfo tests.
NON_ROW_MAJOR = {
    "svd": lambda m: torch.linalg.svd(m),
    "svd_reduced": lambda m: torch.linalg.svd(m[..., :3], full_matrices=False),
    "qr": lambda m: torch.linalg.qr(m),
    "eigh": lambda m: torch.linalg.eigh(_spd(m)),
    "cholesky": lambda m: torch.linalg.cholesky(_spd(m)),
    "inv": lambda m: torch.linalg.inv(_spd(m)),
    "solve": lambda m: torch.linalg.solve(_spd(m), m),
    "lu_factor": lambda m: torch.linalg.lu_factor(m),
    "det_lu": lambda m: torch.ops.aten._linalg_det(m),
    "solve_triangular": lambda m: torch.linalg.solve_triangular(_spd(m).tril(), m, upper=False),
    "rot90": lambda m: torch.rot90(m, 1, (1, 2)),
    "fft2": lambda m: torch.fft.fft2(m.to(torch.complex64), dim=(0, 1)),
    "rfftn": lambda m: torch.fft.rfftn(m, dim=(0, 2)),
    "zeros_like_transposed": lambda m: torch.zeros_like(m.mT),
    "full_like_channels_last": lambda m: torch.full_like(m[None], 2.0, memory_format=torch.channels_last),
    "rand_like_transposed": lambda m: torch.rand_like(m.mT),
}


@pytest.mark.parametrize("name", NON_ROW_MAJOR)
def test_non_row_major_outputs_match_cpu_strides(name):
    m = seeded(2, 4, 4, seed=2)
    expected = NON_ROW_MAJOR[name](m)
    actual = NON_ROW_MAJOR[name](m.to("tpu"))
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    assert [_significant_strides(t) for t in actual] == [_significant_strides(t) for t in expected]
