"""Zero-size inputs are accepted where CPU accepts them (an empty batch, an empty output size)
and refused with CPU's exception type where CPU refuses them (an empty non-batch dimension);
argument checks CPU makes (clamp without bounds, integer adaptive pooling) are made too."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401

from .cpu_parity import assert_matches_cpu


def _randn(*shape, device):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(device)


def _fractional(shape, output_size, device):
    samples = torch.rand(shape[0], shape[1], 2, generator=torch.Generator().manual_seed(1)).to(device)
    return F.fractional_max_pool2d(_randn(*shape, device=device), 2, output_size, _random_samples=samples)


CASES = {
    "adaptive_max_pool2d_empty_batch": lambda d: F.adaptive_max_pool2d(_randn(0, 3, 4, 4, device=d), 2),
    "adaptive_max_pool3d_empty_batch": lambda d: F.adaptive_max_pool3d(_randn(0, 3, 4, 4, 4, device=d), 2),
    "adaptive_avg_pool2d_empty_batch": lambda d: F.adaptive_avg_pool2d(_randn(0, 3, 4, 4, device=d), 2),
    "adaptive_max_pool2d_empty_output": lambda d: F.adaptive_max_pool2d(_randn(2, 3, 4, 4, device=d), (0, 2)),
    "adaptive_max_pool2d_empty_channels": lambda d: F.adaptive_max_pool2d(_randn(1, 0, 4, 4, device=d), 2),
    "adaptive_avg_pool2d_empty_height": lambda d: F.adaptive_avg_pool2d(_randn(1, 3, 0, 4, device=d), 2),
    "adaptive_avg_pool2d_integer": lambda d: F.adaptive_avg_pool2d(
        torch.ones(1, 1, 4, 4, dtype=torch.long, device=d), 2
    ),
    "adaptive_max_pool2d_integer": lambda d: F.adaptive_max_pool2d(
        torch.ones(1, 1, 4, 4, dtype=torch.long, device=d), 2
    ),
    "max_pool2d_empty_batch": lambda d: F.max_pool2d(_randn(0, 3, 4, 4, device=d), 2, return_indices=True),
    "max_pool2d_empty_height": lambda d: F.max_pool2d(_randn(1, 3, 0, 4, device=d), 2),
    "avg_pool2d_empty_batch": lambda d: F.avg_pool2d(_randn(0, 3, 4, 4, device=d), 2),
    "avg_pool2d_empty_channels": lambda d: F.avg_pool2d(_randn(1, 0, 4, 4, device=d), 2),
    "fractional_max_pool2d_empty_output": lambda d: _fractional((1, 3, 4, 4), (0, 0), d),
    "fractional_max_pool2d_empty_batch": lambda d: _fractional((0, 3, 4, 4), 2, d),
    "max_unpool2d_empty_batch": lambda d: F.max_unpool2d(
        _randn(0, 3, 2, 2, device=d), torch.zeros(0, 3, 2, 2, dtype=torch.long, device=d), 2
    ),
    "group_norm_empty_batch": lambda d: F.group_norm(_randn(0, 4, 3, device=d), 2),
    "group_norm_empty_spatial": lambda d: F.group_norm(_randn(2, 4, 0, device=d), 2),
    "batch_norm_empty_spatial": lambda d: F.batch_norm(_randn(2, 3, 0, device=d), None, None, training=True),
    "layer_norm_empty_batch": lambda d: F.layer_norm(_randn(0, 3, device=d), (3,)),
    "conv2d_empty_batch": lambda d: F.conv2d(_randn(0, 3, 4, 4, device=d), _randn(2, 3, 3, 3, device=d)),
    "interpolate_empty_batch": lambda d: F.interpolate(_randn(0, 3, 4, 4, device=d), scale_factor=2),
    "clamp_without_bounds": lambda d: torch.clamp(_randn(3, device=d)),
    "clamp_tensor_without_bounds": lambda d: torch.clamp(_randn(3, device=d), None, None),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_cpu(name):
    assert_matches_cpu(CASES[name])
