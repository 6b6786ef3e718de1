"""One GPT training step under ``torch.compile(backend="tpu")`` next to its alternatives.

The step (forward, cross-entropy, backward, ``AdamW.step()``, ``zero_grad()`` of the demo GPT,
the same model and batch as ``bench_fused.py``) runs five ways in one process:

- **torch cpu**: PyTorch CPU eager;
- **inductor cpu**: the step under ``torch.compile`` with Inductor on PyTorch CPU;
- **tpu strict**: torch_tpu's default eager mode;
- **tpu compiled**: the step under ``torch.compile(backend="tpu")`` (AdamW with
  ``capturable=True``): Dynamo breaks it at ``backward()``, so it runs as three XLA executables
  (forward, backward, optimizer), parameters and optimizer state donated;
- **jax.jit**: the same step written by hand in JAX (``_jax_gpt.py``), one executable.

Warm times are medians of interleaved rounds after warm-up. Start-up times are the first step of
a fresh process (Dynamo tracing plus compilation), once with no persistent cache ("cold") and once
with the cache a previous process filled ("warm start"), with the XLA compilations each did.
Two floors run beside them: the same step on PyTorch CPU under Dynamo alone (``backend="eager"``)
and under Dynamo plus AOTAutograd (``"aot_eager"``), PyTorch's own share of any backend's first
step (neither caches its work, so their warm starts trace again).
Usage::

    python bench/bench_compile.py              # warm and start-up numbers (a few minutes)
    python bench/bench_compile.py --quick      # fewer rounds, no start-up numbers
    python bench/bench_compile.py --markdown   # tables as Markdown, for the docs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import _docs
import torch
from bench_fused import BATCH, CONFIG, WARMUP_STEPS, _JaxStep, _model_and_batch
from bench_fused import _torch_step as eager_step
from bench_ops import compare, no_sync

import torch_tpu  # noqa: F401  (the tpu device and backend)
from torch_tpu.demo.model import GPT

LABELS = {
    "cpu": "torch cpu eager",
    "inductor": "torch.compile inductor (cpu)",
    "strict": "tpu strict eager",
    "compiled": "tpu torch.compile",
    "jax": "jax.jit (hand-written)",
}
#: PyTorch's own share of a first compiled step, which no backend goes below: the same step on
#: PyTorch CPU under Dynamo alone (backend "eager") and Dynamo plus AOTAutograd ("aot_eager")
FLOORS = {
    "dynamo": "floor: Dynamo alone (eager, cpu)",
    "aot_eager": "floor: Dynamo + AOTAutograd (aot_eager, cpu)",
}
#: the issue's target for the compiled step against the hand-written JAX one
COMPILED_OVER_JAX_TARGET = 1.15
Contender = tuple[Callable[[], object], Callable[[], None]]


def _torch_step(model: GPT, device: str, idx, targets, compiled: str | None = None) -> Callable:
    """``bench_fused``'s eager step, under ``torch.compile(backend=compiled)`` if given (with
    a capturable AdamW on tpu, so its state stays on the device)."""
    options = {"capturable": True} if compiled == "tpu" else {}
    step = eager_step(model, device, idx, targets, **options)
    return torch.compile(step, backend=compiled) if compiled else step


def _contenders(names=tuple(LABELS)) -> dict[str, Contender]:
    """The warm table's contenders (:data:`LABELS`), and the start-up floors (:data:`FLOORS`)."""
    model, idx, targets = _model_and_batch()
    makers = {
        "cpu": lambda: (_torch_step(model, "cpu", idx, targets), no_sync),
        "inductor": lambda: (_torch_step(model, "cpu", idx, targets, "inductor"), no_sync),
        "strict": lambda: (_torch_step(model, "tpu", idx, targets), torch.tpu.synchronize),
        "compiled": lambda: (_torch_step(model, "tpu", idx, targets, "tpu"), torch.tpu.synchronize),
        "jax": lambda: (lambda step: (step, step.sync))(_JaxStep(model, idx, targets)),
        "dynamo": lambda: (_torch_step(model, "cpu", idx, targets, "eager"), no_sync),
        "aot_eager": lambda: (_torch_step(model, "cpu", idx, targets, "aot_eager"), no_sync),
    }
    return {name: makers[name]() for name in names}


