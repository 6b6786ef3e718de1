"""``torch_tpu.kernels.flash_attention``: the Pallas flash attention (JAX level and as a tpu op)
against ``F.scaled_dot_product_attention`` on CPU, values and gradients, with float64-derived
tolerances; and ``use_flash_attention``'s routing of SDPA (forced on this non-TPU platform)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_tpu import kernels
from torch_tpu.kernels import _routing, flash

from ..ops.cases import seeded
from .jax_cases import assert_matches_composition, jax_value_and_grads, torch_value_and_grads

#: 13 queries and 11 keys in blocks of 8 and 4: several blocks each way, both padded
Q, KV = (2, 4, 13, 8), (2, 2, 11, 8)


def _mask(kind):
    if kind == "bool":
        mask = seeded(2, 1, 13, 11, seed=3) > -0.5
        mask[0, 0, 2] = False  # a query with every key masked: zeros, as PyTorch's math path
        return mask
    return seeded(4, 13, 11, seed=3) if kind == "float" else None


def _sdpa(q, k, v, mask=None, causal=False, scale=None):
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True
    )


@pytest.mark.parametrize(
    "causal, mask_kind, scale", [(True, None, None), (False, "bool", None), (False, "float", 0.3)], ids=str
)
def test_kernel_matches_cpu(causal, mask_kind, scale):
    """Grouped-query heads (4 query heads on 2 key/value heads); a float mask's gradient too."""
    mask = _mask(mask_kind)
    inputs = [seeded(*Q), seeded(*KV, seed=1), seeded(*KV, seed=2)] + ([mask] if mask is not None else [])
    wrt = (0, 1, 2, 3) if mask_kind == "float" else (0, 1, 2)
    cotangent = seeded(*Q, seed=4)

    def kernel(q, k, v, mask=None):
        return flash.flash_attention(
            q, k, v, mask, causal=causal, scale=scale, mask_grad=True, block_q=8, block_k=4, interpret=True
        )

    actual = jax_value_and_grads(kernel, inputs, cotangent, wrt)
    assert_matches_composition(
        actual, lambda *a: _sdpa(*a, causal=causal, scale=scale), inputs, cotangent, wrt
    )


def test_op_matches_cpu():
    """Through ``torch.ops.torch_tpu.flash_attention``, with a float mask that requires grad (its
    gradient summed over the heads it was broadcast across)."""
    inputs = [seeded(*Q), seeded(*KV, seed=1), seeded(*KV, seed=2), _mask("float")]
    wrt = (0, 1, 2, 3)
    cotangent = seeded(*Q, seed=4)

    def op(q, k, v, mask):
        return kernels.flash_attention(q, k, v, mask=mask)

    actual = torch_value_and_grads(op, [t.to("tpu") for t in inputs], cotangent, wrt)
    assert_matches_composition(actual, _sdpa, inputs, cotangent, wrt)


def test_incompatible_shapes_are_refused():
    with pytest.raises(RuntimeError, match="flash_attention"):
        kernels.flash_attention(seeded(1, 3, 4, 8).to("tpu"), *[seeded(1, 2, 4, 8).to("tpu")] * 2)


@pytest.fixture
def forced(monkeypatch):
    """The routing as on a TPU (the kernel then runs interpreted), restored after."""
    monkeypatch.setattr(_routing, "_force", True)
    yield
    kernels.use_flash_attention(False)


def _routed(out) -> bool:
    return "flash_attention" in type(out.grad_fn).__name__


def test_use_flash_attention_routes_sdpa(forced):
    """A routed call (causal, no mask) gives the math path's values and gradients; other calls
    keep the math path, and so do all once the switch is off again."""
    q, k, v = seeded(1, 2, 5, 8), seeded(1, 2, 7, 8, seed=1), seeded(1, 2, 7, 8, seed=2)
    cotangent = seeded(1, 2, 5, 8, seed=4)
    wrt = (0, 1, 2)
    tpu = [t.to("tpu") for t in (q, k, v)]

    def causal(*qkv):
        return _sdpa(*qkv, causal=True)

    math = torch_value_and_grads(causal, tpu, cotangent, wrt)
    with kernels.use_flash_attention():
        assert _routing.enabled()
        leaves = [t.detach().requires_grad_() for t in tpu]
        assert _routed(causal(*leaves))
        routed = torch_value_and_grads(causal, tpu, cotangent, wrt)
        assert not _routed(F.scaled_dot_product_attention(*leaves, dropout_p=0.5))  # dropout: math path
        both = F.scaled_dot_product_attention(*leaves, attn_mask=tpu[0][0, 0, :, :7] > 0, is_causal=True)
        assert not _routed(both)  # a mask and is_causal: the composite
    assert not _routing.enabled()
    assert not _routed(causal(*leaves))
    assert_matches_composition(routed, causal, [q, k, v], cotangent, wrt)
    for got, want in zip([routed[0], *routed[1]], [math[0], *math[1]]):
        torch.testing.assert_close(got, want)


def test_use_flash_attention_keeps_the_math_path_off_tpu():
    with kernels.use_flash_attention():
        out = F.scaled_dot_product_attention(
            *(seeded(1, 2, 4, 8).to("tpu").requires_grad_() for _ in range(3))
        )
    assert not _routed(out)


def test_environment_switch(run_python):
    out = run_python(
        """
        import torch, torch_tpu
        torch.tpu.init()
        from torch_tpu.kernels import _routing
        print(_routing.enabled())
        """,
        TORCH_TPU_FLASH_ATTENTION="1",
    )
    assert out.split() == ["True"]
