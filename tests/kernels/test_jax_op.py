"""``torch_tpu.pallas.jax_op``: JAX and Pallas functions as PyTorch ops, in every mode, against
the same computation in PyTorch on CPU."""

from __future__ import annotations

import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import torch
from jax.experimental import pallas as pl

import torch_tpu
from torch_tpu import execution
from torch_tpu.pallas import custom_jax_kernel, interpret_mode, jax_op


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


@jax_op("test_jax_op::pallas_add")
def pallas_add(x: jax.Array, y: jax.Array) -> jax.Array:
    return pl.pallas_call(_add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)


@jax_op("test_jax_op::gelu_bias")
def gelu_bias(x: jax.Array, bias: jax.Array, approximate: str = "none") -> jax.Array:
    return jax.nn.gelu(x + bias, approximate=approximate == "tanh")


@jax_op("test_jax_op::mul_add")
def mul_add(x: jax.Array, y: jax.Array, scale: float = 1.0) -> tuple[jax.Array, jax.Array]:
    return x * y * scale, x + y


def _gelu_bias_cpu(x, bias, approximate="none"):
    return torch.nn.functional.gelu(x + bias, approximate=approximate)


def _inputs(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in shapes]


def test_strict_eager_runs_a_pallas_kernel_and_static_arguments():
    x, y = _inputs((8, 128), (8, 128))
    torch.testing.assert_close(pallas_add(x.to("tpu"), y.to("tpu")).cpu(), x + y)
    torch.testing.assert_close(torch.ops.test_jax_op.pallas_add(x.to("tpu"), y.to("tpu")).cpu(), x + y)
    b = torch.randn(128)
    for approximate in ("none", "tanh"):
        got = gelu_bias(x.to("tpu"), b.to("tpu"), approximate=approximate)
        torch.testing.assert_close(got.cpu(), _gelu_bias_cpu(x, b, approximate))
    product, total = mul_add(x.to("tpu"), y.to("tpu"), 2.0)
    torch.testing.assert_close(product.cpu(), x * y * 2.0)
    torch.testing.assert_close(total.cpu(), x + y)


def test_fused_eager_records_the_op_between_its_neighbours():
    x, b = _inputs((4, 16), (16,))
    with torch_tpu.eager_mode("fused"):
        torch_tpu.sync()
        h = x.to("tpu") * 2
        out = gelu_bias(h, b.to("tpu")) - 1
        assert execution.pending_ops() >= 3  # (mul, the op, sub: one graph, nothing ran yet)
        got = out.cpu()
    torch.testing.assert_close(got, _gelu_bias_cpu(x * 2, b) - 1)


def test_compile_traces_the_op_without_a_graph_break():
    x, y = _inputs((8, 128), (8, 128))
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: pallas_add(a, b).relu() * 3, backend="tpu", fullgraph=True)
    torch.testing.assert_close(compiled(x.to("tpu"), y.to("tpu")).cpu(), (x + y).relu() * 3)


def test_export_to_stablehlo_runs_in_jax():
    class Module(torch.nn.Module):
        def forward(self, x, b):
            return gelu_bias(x, b, approximate="tanh") * 2

    x, b = _inputs((4, 16), (16,))
    program = torch_tpu.to_stablehlo(torch.export.export(Module(), (x.to("tpu"), b.to("tpu"))))
    assert "erf" not in program.text and "tanh" in program.text
    (out,) = program(x, b)
    torch.testing.assert_close(out, _gelu_bias_cpu(x, b, "tanh") * 2)


def test_backward_is_jax_vjp_and_matches_pytorch_on_cpu():
    x, b = _inputs((4, 16), (16,), seed=1)
    x64, b64 = x.double().requires_grad_(), b.double().requires_grad_()
    _gelu_bias_cpu(x64, b64).pow(2).sum().backward()
    xt, bt = x.double().to("tpu").requires_grad_(), b.double().to("tpu").requires_grad_()
    gelu_bias(xt, bt).pow(2).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x64.grad)
    torch.testing.assert_close(bt.grad.cpu(), b64.grad)
    # two outputs, one of them unused: its gradient is zero
    xt.grad = None
    product, _ = mul_add(xt, bt.expand(4, 16), 3.0)
    product.sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), (b64.detach() * 3.0).expand(4, 16))


def test_backward_compiles_into_the_training_graph():
    x, b = _inputs((4, 16), (16,), seed=2)
    xc, bc = x.clone().requires_grad_(), b.clone().requires_grad_()
    _gelu_bias_cpu(xc, bc).sum().backward()
    xt, bt = x.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, c: gelu_bias(a, c).sum(), backend="tpu", fullgraph=True)
    compiled(xt, bt).backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)
    torch.testing.assert_close(bt.grad.cpu(), bc.grad)


