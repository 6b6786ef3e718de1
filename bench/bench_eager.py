"""Eager speed in one table: per-op dispatch, fused recording, a GPT step five ways, cold starts.

Every row measures its contenders side by side in one run (interleaved rounds, medians, the
helpers of ``bench_ops.py``), so read the ratios; absolute times on a shared 2-core box drift.
Per-op figures also give their quietest round ("min"): noise only adds time.

- **dispatch**: strict eager per op (a 16-element ``add``, a ``linear`` on a transposed weight,
  indexing with an index tensor, and the ``linear`` on an input padded to its size bucket)
  against PyTorch CPU, ``jnp`` eager and a ``jax.jit`` call;
- **fused recording**: a 4-layer GPT (d=128, batch 8 x 64, where Python dominates) in fused
  eager, per recorded op: recording its forward with the device idle (on this 2-core stand-in,
  XLA's compute of the previous graph otherwise competes with Python for the cores), the same
  forward recorded again at once ("host warm": XLA:CPU's compute of the previous graph leaves the
  host's caches cold for the next recording, which a TPU host, computing on the chip, does not
  see) and, as in training, while the device computes the previous step, next to PyTorch CPU's
  own cost per op of the same forward with tiny tensors (its floor: the model's Python,
  dispatch and autograd); and of a training step the flushes
  (each graph's fingerprint, cache lookup and dispatch: ``flush_seconds``) and the wait for the
  device at the step's end;
- **GPT step**: that step on PyTorch CPU, tpu strict, fused and compiled, and hand-written
  ``jax.jit``;
- **cold start** (fresh processes, empty caches): the first 32-token greedy ``generate()`` of
  the tiny Llama of ``bench_hf.py`` (then the same again, and a shorter one: a later length must
  not compile), with tpu's default static cache and with Transformers' dynamic one, and the first
  ``torch.compile`` training step of ``bench_compile.py``, also with warm caches;
- **matmul precision**: a 1024x1024 float32 matmul under each
  ``torch.set_float32_matmul_precision`` setting (XLA:CPU computes all three alike).

Usage::

    python bench/bench_eager.py              # everything (a few minutes)
    python bench/bench_eager.py --quick      # fewer rounds, no cold starts
    python bench/bench_eager.py --markdown   # the table as Markdown, for docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _docs
import bench_compile
import bench_fused
import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F
from bench_hf import NEW_TOKENS
from bench_ops import compare, no_sync, samples

import torch_tpu
from torch_tpu import execution
from torch_tpu.demo.model import GPTConfig
from torch_tpu.testing.ops_seen import OpsSeen

#: the issue's "small GPT where Python dominates"
GPT_CONFIG = GPTConfig(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=128)
GPT_BATCH = 8
WARMUP_STEPS = 3


def _row(
    name: str, times: dict[str, float], unit: str, reference: str, note: str = "", minima: dict | None = None
) -> tuple:
    """A table row: each contender's median (and its quietest round's time, given ``minima``) and
    the ratios to ``reference``'s."""
    scale = {"us": 1e6, "ms": 1e3, "s": 1.0}[unit]

    def cell(label: str, seconds: float) -> str:
        quietest = f" (min {minima[label] * scale:.1f})" if minima else ""
        return f"{label} {seconds * scale:.1f} {unit}{quietest}"

    def ratios(of: dict) -> str:
        others = [(label, seconds) for label, seconds in of.items() if label != reference]
        return ", ".join(f"{label} {seconds / of[reference]:.2f}x" for label, seconds in others)

    cells = ", ".join(cell(label, seconds) for label, seconds in times.items())
    compared = f"vs {reference}: {ratios(times)}" + (f"; at the minima: {ratios(minima)}" if minima else "")
    return name, cells, compared + (f"; {note}" if note else "")


# ----------------------------------------------------------------------------- dispatch
@contextlib.contextmanager
def _unbucketed():
    """Tensors made in the block are not padded to size buckets: the line below makes the cases'
    inputs, of several shapes, and would otherwise teach the runtime that their sizes change
    (docs/execution.md, "Shapes that change"); the padded path has a row of its own."""
    before, torch_tpu.config.buckets = torch_tpu.config.buckets, False
    try:
        yield
    finally:
        torch_tpu.config.buckets = before


