"""``_grouped_mm`` (MoE expert products) against PyTorch CPU: the four operand layouts, empty
groups and rows past the last offset, gradients through autograd's formula (which calls the op
in its other layouts), argument errors, and torch.compile, where ``offs`` is only known on device.

CPU leaves the rows (2-D x 3-D) or columns (3-D x 2-D) past ``offs[-1]`` uninitialized, so only
the grouped part is compared there; tpu's are checked to be 0."""

from __future__ import annotations

import copy

import pytest
import torch

import torch_tpu  # noqa: F401

from .cases import seeded

DTYPES = [torch.float32, torch.bfloat16]
#: Group ends with an empty group, a last group ending before the jagged dimension does (16).
OFFS = [3, 3, 11]
GROUPED = OFFS[-1]
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


def _offs(device: str) -> torch.Tensor:
    return torch.tensor(OFFS, dtype=torch.int32, device=device)


#: layout -> (mat_a shape, mat_b shape, offs or None, the output's grouped part as an index)
LAYOUTS = {
    "2d x 3d": ((16, 8), (3, 8, 16), True, (slice(0, GROUPED),)),
    "3d x 2d": ((3, 8, 16), (16, 16), True, (slice(None), slice(0, GROUPED))),
    "2d x 2d": ((8, 16), (16, 8), True, (slice(None),)),
    "3d x 3d": ((3, 8, 16), (3, 16, 8), False, (slice(None),)),
}


def _operands(layout: str, dtype: torch.dtype):
    a_shape, b_shape, grouped, _ = LAYOUTS[layout]
    return seeded(*a_shape, dtype=dtype), seeded(*b_shape, dtype=dtype, seed=1), grouped


def _grouped_mm(a, b, grouped):
    return torch._grouped_mm(a, b, offs=_offs(a.device.type) if grouped else None)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_forward_matches_cpu(layout, dtype):
    a, b, grouped = _operands(layout, dtype)
    expected = _grouped_mm(a, b, grouped)
    actual = _grouped_mm(a.to("tpu"), b.to("tpu"), grouped).cpu()
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    part = LAYOUTS[layout][3]
    torch.testing.assert_close(actual[part], expected[part], **TOLERANCE[dtype])
    outside = torch.ones(actual.shape, dtype=torch.bool)
    outside[part] = False
    assert not actual[outside].any(), "entries past offs[-1] must be 0"


def test_functional_grouped_mm_with_transposed_weight():
    """Hugging Face's call: ``F.grouped_mm(x, w.transpose(-2, -1), offs=offs)`` on a strided view."""
    x, w = seeded(16, 8), seeded(3, 16, 8, seed=1)
    expected = torch.nn.functional.grouped_mm(x, w.transpose(-2, -1), offs=_offs("cpu"))
    actual = torch.nn.functional.grouped_mm(x.to("tpu"), w.to("tpu").transpose(-2, -1), offs=_offs("tpu"))
    torch.testing.assert_close(actual.cpu()[:GROUPED], expected[:GROUPED])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["2d x 3d", "3d x 3d"])