def test_custom_vjp_is_respected_and_register_autograd_wins():
    @jax.custom_vjp
    def clip_grad(x):
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1.0, 1.0),))

    @jax_op("test_jax_op::clipped")
    def clipped(x: jax.Array) -> jax.Array:
        return clip_grad(x) * 1.0

    xt = torch.zeros(3, device="tpu", requires_grad=True)
    clipped(xt).backward(torch.tensor([-5.0, 0.5, 5.0], device="tpu"))
    torch.testing.assert_close(xt.grad.cpu(), torch.tensor([-1.0, 0.5, 1.0]))

    @jax_op("test_jax_op::doubled")
    def doubled(x: jax.Array) -> jax.Array:
        return 2 * x

    doubled.register_autograd(lambda ctx, grad: grad * 10)
    xt = torch.ones(3, device="tpu", requires_grad=True)
    doubled(xt).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), torch.full((3,), 10.0))


def test_autograd_can_be_turned_off_and_pallas_has_no_vjp():
    @jax_op("test_jax_op::no_grad", autograd=False)
    def no_grad(x: jax.Array) -> jax.Array:
        return x * 2

    xt = torch.ones(3, device="tpu", requires_grad=True)
    with pytest.raises(RuntimeError, match="[Aa]utograd"):
        no_grad(xt).sum().backward()
    xt = torch.ones(8, 128, device="tpu", requires_grad=True)
    with pytest.raises(RuntimeError, match="test_jax_op::pallas_add: jax.vjp of the JAX function failed"):
        pallas_add(xt, xt).sum().backward()


def test_donated_argument_is_consumed_in_strict_eager():
    @jax_op("test_jax_op::donating_add", donate_argnums=(0,))
    def donating_add(x: jax.Array, y: jax.Array) -> jax.Array:
        return x + y

    x, y = torch.ones(4, device="tpu"), torch.full((4,), 2.0, device="tpu")
    torch.testing.assert_close(donating_add(x, y).cpu(), torch.full((4,), 3.0))
    torch.testing.assert_close(y.cpu(), torch.full((4,), 2.0))
    with pytest.raises(RuntimeError, match="deleted|donated"):
        x.cpu()


def test_optional_arrays_defaults_and_no_outputs():
    @jax_op("test_jax_op::maybe_add")
    def maybe_add(x: jax.Array, y: jax.Array | None = None, bias: int = 1) -> jax.Array:
        return x + bias if y is None else x + y + bias

    x = torch.arange(3.0, device="tpu")
    torch.testing.assert_close(maybe_add(x).cpu(), torch.arange(3.0) + 1)
    torch.testing.assert_close(maybe_add(x, x, bias=3).cpu(), 2 * torch.arange(3.0) + 3)

    @jax_op("test_jax_op::nothing")
    def nothing() -> None:
        return None

    assert nothing() is None


def test_errors_name_the_op_and_argument_and_leave_the_process_usable():
    x = torch.ones(8, 128, device="tpu")
    with pytest.raises(
        RuntimeError, match=r"pallas_add: the JAX function failed for \(x: float32\[8, 128\], y"
    ):
        pallas_add(x, torch.ones(3, device="tpu"))
    with pytest.raises(RuntimeError, match="argument 'x' to be a tpu tensor, but it is on cpu"):
        pallas_add(torch.ones(2), torch.ones(2))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        pallas_add(x, torch.ones(8, 128))
    with pytest.raises(RuntimeError, match="Expected a value of type 'Tensor'"):
        pallas_add(x, 1.5)
    with pytest.raises(TypeError, match="annotate parameter 'x'"):
        jax_op("test_jax_op::unannotated", lambda x, y: x)
    torch.testing.assert_close(pallas_add(x, x).cpu(), torch.full((8, 128), 2.0))


def test_wrong_return_annotation_is_a_type_error():
    @jax_op("test_jax_op::says_one")
    def says_one(x: jax.Array) -> jax.Array:
        return x, x

    with pytest.raises(TypeError, match="returned a tuple of 2"):
        says_one(torch.ones(2, device="tpu"))


def test_custom_jax_kernel_still_works_but_is_deprecated():
    with pytest.warns(DeprecationWarning, match="use torch_tpu.pallas.jax_op"):
        kernel = custom_jax_kernel(lambda mode, x, y: x + y if mode == "add" else x - y, static_argnums=(0,))
    x, y = torch.arange(3.0, device="tpu"), torch.ones(3, device="tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(kernel("add", x, y).cpu(), torch.arange(3.0) + 1)
        torch.testing.assert_close(kernel("sub", x, y).cpu(), torch.arange(3.0) - 1)
    with pytest.warns(DeprecationWarning):
        aliased = custom_jax_kernel(lambda x, y: x + y, input_output_aliases={0: 0})
    result = aliased(x, y)
    torch.testing.assert_close(x.cpu(), torch.arange(3.0) + 1)
    assert result is x


@pytest.mark.parametrize("interpret", [None, True])
def test_a_pallas_kernel_runs_from_jax_under_interpret_mode(interpret):
    """The context ``jax_op`` traces in, for kernels called from JAX directly: None compiles on
    a TPU and interprets elsewhere, True interprets everywhere."""
    x = jnp.arange(32.0).reshape(8, 4)
    with interpret_mode(interpret):
        out = pl.pallas_call(_add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, x)
    assert (out == 2 * x).all()


def test_the_worked_example_in_docs_runs():
    text = (Path(__file__).resolve().parents[2] / "docs" / "kernels.md").read_text()
    exec(compile(text.split("```python\n", 1)[1].split("```", 1)[0], "docs/kernels.md", "exec"), {})
