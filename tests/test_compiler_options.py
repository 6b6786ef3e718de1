"""Compiler control: ``torch.tpu.compiler`` options process-wide and per ``torch.compile`` call,
``torch.tpu.precision`` for a block, and XLA's own ops as ``torch.tpu.ops``."""

from __future__ import annotations

import jax
import pytest
import torch

import torch_tpu
from torch_tpu.runtime import compiler


@pytest.fixture
def options_seen(monkeypatch):
    """The compile options of every program compiled through ``Lowered.compile`` (fused graphs,
    compiled programs) while the test runs; the process's options reset after it."""
    seen: list[dict] = []
    compile_lowered = jax.stages.Lowered.compile

    def spy(self, compiler_options=None, **kwargs):
        seen.append(dict(compiler_options or {}))
        return compile_lowered(self, compiler_options, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
    yield seen
    compiler.reset_options()


def test_options_are_set_read_scoped_and_reset():
    torch.tpu.compiler.set_options(optimization_level=1, exec_time_optimization_effort=0.5)
    assert torch.tpu.compiler.get_options() == {"optimization_level": 1, "exec_time_optimization_effort": 0.5}
    assert jax.config.jax_exec_time_optimization_effort == 0.5
    with torch.tpu.compiler.options(optimization_level=3):
        assert torch.tpu.compiler.get_options()["optimization_level"] == 3
    assert torch.tpu.compiler.get_options()["optimization_level"] == 1
    torch.tpu.compiler.reset_options()
    assert torch.tpu.compiler.get_options() == {} and jax.config.jax_exec_time_optimization_effort == 0.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"optimisation_level": 1},
            "unknown torch.tpu.compiler option 'optimisation_level'; known options: ",
        ),
        ({"xla_no_such_flag": True}, "known options: exec_time_optimization_effort, memory_fitting_effort"),
        ({"optimization_level": 7}, "must be an int from 0 to 3, got 7"),
        ({"memory_fitting_effort": 2.0}, "must be a number from -1 to 1"),
    ],
)
def test_bad_options_are_refused_with_the_known_ones(options, message):
    with pytest.raises(ValueError, match=message):
        torch.tpu.compiler.set_options(**options)
    assert torch.tpu.compiler.get_options() == {}


def test_fused_graphs_compile_with_the_process_options(options_seen):
    x = torch.randn(6, 5, device="tpu")

    def run() -> torch.Tensor:
        with torch_tpu.eager_mode("fused"):
            return (x * 3 + 1).tanh().sum().cpu()

    expected = run()
    torch.tpu.compiler.set_options(optimization_level=1, xla_cpu_enable_fast_math=False)
    got = run()  # (the graph compiled before is not reused: it has other options)
    assert {"xla_backend_optimization_level": 1, "xla_cpu_enable_fast_math": False}.items() <= options_seen[
        -1
    ].items()
    torch.testing.assert_close(got, expected)


def test_torch_compile_options_reach_its_programs(options_seen, tmp_path, monkeypatch):
    from torch_tpu import config
    from torch_tpu.frontends.compile import stored

    # (empty caches: a program stored by an earlier run would load instead of compiling)
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    stored._cache.cache_clear()
    x = torch.randn(4, 3)
    for level in (0, 1):  # (the same graph: each call's options give its own programs)
        torch._dynamo.reset()
        fn = torch.compile(lambda x: (x @ x.T).relu(), backend="tpu", options={"optimization_level": level})
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), (x @ x.T).relu())
        assert options_seen and options_seen[-1]["xla_backend_optimization_level"] == level
    stored._cache.cache_clear()
    torch._dynamo.reset()


def test_torch_compile_refuses_unknown_and_process_wide_options():
    x = torch.randn(3, device="tpu")
    with pytest.raises(RuntimeError, match=r"unknown options \['bogus'\].*torch.tpu.compiler's options"):
        torch.compile(lambda x: x + 1, backend="tpu", options={"bogus": 1})(x)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="'memory_fitting_effort' is process-wide"):
        torch.compile(lambda x: x + 2, backend="tpu", options={"memory_fitting_effort": 0.5})(x)
    torch._dynamo.reset()


