"""Compiled graphs stored on disk (``torch_tpu.frontends.compile.stored``): reused by a later
process only for the very program a call needs, with the same results as compiling it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu import config
from torch_tpu.frontends.compile import stored


@pytest.fixture
def stored_hits(tmp_path, monkeypatch):
    """A fresh graph cache directory (and AOTAutograd cache directory); the list records, per
    executable a compiled graph needed, whether the store had it."""
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    stored._cache.cache_clear()
    hits: list[bool] = []
    load = stored.load_executable

    def counted(graph, donated, index, options=None):
        run = load(graph, donated, index, options)
        hits.append(run is not None)
        return run

    monkeypatch.setattr(stored, "load_executable", counted)
    yield hits
    stored._cache.cache_clear()


def _fresh_compile(x, w):
    """``f`` compiled anew (as in a new process: Dynamo and the program traced again)."""
    torch._dynamo.reset()
    return torch.compile(lambda x, w: (x @ w).relu() * 2, backend="tpu")(x.to("tpu"), w.to("tpu"))


def _variants():
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    return {
        "dtype": (x.double(), w.double()),
        "shape": (torch.randn(5, 8), w),
        "strides": (torch.randn(8, 4).t(), w),  # same shape and dtype, transposed storage
        "requires_grad": (x, w.clone().requires_grad_()),
    }, (x, w)


@pytest.mark.parametrize("change", ["dtype", "shape", "strides", "requires_grad", "precision"])
def test_a_stored_program_is_reused_only_for_the_same_call(stored_hits, change):
    variants, (x, w) = _variants()
    for _ in range(2):  # stored by the first compile, read back by the second
        torch.testing.assert_close(_fresh_compile(x, w).detach().cpu(), (x @ w).relu() * 2)
    assert stored_hits == [False, True]
    before = torch.get_float32_matmul_precision()
    try:
        if change == "precision":
            torch.set_float32_matmul_precision("medium")
            new_x, new_w = x, w
        else:
            new_x, new_w = variants[change]
        expected = (new_x @ new_w).relu() * 2
        torch.testing.assert_close(_fresh_compile(new_x, new_w).detach().cpu(), expected.detach())
    finally:
        torch.set_float32_matmul_precision(before)
    assert not any(stored_hits[2:])  # a new program, not the stored one


_TRAINING = """
import json, torch, torch_tpu
from torch_tpu.demo.model import GPT, GPTConfig
from torch_tpu.frontends.compile import program

traced = 0
staged = program.Program._staged
def counted(*args, **kwargs):
    global traced
    traced += 1
    return staged(*args, **kwargs)
program.Program._staged = counted

torch.manual_seed(0)
model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16)).to("tpu")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)