def _size_bucketed(shape: tuple[int, ...]) -> torch.Tensor:
    """A tpu tensor of ``shape`` padded to its size bucket along dim 0 (made at one line at two
    sizes, as a data loader's batches are)."""
    for rows in (shape[0] + 1, shape[0]):
        x = torch.randn(rows, *shape[1:]).to("tpu")
    return x


def _dispatch_rows(rounds: int) -> list[tuple]:
    x, w = torch.randn(4, 16), torch.randn(32, 16)
    a, b, idx = torch.randn(16), torch.randn(16), torch.tensor([0, 2, 3])
    cases = {
        "add, 16 elements": (lambda a, b: a + b, jnp.add, (a, b)),
        "linear, transposed weight": (F.linear, lambda x, w: x @ w.T, (x, w)),
        "index with a tensor": (lambda w, i: w[i], lambda w, i: w[i], (w, idx)),
        "linear, size-bucketed input": (F.linear, lambda x, w: x @ w.T, (x, w)),
    }
    rows = []
    for name, (torch_op, jax_op, cpu_args) in cases.items():
        with _unbucketed():
            tpu_args = [t.to("tpu") for t in cpu_args]
        if "bucketed" in name:  # (its input padded: 4 rows in a bucket of 8)
            tpu_args[0] = _size_bucketed(tuple(cpu_args[0].shape))
            cpu_args = (tpu_args[0].cpu(), *cpu_args[1:])
        jax_args = [torch_tpu.to_jax(t) for t in tpu_args]
        jitted = jax.jit(jax_op)
        last: list = [None]

        def sync_jax(last=last):
            jax.block_until_ready(last[0])

        contenders = {
            "tpu": (lambda: torch_op(*tpu_args), torch.tpu.synchronize),
            "torch cpu": (lambda: torch_op(*cpu_args), no_sync),
            "jnp": (lambda: last.__setitem__(0, jax_op(*jax_args)), sync_jax),
            "jax.jit": (lambda: last.__setitem__(0, jitted(*jax_args)), sync_jax),
        }
        taken = samples(contenders, 500, rounds)
        medians = {label: statistics.median(times) for label, times in taken.items()}
        minima = {label: min(times) for label, times in taken.items()}
        rows.append(_row(f"strict: {name}", medians, "us", "jnp", minima=minima))
    return rows


# ----------------------------------------------------------------------------- GPT step
def _fused_split(model, idx, targets, step, steps: int) -> dict:
    """Per op of a fused training step: recording (the forward and loss recorded with the device
    idle, so no XLA work competes for the cores; recorded again at once, with the host's caches
    as the first recording left them rather than as XLA:CPU's compute of the previous graph
    left them, which is what a TPU host sees: its compute runs on the chip; and while the
    device computes the previous step, as in training), per ATen op the forward dispatches and per
    graph node it records (views are read inside their consumers' nodes: fewer nodes than
    ops); and per step's node the flushes (each graph's fingerprint, lookup and dispatch) and
    the wait for the device at the step's end; and the cycle collector's runs in those steps
    (recording allocates: each young collection costs, a full one stalls for the whole heap)."""
    replica = copy.deepcopy(model).to("tpu")
    idx, targets = idx.to("tpu"), targets.to("tpu")
    recording, warm, busy, nodes = [], [], [], 0
    with torch_tpu.eager_mode("fused"):
        for _ in range(steps):
            torch.tpu.synchronize()
            started = time.perf_counter()
            _, loss = replica(idx, targets)
            recording.append(time.perf_counter() - started)
            nodes = execution.pending_ops()
            started = time.perf_counter()  # again at once: no XLA work in between
            _, again = replica(idx, targets)
            warm.append(time.perf_counter() - started)
            del loss, again
            torch_tpu.sync()
        for _ in range(steps):  # as in training: recorded while the device computes a step
            step()
            started = time.perf_counter()
            _, loss = replica(idx, targets)
            busy.append(time.perf_counter() - started)
            del loss
            torch_tpu.sync()
        with OpsSeen() as seen:
            replica(idx, targets)
        torch_tpu.sync()
    aten = len(seen.ops)
    torch.tpu.synchronize()
    torch.tpu.reset_compilation_cache_stats()
    wait = 0.0
    collected = [g["collections"] for g in gc.get_stats()]
    for _ in range(steps):
        step()
        recorded = time.perf_counter()
        torch.tpu.synchronize()
        wait += time.perf_counter() - recorded
    collected = [g["collections"] - before for g, before in zip(gc.get_stats(), collected)]
    stats = torch.tpu.compilation_cache_stats()
    assert stats["misses"] == 0, "the fused step recompiled while timed"
    ops = stats["ops_run"] / steps
    record = statistics.median(recording)
    return {  # part -> (median, quietest step's) seconds
        "record per ATen op": (record / aten, min(recording) / aten),
        "host warm": (statistics.median(warm) / aten, min(warm) / aten),
        "per node": (record / nodes, None),
        "per ATen op, device busy": (statistics.median(busy) / aten, min(busy) / aten),
        "flush": (stats["flush_seconds"] / steps / ops, None),
        "wait": (wait / steps / ops, None),
        "ops": ops,
        "aten": aten,
        "nodes": nodes,
        "collections": (sum(collected[:2]) / steps, collected[2], steps),
    }


