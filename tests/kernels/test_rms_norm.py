"""``torch_tpu.kernels.rms_norm``: the Pallas RMSNorm (JAX level and as a tpu op) against
``F.rms_norm`` on CPU, values and gradients, with float64-derived tolerances."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_tpu import kernels
from torch_tpu.kernels import rmsnorm

from ..ops.cases import seeded
from .jax_cases import assert_matches_composition, jax_value_and_grads, torch_value_and_grads

EPS = 1e-6


def _composition(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_kernel_matches_cpu(dtype):
    """21 rows in blocks of 8: three blocks, the last padded; dW accumulated across them."""
    inputs = [seeded(3, 7, 16, dtype=dtype), seeded(16, dtype=dtype, seed=1)]
    cotangent = seeded(3, 7, 16, dtype=dtype, seed=2)
    actual = jax_value_and_grads(
        lambda x, w: rmsnorm.rms_norm(x, w, EPS, block_rows=8, interpret=True), inputs, cotangent, (0, 1)
    )
    assert_matches_composition(actual, _composition, inputs, cotangent, (0, 1))


def test_op_matches_cpu():
    inputs = [seeded(4, 5, 32), seeded(32, seed=1)]
    cotangent = seeded(4, 5, 32, seed=2)
    actual = torch_value_and_grads(
        lambda x, w: kernels.rms_norm(x, w, EPS), [t.to("tpu") for t in inputs], cotangent, (0, 1)
    )
    assert_matches_composition(actual, _composition, inputs, cotangent, (0, 1))


def test_default_eps_is_pytorchs():
    x, w = seeded(2, 8) * 1e-4, seeded(8, seed=1)
    torch.testing.assert_close(kernels.rms_norm(x.to("tpu"), w.to("tpu")).cpu(), F.rms_norm(x, (8,), w))


def test_weight_of_another_length_is_refused():
    with pytest.raises(RuntimeError, match="weight of shape"):
        kernels.rms_norm(seeded(2, 8).to("tpu"), seeded(4).to("tpu"))