@torch.compile(backend="tpu")
def step(idx, targets):
    _, loss = model(idx, targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss

idx = torch.randint(0, 32, (2, 8)).to("tpu")
losses = [step(idx, idx).item() for _ in range(2)]
weights = [p.detach().cpu().double().sum().item() for p in model.parameters()]
_, loss = torch.compile(model, backend="tpu")(idx, idx)  # (the grads: a step zeroes its own)
loss.backward()
grads = [p.grad.cpu().double().sum().item() for p in model.parameters()]
lookup = torch.compile(lambda i, w: torch.nn.functional.embedding(i, w).sum(), backend="tpu")
table = torch.randn(4, 3, device="tpu")
try:
    lookup(torch.tensor([1, 9], device="tpu"), table).item()
    error = None
except IndexError as e:
    error = str(e).splitlines()[0]
stats = torch.tpu.compilation_cache_stats()
aot = torch._dynamo.utils.counters["aot_autograd"]
print(json.dumps(dict(losses=losses, weights=weights, grads=grads, error=error, traced=traced,
                      xla_compiles=stats["xla_compiles"], graphs=stats["compiled_graphs"],
                      aot_hits=aot["autograd_cache_hit"], aot_saved=aot["autograd_cache_saved"])))
"""


def test_a_second_process_reads_the_stored_graphs_and_computes_the_same(tmp_path):
    """A training step (forward, backward, donating AdamW update) and a lookup whose index check
    fails: the second process traces nothing to run them (graphs with index checks are traced for
    the checks' callbacks when those are reported), compiles nothing, and gets identical values
    and the same error."""
    first, second = (_run(_TRAINING, tmp_path) for _ in range(2))
    assert first["error"] and "index out of range" in first["error"].lower()
    assert first["xla_compiles"] > 0 and second["xla_compiles"] == 0
    # the step's forward and backward, its optimizer update, the model's own forward and
    # backward, the lookup: AOTAutograd's work is read back from its cache
    assert first["aot_saved"] == second["aot_hits"] == 4 and second["aot_saved"] == 0
    assert first["traced"] == first["graphs"] == second["graphs"] == 6
    # only the graphs with index checks (the forwards' embedding and cross-entropy, the lookup)
    # are traced, abstractly, for their checks' callbacks when those are first reported
    assert second["traced"] == 3
    for name in ("losses", "weights", "grads", "error"):
        assert second[name] == first[name]


def _run(script: str, cache: pathlib.Path, *args: str, **env: str) -> dict:
    """The last line of ``script``'s output (JSON), run in a fresh process with the caches
    (ours and AOTAutograd's) under ``cache``."""
    caches = {"TORCH_TPU_CACHE_DIR": str(cache / "tpu"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
    env = {**os.environ, **caches, **env}
    out = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


_VARIANTS = """
import contextlib, json, sys, torch, torch_tpu
from torch._dynamo.utils import counters

x, w = torch.randn(4, 8), torch.randn(8, 3)
# name -> (x, w, the tpu device, the context of the call)
variants = {
    "same": (x, w, "tpu", contextlib.nullcontext),
    "dtype": (x.double(), w.double(), "tpu", contextlib.nullcontext),
    "shape": (torch.randn(5, 8), w, "tpu", contextlib.nullcontext),
    "strides": (torch.randn(8, 4).t(), w, "tpu", contextlib.nullcontext),
    "requires_grad": (x, w.clone().requires_grad_(), "tpu", contextlib.nullcontext),
    "device": (x, w, "tpu:1", contextlib.nullcontext),
    "autocast": (x, w, "tpu", lambda: torch.autocast("tpu", dtype=torch.bfloat16)),
    "precision": (x, w, "tpu", lambda: _precision("medium")),
    "eager_mode": (x, w, "tpu", lambda: torch_tpu.eager_mode("fused")),
}
reference_context = {"autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16)}

@contextlib.contextmanager
def _precision(name):
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(name)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)

f = lambda x, w: (x @ w).relu() * 2
results = {}
for name in sys.argv[1:]:
    x, w, device, context = variants[name]
    torch._dynamo.reset()  # (Dynamo and AOTAutograd run again: their cache is on disk)
    before = dict(counters["aot_autograd"])
    with context():
        got = torch.compile(f, backend="tpu")(x.to(device), w.to(device))
        got = got.detach().cpu()
    with reference_context.get(name, contextlib.nullcontext)():
        expected = f(x, w).detach()
    torch.testing.assert_close(got, expected)
    after = counters["aot_autograd"]
    results[name] = {k: after[k] - before.get(k, 0) for k in ("autograd_cache_hit", "autograd_cache_saved")}
print(json.dumps(results))
"""
#: (the precision last: setting it back leaves PyTorch's CUDA matmul setting, part of its keys,
#: different from never having set it)
_OTHERS = ("dtype", "shape", "strides", "requires_grad", "device", "autocast", "eager_mode", "precision")


def test_aotautograd_reuses_a_stored_graph_only_for_the_same_call(tmp_path):
    """PyTorch's AOTAutograd cache hands a later process our compiled graph (without its
    executables) for the same call, and never when the inputs' dtype, shape, strides,
    requires_grad or device, the autocast state, the float32 matmul precision or the eager mode
    differ; every result equals CPU's."""
    two_devices = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert _run(_VARIANTS, tmp_path, "same", **two_devices) == {
        "same": {"autograd_cache_hit": 0, "autograd_cache_saved": 1}
    }
    later = _run(_VARIANTS, tmp_path, "same", *_OTHERS, **two_devices)
    assert later.pop("same") == {"autograd_cache_hit": 1, "autograd_cache_saved": 0}
    assert later == {name: {"autograd_cache_hit": 0, "autograd_cache_saved": 1} for name in _OTHERS}


def test_no_persistent_cache_means_no_aotautograd_entries(tmp_path):
    """``TORCH_TPU_CACHE_DIR=0``: AOTAutograd's cache is neither read nor written for our graphs."""
    for _ in range(2):
        result = _run(_VARIANTS, tmp_path, "same", TORCH_TPU_CACHE_DIR="0")
        assert result == {"same": {"autograd_cache_hit": 0, "autograd_cache_saved": 0}}
    assert not (tmp_path / "inductor" / "aotautograd").exists()


def test_a_graph_with_value_checks_is_traced_again_not_stored(stored_hits):
    """An index check's callback is a closure over its trace: such a graph's findings are not
    stored, so a later compile traces it again. (Stored, its checks were traced again lazily
    when first reported, under whatever autocast state was current: the GPT's embedding then
    failed to trace.)"""
    from torch_tpu.demo.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16)).eval().to("tpu")
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1)).to("tpu")
    results = []
    for _ in range(2):  # the second pass compiles anew, as a new process would
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="tpu")
        for enabled in (False, True):
            with torch.autocast("tpu", enabled=enabled):
                results.append(compiled(tokens)[0].float().cpu())
    torch.testing.assert_close(results[2:], results[:2])


