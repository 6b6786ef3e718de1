"""scaled_dot_product_attention on tpu: one fused kernel (``_fused_sdp_choice`` picks the
overrideable backend) wherever it computes what PyTorch's math path computes, forward and
backward; the math path, with PyTorch's errors, for the rest."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_tpu
from torch_tpu.testing.ops_seen import OpsSeen
from torch_tpu.testing.reference import assert_matches_cpu

FUSED = "ScaledDotProductFusedAttentionOverrideableBackward0"


def _shapes(q, k, v=None):
    return q, k, k if v is None else v


CASES = {  # name: ((query, key, value) shapes, keyword arguments (a mask given by its shape, dtype))
    "plain": (_shapes((2, 4, 5, 16), (2, 4, 7, 16)), {}),
    "causal": (_shapes((2, 4, 5, 16), (2, 4, 5, 16)), {"is_causal": True}),
    "causal, longer keys": (_shapes((2, 4, 5, 16), (2, 4, 9, 16)), {"is_causal": True}),
    "grouped query heads": (_shapes((2, 8, 5, 16), (2, 2, 5, 16)), {"enable_gqa": True}),
    "grouped, other value heads": (
        _shapes((2, 8, 5, 16), (2, 4, 7, 16), (2, 2, 7, 16)),
        {"enable_gqa": True},
    ),
    "float mask, broadcast": (_shapes((2, 4, 5, 16), (2, 4, 7, 16)), {"attn_mask": ((1, 1, 5, 7), "float")}),
    "bool mask": (_shapes((2, 4, 5, 16), (2, 4, 7, 16)), {"attn_mask": ((5, 7), "bool")}),
    "three dims": (_shapes((4, 5, 16), (4, 7, 16)), {}),
    "batch broadcast": (_shapes((2, 4, 5, 16), (1, 4, 7, 16)), {}),
    "value width": (_shapes((2, 4, 5, 16), (2, 4, 7, 16), (2, 4, 7, 8)), {}),
    "scale": (_shapes((2, 4, 5, 16), (2, 4, 7, 16)), {"scale": 0.3}),
}


def _inputs(shapes, options, dtype):
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(s, generator=generator, dtype=dtype) for s in shapes]
    options = dict(options)
    if "attn_mask" in options:
        shape, kind = options["attn_mask"]
        if kind == "bool":
            mask = torch.rand(shape, generator=generator) > 0.3
            mask[0] = False  # a fully masked row: zeros forward and backward, as the math path gives
            options["attn_mask"] = mask
        else:
            options["attn_mask"] = torch.randn(shape, generator=generator, dtype=dtype)
    return tensors, options


def _run(tensors, options, device, dtype=None):
    leaves = [t.to(device, dtype).requires_grad_() for t in tensors]
    extra = {
        k: v.to(device, dtype if v.is_floating_point() else None) if torch.is_tensor(v) else v
        for k, v in options.items()
    }
    out = F.scaled_dot_product_attention(*leaves, **extra)
    grad = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape).to(device)
    grads = torch.autograd.grad(out, leaves, grad)
    return out, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_fused_matches_cpu(case, dtype):
    shapes, options = CASES[case]
    tensors, options = _inputs(shapes, options, dtype)
    out, grads = _run(tensors, options, "tpu")
    assert type(out.grad_fn).__name__ == FUSED  # one kernel, not the math path's ops
    expected, expected_grads = _run(tensors, options, "cpu")
    reference, reference_grads = _run(tensors, options, "cpu", torch.float64)
    assert out.dtype == dtype and out.shape == expected.shape
    unit = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    assert_matches_cpu(out, expected, reference, "output", **unit)
    for name, g, e, r in zip("qkv", grads, expected_grads, reference_grads):
        assert_matches_cpu(g, e, r, f"grad of {name}", **unit)


def _overrideable_meta(q, k, v, grad):
    """The layouts PyTorch's meta kernels give the fused op's output and gradients."""
    meta = [t.to("meta") for t in (q, k, v)]
    out = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(*meta)
    grads = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(
        grad.to("meta"), *meta, None, [True] * 4, *out[:6], 0.0, False, *out[6:8]
    )
    return out[0], grads[:3]


@pytest.mark.parametrize("value_width", [16, 8])
def test_output_and_gradients_are_laid_out_as_pytorch_lays_them_out(value_width):
    """Projections viewed as (batch, heads, length, width) are transposed: the output takes the
    query's dimension order, each gradient its input's (the meta kernels' layouts)."""
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, n, 4, 16, generator=generator).transpose(1, 2) for n in (5, 7))
    v = torch.randn(2, 7, 4, value_width, generator=generator).transpose(1, 2)
    out, grads = _run([q, k, v], {}, "tpu")
    assert type(out.grad_fn).__name__ == FUSED
    meta_out, meta_grads = _overrideable_meta(q, k, v, out.detach())
    assert out.stride() == meta_out.stride() and out.shape == meta_out.shape
    assert [g.stride() for g in grads] == [g.stride() for g in meta_grads]
    expected, expected_grads = _run([q, k, v], {}, "cpu")
    reference, reference_grads = _run([q, k, v], {}, "cpu", torch.float64)
    assert_matches_cpu(out, expected, reference, "output")
    for name, g, e, r in zip("qkv", grads, expected_grads, reference_grads):
        assert_matches_cpu(g, e, r, f"grad of {name}")


