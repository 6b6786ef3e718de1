"""``torch_tpu.kernels.grouped_matmul``: the Pallas ragged matmul (JAX level and as a tpu op)
against the per-group matmuls on CPU (``torch._grouped_mm``'s result, which has no float64
kernel for the reference), values and gradients, with float64-derived tolerances; the rows past
the last group are 0."""

from __future__ import annotations

import pytest
import torch

from torch_tpu import kernels
from torch_tpu.kernels import gmm

from ..ops.cases import seeded
from .jax_cases import assert_matches_composition, jax_value_and_grads, torch_value_and_grads

M, K, N, GROUPS = 21, 16, 24, 4


def _composition(lhs, rhs, group_sizes):
    """Each group's rows times its matrix (what ``torch._grouped_mm`` computes with offsets
    ``group_sizes.cumsum(0)``, in float64 too), zeros after."""
    sizes = group_sizes.tolist()
    rows = lhs[: sum(sizes)].split(sizes)
    products = [part @ weight for part, weight in zip(rows, rhs)]
    return torch.cat([*products, lhs.new_zeros(lhs.shape[0] - sum(sizes), rhs.shape[2])])


def _inputs(sizes):
    return [seeded(M, K), seeded(GROUPS, K, N, seed=1), torch.tensor(sizes, dtype=torch.int32)]


def _check(actual, inputs, cotangent):
    assert_matches_composition(actual, _composition, inputs, cotangent, (0, 1))


@pytest.mark.parametrize(
    "sizes",
    [[3, 0, 9, 5], [0, 0, 0, 0], [M, 0, 0, 0]],
    ids=["empty group, tiles shared, rows past the end", "no rows", "one group"],
)
def test_kernel_matches_cpu(sizes):
    """Tiles of 8 rows, 8 contraction columns, 16 output columns: padding in each dimension,
    tiles visited once per group in them."""
    inputs = _inputs(sizes)
    cotangent = seeded(M, N, seed=2)
    actual = jax_value_and_grads(
        lambda lhs, rhs, sizes: gmm.grouped_matmul(lhs, rhs, sizes, tiling=(8, 8, 16), interpret=True),
        inputs,
        cotangent,
        (0, 1),
    )
    _check(actual, inputs, cotangent)


def test_op_matches_cpu():
    inputs = _inputs([5, 2, 0, 11])
    cotangent = seeded(M, N, seed=2)
    actual = torch_value_and_grads(kernels.grouped_matmul, [t.to("tpu") for t in inputs], cotangent, (0, 1))
    _check(actual, inputs, cotangent)


def test_float_group_sizes_are_refused():
    lhs, rhs, sizes = (t.to("tpu") for t in _inputs([5, 2, 0, 11]))
    with pytest.raises(RuntimeError, match="group_sizes must be integers"):
        kernels.grouped_matmul(lhs, rhs, sizes.float())