def test_gradients_match_cpu(layout, dtype):
    """Autograd's formula for 2-D x 3-D runs ``_grouped_mm`` 2-D x 3-D and 2-D x 2-D backward."""
    a, b, grouped = _operands(layout, dtype)
    part = LAYOUTS[layout][3]
    grads = []
    for device in ("cpu", "tpu"):
        leaves = [a.to(device).requires_grad_(), b.to(device).requires_grad_()]
        out = _grouped_mm(*leaves, grouped)[part]
        cotangent = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device, dtype)
        grads.append([g.cpu() for g in torch.autograd.grad(out, leaves, cotangent)])
    (a_cpu, b_cpu), (a_tpu, b_tpu) = grads
    # CPU's gradient rows past offs[-1] are uninitialized, like its forward's
    torch.testing.assert_close(a_tpu[part], a_cpu[part], **TOLERANCE[dtype])
    torch.testing.assert_close(b_tpu, b_cpu, **TOLERANCE[dtype])
    if grouped:
        assert not a_tpu[GROUPED:].any(), "gradient rows past offs[-1] must be 0"


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(
            lambda d: torch._grouped_mm(
                seeded(16, 8).double().to(d), seeded(3, 8, 8).double().to(d), offs=_offs(d)
            ),
            id="float64",
        ),
        pytest.param(lambda d: torch._grouped_mm(seeded(16, 8).to(d), seeded(3, 8, 8).to(d)), id="no offs"),
        pytest.param(
            lambda d: torch._grouped_mm(seeded(3, 8, 8).to(d), seeded(3, 8, 8).to(d), offs=_offs(d)),
            id="offs for 3d x 3d",
        ),
        pytest.param(
            lambda d: torch._grouped_mm(seeded(16, 8).to(d), seeded(3, 8, 8).to(d), offs=_offs(d).long()),
            id="int64 offs",
        ),
        pytest.param(
            lambda d: torch._grouped_mm(
                seeded(16, 8).to(d), seeded(3, 8, 8).to(d), offs=_offs(d), bias=seeded(3, 8).to(d)
            ),
            id="bias",
        ),
        pytest.param(
            lambda d: torch._grouped_mm(
                seeded(16, 8).to(d), seeded(3, 8, 8).to(d), offs=_offs(d), out_dtype=torch.bfloat16
            ),
            id="out_dtype",
        ),
        pytest.param(
            lambda d: torch._grouped_mm(
                seeded(16, 8).to(d), seeded(3, 8, 8, dtype=torch.bfloat16).to(d), offs=_offs(d)
            ),
            id="mixed dtypes",
        ),
        pytest.param(
            lambda d: torch._grouped_mm(seeded(16, 8).to(d), seeded(4, 8, 8).to(d), offs=_offs(d)),
            id="group count",
        ),
        pytest.param(
            lambda d: torch._grouped_mm(seeded(16, 8).to(d), seeded(3, 16, 8).to(d), offs=_offs(d)),
            id="contraction",
        ),
    ],
)
def test_errors_match_cpu(call):
    with pytest.raises(RuntimeError) as on_cpu:
        call("cpu")
    with pytest.raises(type(on_cpu.value)):
        call("tpu")


def test_out_dtype_equal_to_input_dtype_is_accepted():
    x, w = seeded(16, 8), seeded(3, 8, 8, seed=1)
    out = torch._grouped_mm(x.to("tpu"), w.to("tpu"), offs=_offs("tpu"), out_dtype=torch.float32)
    torch.testing.assert_close(out.cpu()[:GROUPED], torch._grouped_mm(x, w, offs=_offs("cpu"))[:GROUPED])


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_matches_eager_for_every_routing(fresh_dynamo):
    """One compiled program serves offsets it only sees on device (float32: past PyTorch's
    bfloat16-only meta kernel)."""

    def expert_layer(x, w, offs):
        return torch._grouped_mm(x, w, offs=offs).relu() * 2

    compiled = torch.compile(expert_layer, backend="tpu")
    x, w = seeded(16, 8).to("tpu"), seeded(3, 8, 16, seed=1).to("tpu")
    for ends in (OFFS, [1, 9, 16], [0, 0, 0]):
        offs = torch.tensor(ends, dtype=torch.int32, device="tpu")
        torch.testing.assert_close(compiled(x, w, offs).cpu(), expert_layer(x, w, offs).cpu())


def test_fake_kernel_keeps_pytorch_meta_checks_off_tpu():
    meta = dict(device="meta")
    with pytest.raises(RuntimeError, match="BF16"):
        torch._grouped_mm(
            torch.empty(16, 8, **meta),
            torch.empty(3, 8, 8, **meta),
            offs=torch.empty(3, dtype=torch.int32, **meta),
        )
    out = torch._grouped_mm(
        torch.empty(16, 8, dtype=torch.bfloat16, **meta),
        torch.empty(3, 8, 8, dtype=torch.bfloat16, **meta),
        offs=torch.empty(3, dtype=torch.int32, **meta),
    )
    assert out.shape == (16, 8) and out.dtype == torch.bfloat16


def test_compiled_mixtral_matches_cpu(fresh_dynamo):
    pytest.importorskip("transformers")
    from torch_tpu.testing import hf_zoo

    cpu = hf_zoo.build("mixtral")
    feed = hf_zoo.inputs("mixtral")
    compiled = torch.compile(copy.deepcopy(cpu).to("tpu"), backend="tpu")
    with torch.no_grad():
        actual = hf_zoo._primary_output(compiled(**hf_zoo._on(feed, "tpu")))
        expected = hf_zoo._primary_output(cpu(**feed))
    assert hf_zoo._rel(actual, expected) < 1e-4