ERRORS = {  # the math path's own errors, as on CPU
    "heads differ without enable_gqa": (_shapes((2, 8, 5, 16), (2, 2, 5, 16)), {}),
    "heads not a multiple": (_shapes((2, 6, 5, 16), (2, 4, 5, 16)), {"enable_gqa": True}),
    "mask of another shape": (_shapes((2, 4, 5, 16), (2, 4, 7, 16)), {"attn_mask": ((5, 5), "bool")}),
}


@pytest.mark.parametrize("case", ERRORS)
def test_refused_as_on_cpu(case):
    shapes, options = ERRORS[case]
    tensors, options = _inputs(shapes, options, torch.float32)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(*tensors, **options)
    on_tpu = {k: v.to("tpu") if torch.is_tensor(v) else v for k, v in options.items()}
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(*(t.to("tpu") for t in tensors), **on_tpu)


def test_two_dimensional_inputs_take_the_math_path():
    """The fused op takes 3-D and 4-D inputs only (its meta kernel refuses others)."""
    tensors, _ = _inputs(_shapes((5, 16), (7, 16)), {}, torch.float32)
    out, grads = _run(tensors, {}, "tpu")
    assert type(out.grad_fn).__name__ != FUSED
    expected, expected_grads = _run(tensors, {}, "cpu")
    reference, reference_grads = _run(tensors, {}, "cpu", torch.float64)
    assert_matches_cpu(out, expected, reference, "output")
    for name, g, e, r in zip("qkv", grads, expected_grads, reference_grads):
        assert_matches_cpu(g, e, r, f"grad of {name}")


def test_math_backend_when_asked():
    q = torch.randn(2, 4, 5, 16, device="tpu", requires_grad=True)
    with sdpa_kernel([SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(q, q, q)
    assert type(out.grad_fn).__name__ != FUSED


def test_the_kernel_choice_kept_per_geometry_follows_dtype_mask_and_switch():
    """The core keeps the choice per operand geometry and switch: after a fused call, the same
    shapes take the math path when the user asks for it, or with integer operands (CPU's
    error), and a mask of another shape gets CPU's error; a dispatch mode sees every choice."""
    q = torch.randn(2, 4, 5, 16, device="tpu", requires_grad=True)
    for _ in range(2):
        assert type(F.scaled_dot_product_attention(q, q, q).grad_fn).__name__ == FUSED
        with sdpa_kernel([SDPBackend.MATH]):
            assert type(F.scaled_dot_product_attention(q, q, q).grad_fn).__name__ != FUSED
    whole = torch.ones(2, 4, 5, 16, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="same dtype"):
        F.scaled_dot_product_attention(whole, whole, whole)
    whole = whole.to("tpu")
    with pytest.raises(RuntimeError, match="same dtype"):
        F.scaled_dot_product_attention(whole, whole, whole)
    mask = torch.ones(5, 4, dtype=torch.bool, device="tpu")
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    with OpsSeen() as seen:
        F.scaled_dot_product_attention(q, q, q)
        F.scaled_dot_product_attention(q, q, q)
    assert [op.__name__ for op in seen.ops].count("_fused_sdp_choice.default") == 2


@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
def test_one_recorded_op_in_fused_eager(transposed):
    """One node, not the math path's dozen; a transposed (batch, length, heads, width)
    projection's output too: the program returns it in its layout's memory order (no transpose
    node after it)."""
    q = torch.randn(2, 5, 4, 16).transpose(1, 2) if transposed else torch.randn(2, 4, 5, 16)
    expected = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    q = q.to("tpu")
    torch_tpu.sync()
    with torch_tpu.eager_mode("fused"):
        before = torch_tpu.execution.pending_ops()
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        recorded = torch_tpu.execution.pending_ops() - before
        torch_tpu.sync()
    assert recorded == 1
    assert out.stride() == expected.stride()
    torch.testing.assert_close(out.cpu(), expected)


def test_compiled():
    q, k, v = (torch.randn(2, 4, 5, 16) for _ in range(3))
    compiled = torch.compile(lambda *t: F.scaled_dot_product_attention(*t, is_causal=True), backend="tpu")
    out = compiled(q.to("tpu"), k.to("tpu"), v.to("tpu"))
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_dropout_forward_and_backward_share_the_mask():
    """With ``value`` the identity, the output is the dropped-out attention weights W, and the
    value's gradient must be W^T @ grad: the backward replays the forward's mask."""
    torch.manual_seed(0)
    q, k = (torch.randn(2, 3, 6, 6, device="tpu") for _ in range(2))
    v = torch.eye(6, device="tpu").expand(2, 3, 6, 6).clone().requires_grad_()
    weights = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert type(weights.grad_fn).__name__ == FUSED
    dropped = (weights == 0).float().mean().item()
    assert 0.2 < dropped < 0.8  # about half of 216 weights (a binomial's 5 sigma either side)
    grad = torch.randn_like(weights)
    (value_grad,) = torch.autograd.grad(weights, v, grad)
    torch.testing.assert_close(value_grad, weights.detach().transpose(-1, -2) @ grad)
    torch.manual_seed(0)
    q2, k2 = (torch.randn(2, 3, 6, 6, device="tpu") for _ in range(2))
    again = F.scaled_dot_product_attention(q2, k2, v, dropout_p=0.5)
    torch.testing.assert_close(again, weights)  # the same seed, the same mask