def _cpu_floor(steps: int) -> tuple[float, float]:
    """Seconds per ATen op (median, quietest) of the GPT's forward with loss on PyTorch CPU, at a
    width and batch so small (d=8, one sequence of 2 tokens) that compute is negligible: what
    PyTorch itself costs per op of this model (its modules' Python, dispatch, autograd's graph),
    which any backend pays before its own kernel."""
    tiny = dataclasses.replace(GPT_CONFIG, n_embd=2 * GPT_CONFIG.n_head)
    model, idx, targets = bench_fused._model_and_batch(tiny, 1)
    idx, targets = idx[:, :2], targets[:, :2]
    with OpsSeen() as seen:
        model(idx, targets)
    aten = len(seen.ops)
    times = []
    for _ in range(max(steps, 20)):
        started = time.perf_counter()
        model(idx, targets)
        times.append(time.perf_counter() - started)
    return statistics.median(times) / aten, min(times) / aten


def _gpt_rows(rounds: int) -> list[tuple]:
    model, idx, targets = bench_fused._model_and_batch(GPT_CONFIG, GPT_BATCH)
    assert GPT_CONFIG.n_head == bench_fused.CONFIG.n_head  # (the JAX step's head count)
    jax_step = bench_fused._JaxStep(model, idx, targets)
    sync = torch.tpu.synchronize
    contenders = {
        "torch cpu": (bench_fused._torch_step(model, "cpu", idx, targets), no_sync),
        "strict": (bench_fused._torch_step(model, "tpu", idx, targets, "strict"), sync),
        "fused": (bench_fused._torch_step(model, "tpu", idx, targets, "fused"), sync),
        "compiled": (bench_compile._torch_step(model, "tpu", idx, targets, "tpu"), sync),
        "jax.jit": (jax_step, jax_step.sync),
    }
    for fn, wait in contenders.values():
        for _ in range(WARMUP_STEPS):
            fn()
        wait()
    split = _fused_split(model, idx, targets, contenders["fused"][0], 3 * rounds)
    times = compare(contenders, 2, rounds)
    ops, aten, nodes = split.pop("ops"), split.pop("aten"), split.pop("nodes")
    young, full, steps = split.pop("collections")
    split["PyTorch CPU's floor"] = _cpu_floor(3 * rounds)
    per_op = ", ".join(
        f"{part} {median * 1e6:.1f} us" + ("" if quietest is None else f" (min {quietest * 1e6:.1f})")
        for part, (median, quietest) in split.items()
    )
    per_op += (
        f"; Python's cycle collector: {young:.1f} young collections a step, {full} full in {steps} steps"
    )
    return [
        _row(
            f"GPT step ({GPT_CONFIG.n_layer} layers, d={GPT_CONFIG.n_embd}, batch {GPT_BATCH}x64)",
            times,
            "ms",
            "jax.jit",
        ),
        (
            f"fused: recording ({aten} ATen ops, {nodes} nodes a forward; {ops:.0f} nodes a step)",
            per_op,
            "record: the forward's Python, device idle (host warm: recorded again at once, no "
            "XLA:CPU compute in between; busy: while it computes the previous step, as in "
            "training); min: the quietest forward's; flush, wait: per step's node; PyTorch CPU's "
            "floor: the same forward on CPU with tiny tensors (its Python, dispatch and autograd, "
            "no compute to speak of)",
        ),
    ]


