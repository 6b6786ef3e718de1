"""Per-op cost on tpu next to PyTorch CPU, raw ``jnp`` eager and a ``jax.jit`` call, in one run.

Machines are noisy, so each case interleaves the contenders round by round and reports medians
and ratios, never lone absolute times. Usage::

    python bench/bench_ops.py            # all cases
    python bench/bench_ops.py --quick    # fewer rounds
    python bench/bench_ops.py --markdown # a Markdown table (--write-docs: into docs/benchmarks.md)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import _docs
import jax
import jax.numpy as jnp
import torch

import torch_tpu
from torch_tpu.demo.model import GPT, GPTConfig


def _time_per_call(fn: Callable[[], object], sync: Callable[[], None], calls: int) -> float:
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls


def compare(contenders: dict[str, tuple[Callable, Callable]], calls: int, rounds: int) -> dict:
    """Median seconds per call of each contender, measured in interleaved rounds."""
    return {name: statistics.median(times) for name, times in samples(contenders, calls, rounds).items()}


def samples(contenders: dict[str, tuple[Callable, Callable]], calls: int, rounds: int) -> dict:
    """Seconds per call of each contender, one sample per interleaved round."""
    taken: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, (fn, sync) in contenders.items():
            taken[name].append(_time_per_call(fn, sync, calls))
    return taken


def no_sync() -> None:
    pass


def _op_cases(torch_op: Callable, jax_op: Callable, *shapes) -> dict:
    """tpu and torch CPU running ``torch_op``, jnp eager and jax.jit running ``jax_op``."""
    cpu_args = [torch.randn(*shape) for shape in shapes]
    tpu_args = [x.to("tpu") for x in cpu_args]
    jax_args = [torch_tpu.to_jax(x) for x in tpu_args]
    jitted = jax.jit(jax_op)
    last: list = [None]

    def run_jnp():
        last[0] = jax_op(*jax_args)

    def run_jit():
        last[0] = jitted(*jax_args)

    def sync_jax():
        jax.block_until_ready(last[0])

    def run_tpu():
        last[0] = torch_op(*tpu_args)  # held, like the JAX results, so the sync waits for it

    return {
        "tpu": (run_tpu, torch.tpu.synchronize),
        "torch cpu": (lambda: torch_op(*cpu_args), no_sync),
        "jnp eager": (run_jnp, sync_jax),
        "jax.jit": (run_jit, sync_jax),
    }


def _gpt_step_cases() -> dict:
    config = GPTConfig(vocab_size=96, block_size=64, n_layer=2, n_head=4, n_embd=128)
    torch.manual_seed(0)
    cases = {}
    for label, device in (("tpu", "tpu"), ("torch cpu", "cpu")):
        model = GPT(config).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, config.vocab_size, (16, config.block_size)).to(device)
        y = torch.randint(0, config.vocab_size, (16, config.block_size)).to(device)

        def step(model=model, optimizer=optimizer, x=x, y=y):
            _, loss = model(x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return loss

        cases[label] = (step, torch.tpu.synchronize if device == "tpu" else no_sync)
    return cases


def _optimizer_step_cases() -> dict:
    """One AdamW step over the GPT's 28 parameter tensors: tpu's three implementations (a
    per-tensor loop, one ``_foreach_*`` call per phase, one ``_fused_adamw_``) and CPU's fused."""
    config = GPTConfig(vocab_size=96, block_size=64, n_layer=2, n_head=4, n_embd=128)
    cases = {}
    for label, device, options in (
        ("tpu", "tpu", {"fused": True}),
        ("tpu foreach", "tpu", {"foreach": True}),
        ("tpu loop", "tpu", {"foreach": False}),
        ("torch cpu fused", "cpu", {"fused": True}),
    ):
        torch.manual_seed(0)
        params = list(GPT(config).to(device).parameters())
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer = torch.optim.AdamW(params, lr=1e-3, **options)
        cases[label] = (optimizer.step, torch.tpu.synchronize if device == "tpu" else no_sync)
    return cases


def _format(name: str, result: dict, reference: str | None) -> str:
    cells = [f"{label} {seconds * 1e6:9.1f} µs" for label, seconds in result.items()]
    line = f"{name:18s} " + " | ".join(cells)
    if reference:
        tpu = result["tpu"]
        ratios = [f"tpu/{label} {tpu / seconds:5.2f}x" for label, seconds in result.items() if label != "tpu"]
        line += "\n" + " " * 19 + "   ".join(ratios)
    return line


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


def _markdown_row(name: str, result: dict) -> str:
    times = ", ".join(f"{label} {_duration(seconds)}" for label, seconds in result.items())
    tpu = result["tpu"]
    ratios = ", ".join(f"tpu/{label} {tpu / s:.2f}x" for label, s in result.items() if label != "tpu")
    return f"| {name} | {times} | {ratios} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (smoke run)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    _docs.add_flag(parser)
    args = parser.parse_args()
    rounds = 3 if args.quick else 7
    print(f"device: {torch.tpu.get_device_name()}  (torch {torch.__version__}, jax {jax.__version__})")
    cases = [
        ("add 16 elements", _op_cases(torch.add, jnp.add, (16,), (16,)), 2000),
        ("matmul 512x512", _op_cases(torch.matmul, jnp.matmul, (512, 512), (512, 512)), 20),
        ("matmul 2048x2048", _op_cases(torch.matmul, jnp.matmul, (2048, 2048), (2048, 2048)), 2),
        ("GPT train step", _gpt_step_cases(), 3),
        ("AdamW step, GPT", _optimizer_step_cases(), 5),
    ]
    with _docs.section("ops", args):
        if args.markdown:
            print("| case | median per call | ratios |\n|---|---|---|")
        for name, contenders, calls in cases:
            result = compare(contenders, calls if not args.quick else max(1, calls // 4), rounds)
            print(_markdown_row(name, result) if args.markdown else _format(name, result, reference="tpu"))


if __name__ == "__main__":
    main()
