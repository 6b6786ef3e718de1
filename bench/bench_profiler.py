"""What ``torch.profiler`` costs on tpu: a GPT training step with no profiler, under a CPU-only
profile, and under a profile with tpu device activities, side by side in one run.

Each contender runs ``STEPS`` steps per call (a profiled call is one profile session around
them: its start, its stop, which waits for the device and reads XLA's trace, and the trace's
processing into Kineto events), in interleaved rounds; the table gives the median per step and
the ratio to no profiler, for strict and fused eager. With no profiler active, the only tpu
code that runs is one module attribute read per fused graph run (``profiling.active``); the
"off" column is that path.

Usage::

    python bench/bench_profiler.py              # the table
    python bench/bench_profiler.py --markdown   # as Markdown, for docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import contextlib

import _docs
import bench_fused
import torch
from bench_ops import compare
from torch.profiler import ProfilerActivity, profile

import torch_tpu
from torch_tpu.demo.model import GPTConfig

CONFIG = GPTConfig(vocab_size=96, block_size=32, n_layer=2, n_head=4, n_embd=64)
BATCH, STEPS = 8, 5
PROFILES = {
    "off": None,
    "profiler (CPU)": [ProfilerActivity.CPU],
    "profiler (CPU + tpu)": [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
}


def _steps(mode: str, activities: list | None):
    model, idx, targets = bench_fused._model_and_batch(CONFIG, BATCH)
    step = bench_fused._torch_step(model, "tpu", idx, targets, mode)
    for _ in range(bench_fused.WARMUP_STEPS):
        step().item()

    def run() -> None:
        block = profile(activities=activities) if activities else contextlib.nullcontext()
        with block:
            for _ in range(STEPS):
                loss = step()
            loss.item()

    return run, torch.tpu.synchronize


def rows(rounds: int) -> list[tuple[str, dict[str, float]]]:
    out = []
    for mode in ("strict", "fused"):
        contenders = {name: _steps(mode, activities) for name, activities in PROFILES.items()}
        seconds = compare(contenders, calls=1, rounds=rounds)
        out.append((mode, {name: s / STEPS for name, s in seconds.items()}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--markdown", action="store_true")
    _docs.add_flag(parser)
    args = parser.parse_args()
    torch_tpu._initialize()
    table = rows(args.rounds)
    with _docs.section("profiler", args):
        print_table(table, args.markdown)


def print_table(table: list, markdown: bool) -> None:
    names = list(PROFILES)
    if markdown:
        print(
            "| eager mode | "
            + " | ".join(f"{n} ms/step" for n in names)
            + " | CPU profile / off | tpu profile / off |"
        )
        print("|---" * (len(names) + 3) + "|")
    for mode, times in table:
        cells = [f"{times[n] * 1e3:.1f}" for n in names]
        ratios = [f"{times[n] / times['off']:.2f}x" for n in names[1:]]
        if markdown:
            print(f"| {mode} | " + " | ".join(cells + ratios) + " |")
        else:
            print(
                f"{mode:7s} "
                + "  ".join(f"{n} {c} ms" for n, c in zip(names, cells))
                + "  "
                + "  ".join(ratios)
            )


if __name__ == "__main__":
    main()
