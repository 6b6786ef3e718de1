"""``torch.compile(backend="tpu")``: Dynamo graphs traced through the eager lowerings into one
``jax.jit`` each, against CPU and eager."""

from __future__ import annotations

import copy
import logging
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

import torch_tpu
import torch_tpu.frontends.compile
from torch_tpu.demo.model import GPT, GPTConfig
from torch_tpu.frontends.compile import Program, bucket_size, pad_to_bucket
from torch_tpu.runtime import buffer as _buffer
from torch_tpu.runtime import events


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def log_recompiles(monkeypatch):
    monkeypatch.setattr(events, "printing", True)


def _tiny_gpt(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16, **overrides))


def _batch():
    tokens = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(1))
    return tokens, tokens.roll(1, 1)


def test_compiled_forward_and_backward_match_cpu():
    model = _tiny_gpt()
    tokens, targets = _batch()
    cpu = copy.deepcopy(model)
    _, cpu_loss = cpu(tokens, targets=targets)
    cpu_loss.backward()
    tpu = copy.deepcopy(model).to("tpu")
    compiled = torch.compile(tpu, backend="tpu")
    for _ in range(2):  # the second call reuses the compiled graphs
        tpu.zero_grad()
        _, loss = compiled(tokens.to("tpu"), targets=targets.to("tpu"))
        loss.backward()
    torch.testing.assert_close(loss.cpu(), cpu_loss, rtol=1e-5, atol=1e-6)
    for (name, expected), actual in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(
            actual.grad.cpu(), expected.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}"
        )


def test_autocast_and_activation_checkpointing():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    x = torch.randn(3, 8)
    tpu = copy.deepcopy(model).to("tpu")
    with torch.autocast("tpu"):  # the casts are in the graph once, not applied again
        compiled, eager = torch.compile(tpu, backend="tpu")(x.to("tpu")), tpu(x.to("tpu"))
    assert compiled.dtype == eager.dtype == torch.bfloat16
    torch.testing.assert_close(compiled.cpu(), eager.cpu())

    torch._dynamo.reset()
    checkpointed = torch.compile(
        lambda t: torch.utils.checkpoint.checkpoint(tpu, t, use_reentrant=False).sum(), backend="tpu"
    )
    x_tpu, x_cpu = x.to("tpu").requires_grad_(), x.clone().requires_grad_()
    checkpointed(x_tpu).backward()
    torch.utils.checkpoint.checkpoint(model, x_cpu, use_reentrant=False).sum().backward()
    torch.testing.assert_close(x_tpu.grad.cpu(), x_cpu.grad)


class _LocalModel(torch.nn.Module):
    """A model defined outside torch_tpu, next to the package's own GPT."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(32, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 32)

    def forward(self, idx):
        return self.head(self.norm(self.embedding(idx)))


def _package_gpt():
    return GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16))


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _max_error(actual: torch.Tensor, exact: torch.Tensor) -> float:
    return (actual.cpu().double() - exact).abs().max().item()


@pytest.mark.parametrize("make_model", [_package_gpt, _LocalModel], ids=["package", "local"])
def test_switching_autocast_compiles_one_graph_per_state(make_model):
    """Switching ``torch.autocast("tpu")`` on and off between calls compiles one graph per state
    and runs every call compiled, for torch_tpu's own demo GPT as for a model defined here (the
    GPT used to fall back to eager for good: its file sat in Dynamo's skip list from the first
    compile on). Each result is as close to a float64 CPU reference as eager's under the same
    state, within a factor 2 (the two round at different points)."""
    torch.manual_seed(0)
    model = make_model().eval()
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    exact = _first(copy.deepcopy(model).double()(tokens)).detach()
    tpu = model.to("tpu")
    compiled = torch.compile(tpu, backend="tpu")
    torch.tpu.reset_compilation_cache_stats()
    for enabled in (False, True, False, True):
        with torch.autocast("tpu", enabled=enabled):
            out, eager = _first(compiled(tokens.to("tpu"))), _first(tpu(tokens.to("tpu")))
        assert out.dtype == eager.dtype == (torch.bfloat16 if enabled else torch.float32)
        assert _max_error(out, exact) <= 2 * _max_error(eager, exact)
    stats = torch.tpu.compilation_cache_stats()
    assert stats["compiled_runs"] == 4 and stats["compiled_graphs"] == 2


_DYNAMO_RULES = """
import sys, torch, torch_tpu
from torch_tpu.integrations import autocast
from torch_tpu.demo.model import GPT
from torch_tpu.testing import hf_zoo
assert "torch._dynamo" not in sys.modules  # import torch_tpu leaves Dynamo unimported
assert "jax" not in sys.modules            # nor JAX
from torch._dynamo import trace_rules  # the rules are in place from here, before any compile
torch.tpu.init()
from torch_tpu.frontends.compile import Program
runtime = [autocast._policy_kernel("lower", torch.ops.aten.mm.default), torch_tpu.sync,
           torch.tpu.synchronize, torch.tpu.current_device, Program.__call__]