# ----------------------------------------------------------------------------- cold starts
_GENERATE = """
import json, sys, time, torch, torch_tpu
from bench_hf import LLAMA, NEW_TOKENS, PROMPT_LENGTH
from torch_tpu.testing import hf_zoo
model = hf_zoo.build("llama", **LLAMA).to("tpu")
prompt = torch.randint(3, LLAMA["vocab_size"], (1, PROMPT_LENGTH), generator=torch.Generator().manual_seed(1))
ids = prompt.to("tpu")
runs = []
for new_tokens in (NEW_TOKENS, NEW_TOKENS, NEW_TOKENS - 12):  # the first, again, a later length
    torch.tpu.reset_compilation_cache_stats()
    started = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, num_beams=1)
    out.cpu()
    runs.append((time.perf_counter() - started, torch.tpu.compilation_cache_stats()["xla_compiles"]))
print(json.dumps(runs))
"""


def _fresh(code: str, environment: dict):
    output = subprocess.run(
        [sys.executable, "-c", code],
        env=environment,
        cwd=os.path.dirname(os.path.abspath(__file__)),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(output.splitlines()[-1])


def _generate_row(name: str, runs: list, note: str) -> tuple:
    (first, first_compiles), (again, _), (later, later_compiles) = runs
    return (
        name,
        f"{first:.2f} s (again {again:.2f} s, {NEW_TOKENS - 12} tokens {later:.2f} s)",
        f"{note}; XLA compiles: {first_compiles} first, {later_compiles} for the later length",
    )


def _cold_rows() -> list[tuple]:
    rows = []
    for name, setting, note in (
        ("cold: first generate(), 32 tokens, tiny Llama", "1", "default: static bucketed cache, fused"),
        ("cold: the same, Transformers' dynamic cache", "0", "TORCH_TPU_STATIC_GENERATION=0, strict"),
    ):
        with tempfile.TemporaryDirectory() as cache:
            empty = dict(os.environ, TORCH_TPU_CACHE_DIR=cache, HF_HUB_OFFLINE="1")
            runs = _fresh(_GENERATE, dict(empty, TORCH_TPU_STATIC_GENERATION=setting))
        rows.append(_generate_row(name, runs, f"fresh process, empty cache; {note}"))
    starts = bench_compile.start_times(("compiled", *bench_compile.FLOORS))
    compiled, dynamo, aot = (starts[name]["cold"] for name in ("compiled", *bench_compile.FLOORS))
    rows.append(
        (
            "cold: first torch.compile training step",
            f"{compiled['seconds']:.2f} s cold, {starts['compiled']['warm']['seconds']:.2f} s warm caches",
            f"XLA compiles: {compiled['xla_compiles']} cold, {starts['compiled']['warm']['xla_compiles']} "
            f"warm; PyTorch's floor, the step on CPU: Dynamo alone {dynamo['seconds']:.2f} s, "
            f"with AOTAutograd {aot['seconds']:.2f} s",
        )
    )
    return rows


# ----------------------------------------------------------------------------- precision
def _precision_row(rounds: int) -> tuple:
    a, b = torch.randn(1024, 1024, device="tpu"), torch.randn(1024, 1024, device="tpu")
    before = torch.get_float32_matmul_precision()
    times = {}
    try:
        for setting in ("highest", "high", "medium"):
            torch.set_float32_matmul_precision(setting)
            (a @ b).cpu()
            samples = []
            for _ in range(rounds):
                started = time.perf_counter()
                (a @ b).cpu()
                samples.append(time.perf_counter() - started)
            times[setting] = statistics.median(samples)
    finally:
        torch.set_float32_matmul_precision(before)
    return _row("matmul 1024x1024 float32 by precision", times, "ms", "highest")


# ----------------------------------------------------------------------------- table
def table(rows: list[tuple], markdown: bool) -> str:
    header = ("case", "times (median)", "ratios / notes")
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    width = max(len(row[0]) for row in rows)
    return "\n".join(f"{row[0]:<{width}}  {row[1]}\n{'':<{width}}  {row[2]}" for row in [header, *rows])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, no cold starts")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    _docs.add_flag(parser)
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else 7
    print(
        f"device: {torch.tpu.get_device_name()}  (torch {torch.__version__}, jax {jax.__version__}, "
        f"load average {os.getloadavg()[0]:.1f} at start)",
        flush=True,
    )
    rows = _dispatch_rows(rounds) + _gpt_rows(rounds) + [_precision_row(rounds)]
    if not args.quick:
        rows += _cold_rows()
    print(f"load average {os.getloadavg()[0]:.1f} at the end\n")
    with _docs.section("eager", args):
        print(table(rows, args.markdown))


if __name__ == "__main__":
    main()
