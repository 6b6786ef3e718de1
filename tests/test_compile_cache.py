"""Compiled graphs stored on disk (``torch_tpu.frontends.compile.stored``): reused by a later
process only for the very program a call needs, with the same results as compiling it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu import config
from torch_tpu.frontends.compile import stored


@pytest.fixture
def stored_hits(tmp_path, monkeypatch):
    """A fresh graph cache directory; the list records, per executable a compiled graph needed,
    whether the store had it."""
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    stored._cache.cache_clear()
    hits: list[bool] = []
    load = stored.load_executable

    def counted(graph, donated, index):
        run = load(graph, donated, index)
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
lookup = torch.compile(lambda i, w: torch.nn.functional.embedding(i, w).sum(), backend="tpu")
table = torch.randn(4, 3, device="tpu")
try:
    lookup(torch.tensor([1, 9], device="tpu"), table).item()
    error = None
except IndexError as e:
    error = str(e).splitlines()[0]
stats = torch.tpu.compilation_cache_stats()
print(json.dumps(dict(losses=losses, weights=weights, error=error, traced=traced,
                      xla_compiles=stats["xla_compiles"], graphs=stats["compiled_graphs"])))
"""


def test_a_second_process_reads_the_stored_graphs_and_computes_the_same(tmp_path):
    """A training step (forward, backward, donating AdamW update) and a lookup whose index check
    fails: the second process traces nothing to run them (graphs with index checks are traced for
    the checks' callbacks when those are reported), compiles nothing, and gets identical values
    and the same error."""
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path))

    def run() -> dict:
        out = subprocess.run(
            [sys.executable, "-c", _TRAINING], env=env, check=True, capture_output=True, text=True
        ).stdout
        return json.loads(out.splitlines()[-1])

    first, second = run(), run()
    assert first["error"] and "index out of range" in first["error"].lower()
    assert first["xla_compiles"] > 0 and second["xla_compiles"] == 0
    assert first["traced"] == first["graphs"] == second["graphs"] == 4
    # only the graphs with index checks (the forward's embedding and cross-entropy, the lookup)
    # are traced, abstractly, for their checks' callbacks when those are first reported
    assert second["traced"] == 2
    for name in ("losses", "weights", "error"):
        assert second[name] == first[name]


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
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path))
    for _ in range(2):  # the second process reads the program back, then draws
        out = subprocess.run(
            [sys.executable, "-c", _COMPILE_THEN_POISSON], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[0]) > 0  # the program did come from the store