user_code = [GPT.forward, hf_zoo.build]
print([trace_rules.check(f) for f in runtime], [trace_rules.check(f) for f in user_code])
"""


def test_dynamo_skips_the_runtime_but_not_models_in_the_package():
    """From the moment Dynamo is imported, it skips torch_tpu's runtime (kernels, the device
    module, the compile backend) and traces the package's user-level code (the demo GPT, the
    test helpers) like any model."""
    out = subprocess.run(
        [sys.executable, "-c", _DYNAMO_RULES], check=True, capture_output=True, text=True
    ).stdout
    assert out.split("\n")[0] == "[True, True, True, True, True] [False, False]"


def _codes_dynamo_saw() -> list:
    """The code of every frame handed to Dynamo since the last ``torch._dynamo.reset()`` (skipped
    ones included)."""
    from torch._dynamo import convert_frame

    return [code for code in (ref() for ref in convert_frame.input_codes.seen) if code is not None]


def test_eager_ops_between_graphs_never_reach_dynamo():
    """Between two graph pieces, eager ops run torch_tpu's kernels (here the autocast kernel of a
    matmul, and a host read); neither they nor what they call (JAX, ml_dtypes, logging) is ever
    handed to Dynamo, which would otherwise compile such frames one by one."""
    import jax
    import ml_dtypes

    @torch._dynamo.disable(recursive=False)  # skips this frame only, as a graph break does
    def eager_matmul(a, b):
        return a @ b

    def f(x):
        y = eager_matmul(x, x)
        return y.sin() * y.sum().item()

    x = torch.randn(4, 4).to("tpu")
    with torch.autocast("tpu"):
        torch.compile(f, backend="tpu")(x)
    ours = tuple(os.path.dirname(m.__file__) for m in (torch_tpu, jax, ml_dtypes, logging))
    assert not sorted({code.co_filename for code in _codes_dynamo_saw() if code.co_filename.startswith(ours)})


def test_backward_hooks_stay_visible_to_dynamo():
    """``backward()`` runs through torch_tpu's autograd engine, yet the hooks it calls reach
    Dynamo as they do without torch_tpu: only the engine's own frame is skipped."""

    def doubling_hook(grad):
        return grad * 2

    w = torch.ones(3, requires_grad=True)
    w.register_hook(doubling_hook)

    @torch.compile(backend="eager")
    def step(w):
        loss = (w * 3).sum()
        loss.backward()
        return loss

    step(w)
    assert torch.equal(w.grad, torch.full((3,), 6.0))
    assert doubling_hook.__code__ in _codes_dynamo_saw()


def test_every_package_file_is_runtime_or_user_code():
    """``RUNTIME_PATHS`` names files that exist, and every other file of the package is code
    Dynamo may trace on purpose: a moved or new file has to be classified."""
    from torch_tpu.runtime import dynamo

    root = Path(torch_tpu.__file__).parent
    assert all((root / path).exists() for path in dynamo.RUNTIME_PATHS)
    traced = {f.relative_to(root).as_posix() for f in root.rglob("*.py") if not dynamo.is_runtime(str(f))}
    assert traced and all(f.startswith(("demo/", "testing/", "kernels/")) for f in traced)