_COMPILE_THEN_POISSON = """
import torch, torch_tpu
f = torch.compile(lambda x: (x * 2).sin(), backend="tpu")
f(torch.ones(3, device="tpu")).cpu()
drawn = torch.poisson(torch.full((8,), 5.0, device="tpu")).sum().item()
print(torch.tpu.compilation_cache_stats()["disk_hits"], drawn)
"""


def test_random_ops_still_run_after_a_stored_program_is_read(tmp_path):
    """A read-back executable's argument types are unpickled copies: a typed key among them once
    made the next keys' PRNG implementation a copy, which ``jax.random.poisson`` refuses."""
    env = dict(
        os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")
    )
    for _ in range(2):  # the second process reads the program back, then draws
        out = subprocess.run(
            [sys.executable, "-c", _COMPILE_THEN_POISSON], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[0]) > 0  # the program did come from the store


def _with_subgraph(body) -> torch.fx.GraphModule:
    """A graph reading a nested GraphModule attribute (as ``torch.cond``'s branches are held)."""
    root = torch.nn.Module()
    root.branch = torch.fx.symbolic_trace(body)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.add, (graph.get_attr("branch"), x)))
    return torch.fx.GraphModule(root, graph)


def test_subgraphs_with_other_bodies_are_other_programs():
    doubled = stored._graph_text(_with_subgraph(lambda t: t * 2))
    tripled = stored._graph_text(_with_subgraph(lambda t: t * 3))
    assert doubled != tripled
    assert doubled == stored._graph_text(_with_subgraph(lambda t: t * 2))


def test_a_saved_precompiled_function_loads_in_another_thread_and_computes_the_same(stored_hits, tmp_path):
    """PyTorch's precompile (``aot_compile``, ``save_compiled_function``,
    ``torch.compiler.load_compiled_function``; vLLM saves its compiled models this way): the
    function read back runs our graphs, here loaded in a thread that never compiled (as a
    server's engine thread), at every size the dynamic trace covers."""
    import threading

    def f(x, w):
        return (x @ w).relu().sum(0)

    x, w = torch.randn(4, 8), torch.randn(8, 3)
    with torch._dynamo.config.patch(enable_aot_compile=True):
        compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="tpu").aot_compile(
            ((x.to("tpu"), w.to("tpu")), {})
        )
    compiled.save_compiled_function(str(tmp_path / "f.bin"))
    results, errors = [], []

    def load():
        try:
            with open(tmp_path / "f.bin", "rb") as file:
                loaded = torch.compiler.load_compiled_function(file, f_globals=f.__globals__)
            results.extend(loaded(a.to("tpu"), w.to("tpu")).cpu() for a in (x, x[:3]))
        except Exception as error:  # noqa: BLE001  (raised again in the test's thread)
            errors.append(error)

    thread = threading.Thread(target=load)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    torch.testing.assert_close(results[0], f(x, w))
    torch.testing.assert_close(results[1], f(x[:3], w))