def test_precision_sets_the_matmul_precision_for_a_block_only():
    before = torch.get_float32_matmul_precision()
    with pytest.raises(KeyError), torch.tpu.precision("medium"):
        assert torch.get_float32_matmul_precision() == "medium"
        raise KeyError("inside")
    assert torch.get_float32_matmul_precision() == before


# ----------------------------------------------------------------------------- torch.tpu.ops
def _ragged_case():
    torch.manual_seed(0)
    return (
        torch.randn(9, 4, dtype=torch.float64),
        torch.randn(3, 4, 5, dtype=torch.float64),
        torch.tensor([2, 0, 5]),
    )


def _reference(lhs, rhs, sizes):
    out, start = torch.zeros(lhs.shape[0], rhs.shape[2], dtype=lhs.dtype), 0
    for group, size in enumerate(sizes.tolist()):
        out[start : start + size] = lhs[start : start + size] @ rhs[group]
        start += size
    return out


@pytest.mark.parametrize("how", ["strict", "fused", "compiled"])
def test_ragged_dot_equals_the_grouped_products_forward_and_backward(how):
    lhs64, rhs64, sizes = _ragged_case()
    lhs, rhs = lhs64.float().to("tpu").requires_grad_(), rhs64.float().to("tpu").requires_grad_()

    def loss(a, b, g):
        return torch.tpu.ops.ragged_dot(a, b, g).pow(2).sum()

    run = torch.compile(loss, backend="tpu") if how == "compiled" else loss
    with torch_tpu.eager_mode("fused" if how == "fused" else "strict"):
        run(lhs, rhs, sizes.to("tpu")).backward()
    a, b = lhs64.clone().requires_grad_(), rhs64.clone().requires_grad_()
    _reference(a, b, sizes).pow(2).sum().backward()
    tolerance = dict(rtol=1e-5, atol=1e-5)  # (float32 against float64: sums of 4 products)
    torch.testing.assert_close(lhs.grad.cpu().double(), a.grad, **tolerance)
    torch.testing.assert_close(rhs.grad.cpu().double(), b.grad, **tolerance)
    got = torch.tpu.ops.ragged_dot(lhs.detach(), rhs.detach(), sizes.to("tpu"))
    torch.testing.assert_close(got.cpu().double(), _reference(lhs64, rhs64, sizes), **tolerance)


def test_ragged_dot_on_cpu_is_the_reference_and_bad_shapes_are_refused():
    lhs, rhs, sizes = _ragged_case()
    torch.testing.assert_close(torch.tpu.ops.ragged_dot(lhs, rhs, sizes), _reference(lhs, rhs, sizes))
    with pytest.raises(ValueError, match="do not fit"):
        torch.tpu.ops.ragged_dot(lhs, rhs[:, :3], sizes)
    with pytest.raises(ValueError, match=r"expected lhs \[m, k\]"):
        torch.tpu.ops.ragged_dot(lhs[0], rhs, sizes)
    with pytest.raises(TypeError, match="group_sizes must be integers"):
        torch.tpu.ops.ragged_dot(lhs, rhs, sizes.double())


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_optimization_barrier_passes_values_and_gradients_unchanged(device):
    x = torch.arange(4.0, device=device, requires_grad=True)
    y = torch.ones(2, 2, device=device)
    a, b = torch.tpu.ops.optimization_barrier(x * 2, y)
    (a * 3).sum().backward()
    assert a.tolist() == [0.0, 2.0, 4.0, 6.0] and b.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert x.grad.tolist() == [6.0] * 4
    compiled = torch.compile(lambda t: torch.tpu.ops.optimization_barrier(t.sin())[0].cos(), backend="tpu")
    if device == "tpu":
        torch.testing.assert_close(compiled(x.detach()).cpu(), x.detach().cpu().sin().cos())