def test_one_executable_per_graph_and_no_recompile_on_repeat():
    f = torch.compile(lambda x, w: torch.relu(x @ w).sum(0), backend="tpu")
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    torch.tpu.reset_compilation_cache_stats()
    for _ in range(3):
        out = f(x.to("tpu"), w.to("tpu"))
    torch.testing.assert_close(out.cpu(), torch.relu(x @ w).sum(0))
    stats = torch.tpu.compilation_cache_stats()
    assert stats["compiled_graphs"] == 1 and stats["compiled_runs"] == 3


def test_graph_breaks_run_each_piece():
    def f(x):
        y = torch.sin(x) * 2
        if y.sum().item() > 0:  # a host read: Dynamo breaks the graph here
            y = y + 1
        return torch.cos(y)

    x = torch.linspace(0, 1, 8)
    torch.tpu.reset_compilation_cache_stats()
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x.to("tpu")).cpu(), f(x))
    assert torch.tpu.compilation_cache_stats()["compiled_graphs"] == 2


@pytest.mark.parametrize("capturable", [True, False])
def test_whole_training_step_matches_cpu(capturable):
    """Forward, backward and AdamW in one compiled function: parameters and optimizer state on
    tpu (a non-capturable AdamW keeps its step counts on the CPU, written back each step)."""
    model = _tiny_gpt()
    tokens, targets = _batch()

    def make_step(m, optimizer):
        def step(x, y):
            _, loss = m(x, targets=y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        return step

    cpu = copy.deepcopy(model)
    cpu_step = make_step(cpu, torch.optim.AdamW(cpu.parameters(), lr=1e-2))
    tpu = copy.deepcopy(model).to("tpu")
    optimizer = torch.optim.AdamW(tpu.parameters(), lr=1e-2, capturable=capturable)
    tpu_step = torch.compile(make_step(tpu, optimizer), backend="tpu")
    for _ in range(3):
        expected = cpu_step(tokens, targets)
        loss = tpu_step(tokens.to("tpu"), targets.to("tpu"))
        torch.testing.assert_close(loss.cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    # atol: the attention key bias's gradient is zero in exact arithmetic, so both sides hold
    # rounding noise there, which Adam's g / (|g| + eps) scales up to the learning rate
    for (name, expected), actual in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(
            actual.detach().cpu(), expected.detach(), rtol=1e-4, atol=5e-4, msg=lambda m: f"{name}: {m}"
        )
    step_device = optimizer.state[next(tpu.parameters())]["step"].device.type
    assert step_device == ("tpu" if capturable else "cpu")


def test_optimizer_update_donates_old_buffers():
    """The compiled optimizer graph writes parameters and state in place: XLA reuses the old
    buffers (donated), so an update never holds two copies of the model."""
    model = torch.nn.Linear(8, 8).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
    model(torch.ones(2, 8, device="tpu")).sum().backward()

    @torch.compile(backend="tpu")
    def update():
        optimizer.step()

    update()  # creates the state
    old = weakref.ref(_buffer.get(model.weight.untyped_storage()))
    before = model.weight.detach().cpu()
    torch.tpu.reset_compilation_cache_stats()
    update()
    assert old() is None or old().is_deleted()
    assert torch.tpu.compilation_cache_stats()["donated_buffers"] >= 2 * 4  # weight, bias x 4
    assert not torch.equal(model.weight.detach().cpu(), before)


def test_shared_buffer_is_never_donated():
    """Two storages may hold one array (``a.copy_(b)``): the update must keep the other's."""
    a = torch.zeros(4, device="tpu")
    b = torch.ones(4, device="tpu")
    a.copy_(b)

    @torch.compile(backend="tpu")
    def bump(t):
        with torch.no_grad():
            t.add_(1)

    bump(a)
    torch.testing.assert_close(a.cpu(), torch.full((4,), 2.0))
    torch.testing.assert_close(b.cpu(), torch.ones(4))


def test_input_mutation_and_aliased_output():
    @torch.compile(backend="tpu")
    def f(x):
        x.mul_(2)
        return x[1:], x.t()

    x = torch.arange(6.0).reshape(2, 3)
    tail, transposed = f(x_tpu := x.to("tpu"))
    torch.testing.assert_close(x_tpu.cpu(), x * 2)
    torch.testing.assert_close(tail.cpu(), (x * 2)[1:])
    torch.testing.assert_close(transposed.cpu(), (x * 2).t())


def test_dropout_follows_manual_seed_and_differs_between_steps():
    dropout = torch.nn.Dropout(0.5)
    f = torch.compile(lambda x: dropout(x) + 0, backend="tpu")
    x = torch.ones(4096, device="tpu")
    torch.manual_seed(3)
    first, second = f(x).cpu(), f(x).cpu()
    torch.manual_seed(3)
    again = f(x).cpu()
    assert torch.equal(first, again)
    assert not torch.equal(first, second)
    assert set(first.unique().tolist()) == {0.0, 2.0}
    assert 0.45 < (first == 0).float().mean().item() < 0.55


def test_new_shape_recompiles_with_the_reason_logged(capfd, log_recompiles):
    f = torch.compile(lambda x: (x * 2).sum(-1), backend="tpu")
    for n in (5, 7):
        out = f(torch.arange(n, dtype=torch.float32, device="tpu").reshape(1, n))
    assert out.item() == 42
    err = capfd.readouterr().err
    assert "recompiles frame" in err and "float32[1, 5] -> float32[1, s" in err


def test_dynamic_without_bounded_dynamism_compiles_each_shape_once(caplog):
    # (with it, the default, sizes share bucketed programs: tests/test_buckets.py)
    f = torch.compile(
        lambda x: torch.softmax(x, -1).sum(-1),
        backend="tpu",
        dynamic=True,
        options={"bounded_dynamism": False},
    )
    torch.tpu.reset_compilation_cache_stats()
    with caplog.at_level(logging.INFO, logger="torch_tpu"):  # always logged, printed on request
        for n in (3, 5, 3, 5, 9):
            x = torch.randn(2, n)
            torch.testing.assert_close(f(x.to("tpu")).cpu(), torch.softmax(x, -1).sum(-1))
    assert torch.tpu.compilation_cache_stats()["compiled_graphs"] == 3  # one per distinct shape
    assert re.search(r"argument \d changed from 3 to 5", caplog.text)


def test_modes_are_accepted_and_bad_arguments_are_clear():
    x = torch.ones(3, device="tpu")
    for mode in ("default", "reduce-overhead", "max-autotune"):
        torch._dynamo.reset()
        assert torch.compile(lambda t: t + 1, backend="tpu", mode=mode)(x).sum().item() == 6
    torch._dynamo.reset()
    with pytest.raises(Exception, match="Unrecognized mode=fastest"):
        torch_tpu.frontends.compile.backend(torch.fx.symbolic_trace(lambda t: t + 1), [x], mode="fastest")
    with pytest.raises(RuntimeError, match="unknown options"):
        torch_tpu.frontends.compile.backend(
            torch.fx.symbolic_trace(lambda t: t + 1), [x], options={"trace.enabled": True}
        )


def test_out_of_range_index_is_reported_not_clamped():
    embedding = torch.nn.Embedding(10, 4).to("tpu")
    compiled = torch.compile(embedding, backend="tpu")
    with pytest.raises(IndexError, match="index out of range"):
        compiled(torch.tensor([1, 12], device="tpu"))
        torch.tpu.synchronize()
    assert compiled(torch.tensor([1, 2], device="tpu")).shape == (2, 4)  # still usable


def test_program_of_an_fx_graph():
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(lambda x: (x.exp() * 2).sum())(torch.ones(3))
    program = Program(graph)
    assert "stablehlo.exponential" in program.stablehlo(torch.ones(3, device="tpu"))
    assert program(torch.zeros(3, device="tpu")).item() == 6.0


def test_data_dependent_op_in_a_graph_names_itself():
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(lambda x: torch.nonzero(x))(torch.tensor([0.0, 1.0]))
    with pytest.raises(NotImplementedError, match="nonzero.*host"):
        Program(graph)(torch.tensor([0.0, 1.0], device="tpu"))


def test_host_inputs_and_outputs():
    @torch.compile(backend="tpu")
    def f(x, scale):
        return (x * scale).cpu(), x + 1

    x = torch.arange(3.0)
    on_host, on_tpu = f(x.to("tpu"), torch.tensor(2.0))
    assert on_host.device.type == "cpu" and on_tpu.device.type == "tpu"
    torch.testing.assert_close(on_host, x * 2)
    torch.testing.assert_close(on_tpu.cpu(), x + 1)


def test_compiled_call_inside_fused_eager():
    f = torch.compile(lambda x: x.exp().sum(), backend="tpu")
    with torch_tpu.eager_mode("fused"):
        x = torch.ones(4, device="tpu") * 2  # pending in the fused graph
        assert f(x).item() == pytest.approx(4 * 7.389056, rel=1e-6)


def test_pad_to_bucket():
    assert [bucket_size(n, (16, 32)) for n in (0, 1, 16, 17, 33)] == [16, 16, 16, 32, 64]
    assert bucket_size(65, multiple=64) == 128
    ids = torch.arange(10).reshape(2, 5)
    padded = pad_to_bucket(ids, buckets=(8,), value=-1)
    assert padded.shape == (2, 8) and padded[:, 5:].eq(-1).all() and torch.equal(padded[:, :5], ids)
    assert pad_to_bucket(ids, dim=0, buckets=(4,)).shape == (4, 5)
    with pytest.raises(ValueError):
        bucket_size(-1)


def test_transformers_static_cache_generation_compiles_on_tpu():
    """Transformers compiles generation with backend "tpu" for a static KV cache."""
    pytest.importorskip("transformers")
    from torch_tpu.testing import hf_zoo

    model = hf_zoo.build("llama")
    feed = hf_zoo.inputs("llama")
    options = dict(max_new_tokens=8, do_sample=False, cache_implementation="static")
    expected = model.generate(**feed, **options)
    tpu = copy.deepcopy(model).to("tpu")
    tpu_feed = {k: v.to("tpu") for k, v in feed.items()}
    torch.tpu.reset_compilation_cache_stats()
    generated = tpu.generate(**tpu_feed, **options)
    assert torch.tpu.compilation_cache_stats()["compiled_runs"] > 0
    assert torch.equal(generated.cpu(), expected)
    eager = tpu.generate(**tpu_feed, **options, disable_compile=True)
    assert torch.equal(generated, eager)


def test_docstring_examples_run():
    import doctest

    result = doctest.testmod(torch_tpu.frontends.compile)
    assert result.attempted >= 3 and result.failed == 0


def test_the_default_backend_compiles_tpu_graphs_with_the_tpu_backend():
    """``torch.compile(model)`` (Inductor, whose Pallas code generator for a "tpu" device fails
    on the stand-in and turns JAX's 64-bit types off process-wide) on tpu inputs runs the "tpu"
    backend: CPU's result, and int64 ops still work after it."""
    import jax

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.GELU())
    x = torch.randn(3, 8)
    expected = model(x)
    compiled = torch.compile(model.to("tpu"))
    torch.testing.assert_close(compiled(x.to("tpu")).cpu(), expected, rtol=1e-5, atol=1e-5)
    assert jax.config.jax_enable_x64
    big = torch.tensor([2**40, 3], device="tpu")
    assert (big * 2).tolist() == [2**41, 6]