def _first_step(name: str) -> dict:
    """(Run in a fresh process.) The first step of ``name``, and the XLA compilations it did."""
    fn, sync = _contenders((name,))[name]
    torch.tpu.reset_compilation_cache_stats()
    start = time.perf_counter()
    fn()
    sync()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, **torch.tpu.compilation_cache_stats()}


def _run_first_step(name: str, environment: dict) -> dict:
    output = subprocess.run(
        [sys.executable, __file__, "--first-step", name],
        env=environment,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(output.splitlines()[-1])


def start_times(names=("inductor", "compiled", "jax", *FLOORS)) -> dict[str, dict]:
    """Each contender's first step in a fresh process: without any persistent cache, then twice
    with one cache directory (the first fills it, the second is the warm start)."""
    results = {}
    cold = dict(os.environ, TORCH_TPU_CACHE_DIR="0", TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    with tempfile.TemporaryDirectory() as cache:
        warm = dict(
            os.environ,
            TORCH_TPU_CACHE_DIR=os.path.join(cache, "tpu"),
            TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
        )
        for name in names:
            results[name] = {"cold": _run_first_step(name, cold)}
            _run_first_step(name, warm)
            results[name]["warm"] = _run_first_step(name, warm)
    return results


def warm_times(calls: int, rounds: int) -> dict[str, float]:
    contenders = _contenders()
    for fn, sync in contenders.values():
        for _ in range(WARMUP_STEPS):
            fn()
        sync()
    return compare(contenders, calls, rounds)


def tables(warm: dict[str, float], starts: dict | None, markdown: bool) -> str:
    rows = [("training step", "warm (median)", "time / jax.jit", "time / compiled")]
    for name, label in LABELS.items():
        rows.append(
            (
                label,
                f"{warm[name] * 1e3:.2f} ms",
                f"{warm[name] / warm['jax']:.2f}x",
                f"{warm[name] / warm['compiled']:.2f}x",
            )
        )
    ratio = warm["compiled"] / warm["jax"]
    verdict = "met" if ratio <= COMPILED_OVER_JAX_TARGET else "NOT met"
    notes = [
        f"compiled / jax.jit: {ratio:.2f}x (target <= {COMPILED_OVER_JAX_TARGET}x: {verdict})",
        f"strict / compiled: {warm['strict'] / warm['compiled']:.2f}x",
        f"inductor cpu / compiled: {warm['inductor'] / warm['compiled']:.2f}x",
    ]
    out = [_format(rows, markdown)]
    if starts:
        start_rows = [
            (
                "first step of a fresh process",
                "cold (no cache)",
                "XLA compiles",
                "warm start (cache)",
                "XLA compiles",
            )
        ]
        for name, result in starts.items():
            cold, warm_start = result["cold"], result["warm"]
            xla = name in ("compiled", "jax")
            compiles = (lambda r: str(r["xla_compiles"])) if xla else (lambda r: "n/a")
            start_rows.append(
                (
                    {**LABELS, **FLOORS}[name],
                    f"{cold['seconds']:.2f} s",
                    compiles(cold),
                    f"{warm_start['seconds']:.2f} s",
                    compiles(warm_start),
                )
            )
        out.append(_format(start_rows, markdown))
    out.append("\n".join(("- " if markdown else "") + note for note in notes))
    return "\n\n".join(out)


def _format(rows: list[tuple], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows[1:]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, no start-up numbers")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--first-step", choices=[*LABELS, *FLOORS], help=argparse.SUPPRESS)
    _docs.add_flag(parser)
    args = parser.parse_args(argv)
    if args.first_step:
        print(json.dumps(_first_step(args.first_step)))
        return
    print(
        f"device: {torch.tpu.get_device_name()}  (torch {torch.__version__}, "
        f"{torch.get_num_threads()} CPU threads, load average {os.getloadavg()[0]:.1f}); "
        f"GPT {sum(p.numel() for p in GPT(CONFIG).parameters()):,} parameters, batch {BATCH} "
        f"x {CONFIG.block_size} tokens\n",
        flush=True,
    )
    starts = None if args.quick else start_times()
    rounds, calls = (3, 3) if args.quick else (7, 5)
    warm = warm_times(calls, rounds)
    with _docs.section("compile", args):
        print(tables(warm, starts, args.markdown))
    print(f"\nload average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
