"""``torch.autocast("tpu")``: bfloat16 by default, CUDA's per-op cast lists, and GradScaler."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from torch_tpu.integrations import autocast as _autocast


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to("tpu", dtype)


def test_default_dtype_is_bfloat16():
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    assert torch.tpu.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    with torch.autocast("tpu"):
        assert torch.is_autocast_enabled("tpu") and torch.tpu._is_autocast_enabled()
        assert torch.tpu._get_autocast_dtype() == torch.bfloat16
    assert not torch.is_autocast_enabled("tpu")


def test_every_listed_op_exists_in_this_pytorch():
    listed = [n for names in _autocast.POLICIES.values() for n in names]
    assert set(_autocast.registered_ops()) == set(listed) | set(_autocast.NORM_WITH_DTYPE)


a, b = _randn(8, 8), _randn(8, 8)
LOWER = {
    "mm": lambda: a @ b,
    "linear": lambda: F.linear(a, b, a[0]),
    "bmm": lambda: torch.bmm(a[None], b[None]),
    "baddbmm": lambda: torch.baddbmm(a[None], a[None], b[None]),
    "addmm": lambda: torch.addmm(a, a, b),
    "einsum": lambda: torch.einsum("ij,jk->ik", a, b),
    "conv2d": lambda: F.conv2d(a[None, None], b[None, None, :3, :3]),
    "sdpa": lambda: F.scaled_dot_product_attention(a[None], b[None], b[None]),
}
FP32 = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: F.log_softmax(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, (8,)),
    "group_norm": lambda x: F.group_norm(x[None], 2),
    "norm": lambda x: torch.norm(x),
    "vector_norm": lambda x: torch.linalg.vector_norm(x),
    "exp": torch.exp,
    "log": lambda x: torch.log(x.abs()),
    "pow": lambda x: x.pow(2),
    "sum": lambda x: x.sum(),
    "cumsum": lambda x: x.cumsum(0),
    "mse_loss": lambda x: F.mse_loss(x, x.flip(0)),
}


@pytest.mark.parametrize("name", sorted(LOWER))
def test_matmul_family_runs_in_bfloat16(name):
    with torch.autocast("tpu"):
        out = LOWER[name]()
    assert out.dtype == torch.bfloat16
    exact = LOWER[name]()  # float32, outside autocast
    torch.testing.assert_close(out.float(), exact, rtol=0.05, atol=0.1)


@pytest.mark.parametrize("name", sorted(FP32))
def test_precision_sensitive_ops_run_in_float32(name):
    low = _randn(8, 8, dtype=torch.bfloat16)
    with torch.autocast("tpu"):
        out = FP32[name](low)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, FP32[name](low.float()))  # computed from the fp32 upcast


def test_promote_and_explicit_dtype_and_untouched_inputs():
    low = _randn(4, dtype=torch.bfloat16)
    full = _randn(4)
    with torch.autocast("tpu"):
        assert torch.addcmul(full, low, low).dtype == torch.float32  # widest input wins
        assert torch.addcmul(low, low, low).dtype == torch.bfloat16
        assert torch.softmax(low, 0, dtype=torch.float16).dtype == torch.float16  # caller's choice
        # cross_entropy passes log_softmax the input's dtype explicitly (so it stays bfloat16,
        # as on CUDA); the nll_loss after it runs in float32.
        assert F.cross_entropy(low[None], torch.tensor([1], device="tpu")).dtype == torch.float32
        assert (full.double() @ full.double()).dtype == torch.float64  # float64 is never cast
        assert (full + full).dtype == torch.float32  # not on any list
        cpu = torch.ones(2, 2)
        assert (cpu @ cpu).dtype == torch.float32  # other devices untouched
    with torch.autocast("tpu", dtype=torch.float16):
        assert (a @ b).dtype == torch.float16
    with torch.autocast("tpu", enabled=False):
        assert (a @ b).dtype == torch.float32


def test_binary_cross_entropy_is_banned_as_on_cuda():
    p = torch.sigmoid(a)
    with torch.autocast("tpu"), pytest.raises(RuntimeError, match="unsafe to autocast"):
        F.binary_cross_entropy(p, torch.rand(8, 8).to("tpu"))
    F.binary_cross_entropy_with_logits(a, p)  # the safe form works


def test_gradients_flow_back_to_float32_weights():
    layer = torch.nn.Linear(8, 8).to("tpu")
    with torch.autocast("tpu"):
        loss = F.cross_entropy(layer(a), torch.arange(8, device="tpu"))
    loss.backward()
    assert loss.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32
    reference = copy.deepcopy(layer).cpu()
    # The same casts by hand on CPU: linear in bfloat16, loss in float32.
    logits = F.linear(a.cpu().bfloat16(), reference.weight.bfloat16(), reference.bias.bfloat16())
    F.cross_entropy(logits.float(), torch.arange(8)).backward()
    torch.testing.assert_close(layer.weight.grad.cpu(), reference.weight.grad, rtol=0.02, atol=0.02)


def test_grad_scaler_float16_skips_overflowing_steps():
    layer = torch.nn.Linear(8, 1).to("tpu")
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("tpu", init_scale=1024.0)
    with torch.autocast("tpu", dtype=torch.float16):
        loss = layer(a).float().pow(2).mean()
    scaler.scale(loss).backward()
    before = layer.weight.detach().clone()
    scaler.step(optimizer)
    scaler.update()
    assert not torch.equal(layer.weight.detach(), before) and scaler.get_scale() == 1024.0
    optimizer.zero_grad()
    with torch.autocast("tpu", dtype=torch.float16):
        loss = layer(a * 1e38).float().sum()  # an inf gradient
    scaler.scale(loss).backward()
    before = layer.weight.detach().clone()
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(layer.weight.detach(), before), "an overflowing step must be skipped"
    assert scaler.get_scale() == 512.0


def test_bfloat16_training_tracks_float32():
    """The tiny Llama trained 10 steps under bf16 autocast follows the float32 run's losses."""
    pytest.importorskip("transformers")
    from torch_tpu.testing import hf_zoo

    start = hf_zoo.build("llama").to("tpu").train()
    feed = {k: v.to("tpu") for k, v in hf_zoo.inputs("llama", batch=4, seq=16, with_labels=True).items()}

    def losses(autocast: bool) -> list[float]:
        model = copy.deepcopy(start)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        history = []
        for _ in range(10):
            with torch.autocast("tpu", enabled=autocast):
                loss = model(**feed).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            history.append(loss.item())
        return history

    full, mixed = losses(False), losses(True)
    assert mixed[-1] < mixed[0] - 0.5
    assert max(abs(x - y) for x, y in zip(full, mixed)) < 0.02 * full[0], (full, mixed)
