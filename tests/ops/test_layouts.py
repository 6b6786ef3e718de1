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
