"""Overloads the OpInfo samples do not reach (Scalar forms, out= factories, 3-d pads, ...),
each compared with PyTorch CPU on the same call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401

from .cases import assert_build_matches_cpu, assert_gradient_matches_cpu, seeded

aten = torch.ops.aten


_x = seeded


def _ints(*shape, high=5, seed=0):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


CASES = {
    "norm.Scalar": lambda d: aten.norm.Scalar(_x(3, 4).to(d), 3),
    # the loss only: log_alpha holds values CPU never writes
    "_ctc_loss.Tensor": lambda d: aten._ctc_loss.Tensor(
        _x(6, 2, 4).log_softmax(2).to(d),
        torch.tensor([[1, 2], [1, 1]]).to(d),
        torch.tensor([6, 5]).to(d),
        torch.tensor([2, 1]).to(d),
    )[0],
    "bitwise_and.Scalar": lambda d: aten.bitwise_and.Scalar(_ints(6).to(d), 3),
    "bitwise_or.Scalar": lambda d: aten.bitwise_or.Scalar(_ints(6).to(d), 3),
    "bitwise_xor.Scalar": lambda d: aten.bitwise_xor.Scalar(_ints(6).to(d), 3),
    "floor_divide.Scalar": lambda d: aten.floor_divide.Scalar(_x(6).to(d), 0.7),
    "fmod.Scalar": lambda d: aten.fmod.Scalar(_x(6).to(d), 0.7),
    "div.Scalar_mode": lambda d: aten.div.Scalar_mode(_x(6).to(d), 0.7, rounding_mode="floor"),
    "clamp_max.default": lambda d: aten.clamp_max.default(_x(6).to(d), 0.1),
    "all.dims": lambda d: aten.all.dims(_ints(2, 3, 4).to(d), [0, 2]),
    "any.dims": lambda d: aten.any.dims(_ints(2, 3, 4).to(d), [0, 2], keepdim=True),
    "count_nonzero.dim_IntList": lambda d: aten.count_nonzero.dim_IntList(_ints(3, 4).to(d), [1]),
    "norm.ScalarOpt_dtype": lambda d: aten.norm.ScalarOpt_dtype(_x(3, 4).to(d), 2, dtype=torch.float64),
    "norm.ScalarOpt_dim_dtype": lambda d: aten.norm.ScalarOpt_dim_dtype(
        _x(3, 4).to(d), 2, [1], False, dtype=torch.float64
    ),
    "_logcumsumexp.default": lambda d: aten._logcumsumexp.default(_x(3, 4).to(d), 1),
    "_addmm_activation.default": lambda d: aten._addmm_activation.default(
        _x(4).to(d), _x(3, 5, seed=1).to(d), _x(5, 4, seed=2).to(d), use_gelu=True
    ),
    "fill_.Tensor": lambda d: _x(2, 3).to(d).fill_(torch.tensor(2.5).to(d)),
    "fill_.Tensor cpu value": lambda d: _x(2, 3).to(d).fill_(torch.tensor(2.5)),
    "bucketize.Scalar": lambda d: aten.bucketize.Scalar(0.3, torch.tensor([-1.0, 0.0, 1.0]).to(d)),
    "searchsorted.Scalar": lambda d: aten.searchsorted.Scalar(torch.tensor([-1.0, 0.0, 1.0]).to(d), 0.3),
    "scatter.value_reduce": lambda d: aten.scatter.value_reduce(
        _x(3, 4).to(d), 1, torch.tensor([[0, 1], [2, 3], [1, 1]]).to(d), 2.0, reduce="multiply"
    ),
    "repeat_interleave.Tensor": lambda d: aten.repeat_interleave.Tensor(torch.tensor([1, 0, 3]).to(d)),
    "unique_dim.default": lambda d: aten.unique_dim.default(
        torch.tensor([[1, 2], [1, 2], [0, 5]]).to(d), 0, True, True, True
    ),
    "unique_dim_consecutive.default": lambda d: aten.unique_dim_consecutive.default(
        torch.tensor([[1, 2], [1, 2], [0, 5], [1, 2]]).to(d), 0, True, True
    ),
    "reflection_pad2d": lambda d: F.pad(_x(1, 2, 4, 5).to(d), (1, 2, 2, 1), mode="reflect"),
    "reflection_pad3d": lambda d: F.pad(_x(1, 2, 3, 4, 5).to(d), (1, 1, 2, 1, 1, 2), mode="reflect"),
    "replication_pad3d": lambda d: F.pad(_x(1, 2, 3, 4, 5).to(d), (1, 0, 2, 1, 0, 2), mode="replicate"),
    "embedding max_norm": lambda d: F.embedding(
        torch.tensor([0, 2, 2]).to(d), _x(4, 3).mul(3).to(d), max_norm=1.0
    ),
    "eye.m": lambda d: torch.eye(3, 5, device=d),
    "eye.out": lambda d: torch.eye(4, out=torch.empty(0, device=d)),
    "eye.m_out": lambda d: torch.eye(2, 3, out=torch.empty(0, device=d)),
    "linspace.out": lambda d: torch.linspace(0, 1, 7, out=torch.empty(0, device=d)),
    "logspace": lambda d: torch.logspace(0, 2, 5, device=d),
    "logspace.out": lambda d: torch.logspace(0, 2, 5, base=2.0, out=torch.empty(0, device=d)),
    "tril_indices": lambda d: torch.tril_indices(4, 3, offset=1, device=d),
    "triu_indices": lambda d: torch.triu_indices(4, 3, offset=-1, device=d),
}

GRADIENT_CASES = {
    "upsample_nearest2d_backward": lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
    "_upsample_nearest_exact2d_backward": lambda x: F.interpolate(x, size=(7, 3), mode="nearest-exact"),
    "_upsample_nearest_exact3d_backward": lambda x: F.interpolate(
        x.unsqueeze(0), scale_factor=1.5, mode="nearest-exact"
    ),
    "reflection_pad2d_backward": lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect"),
    "reflection_pad3d_backward": lambda x: F.pad(x.unsqueeze(0), (1, 1, 2, 1, 1, 2), mode="reflect"),
    "replication_pad3d_backward": lambda x: F.pad(x.unsqueeze(0), (1, 0, 2, 1, 0, 2), mode="replicate"),
}


def _on(device):
    return lambda t: t.to(device) if isinstance(t, torch.Tensor) else t


@pytest.mark.parametrize("name", list(CASES))
def test_overload_matches_cpu(name):
    assert_build_matches_cpu(CASES[name])


@pytest.mark.parametrize("name", list(GRADIENT_CASES))
def test_backward_overload_matches_cpu(name):
    fn = GRADIENT_CASES[name]
    x = _x(1, 2, 4, 5) if "2d" in name else _x(1, 2, 3, 4, 5).squeeze(0)
    assert_gradient_matches_cpu(fn, x)


def test_batch_norm_functional_variants_match_cpu():
    x, weight, bias = _x(4, 3, 5), _x(3, seed=1), _x(3, seed=2)
    mean, var = _x(3, seed=3), _x(3, seed=4).abs() + 0.5
    for op, args in [
        (aten._native_batch_norm_legit.no_stats, (x, weight, bias, True, 0.1, 1e-5)),
        (aten._native_batch_norm_legit_no_training.default, (x, weight, bias, mean, var, 0.1, 1e-5)),
        (aten._batch_norm_with_update_functional.default, (x, weight, bias, mean, var, 0.1, 1e-5)),
        (aten._batch_norm_no_update.default, (x, weight, bias, mean, var, 0.1, 1e-5)),
    ]:
        expected = op(*args)
        actual = op(*[_on("tpu")(a) for a in args])
        torch.testing.assert_close([a.cpu() for a in actual], list(expected), msg=str(op))


def test_random_integer_fills_are_in_range_and_seeded():
    torch.manual_seed(3)
    a = torch.empty(1000, dtype=torch.int64, device="tpu").random_(7).cpu()
    b = torch.empty(1000, dtype=torch.uint8, device="tpu").random_().cpu()
    torch.manual_seed(3)
    assert torch.equal(torch.empty(1000, dtype=torch.int64, device="tpu").random_(7).cpu(), a)
    assert 0 <= a.min() and a.max() < 7 and len(a.unique()) == 7
    assert b.dtype == torch.uint8 and b.max() > 200


def test_randperm_out_is_a_seeded_permutation():
    torch.manual_seed(5)
    out = torch.empty(0, dtype=torch.int64, device="tpu")
    torch.randperm(50, out=out)
    assert sorted(out.cpu().tolist()) == list(range(50))
    torch.manual_seed(5)
    assert torch.equal(
        torch.randperm(50, out=torch.empty(0, dtype=torch.int64, device="tpu")).cpu(), out.cpu()
    )


def test_fused_attention_entry_points_match_cpu_sdpa():
    """The overrideable fused SDPA kernels (what `_fused_sdp_choice` picks for tpu), called
    directly: eager `F.scaled_dot_product_attention` takes the math path (see nn.py)."""
    q, k, v = (_x(2, 3, 5, 4, seed=s) for s in (1, 2, 3))
    backend = aten._fused_sdp_choice.default(q.to("tpu"), k.to("tpu"), v.to("tpu"), is_causal=True)
    assert backend == int(torch.nn.attention.SDPBackend.OVERRIDEABLE)
    leaves = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    out = aten._scaled_dot_product_fused_attention_overrideable.default(*leaves, is_causal=True)[0]
    cpu_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*cpu_leaves, is_causal=True)
    torch.testing.assert_close(out.cpu(), expected)
    cotangent = torch.linspace(-1, 1, expected.numel()).reshape(expected.shape)
    actual_grads = torch.autograd.grad(out, leaves, cotangent.to("tpu"))
    expected_grads = torch.autograd.grad(expected, cpu_leaves, cotangent)
    for a, e in zip(actual_grads, expected_grads):
        torch.testing.assert_close(a.cpu(), e)
