"""Eager per-op costs of two source trees, A/B, robust to a noisy box.

A shared 2-core box drifts by 2x over seconds, so two runs of ``bench_eager.py`` cannot tell a
10% change. This runs one worker process per tree (``PYTHONPATH=<tree>/src``) and asks them in
turn, in a shuffled order, for one sample of each case: a burst of 10 fused ops (or one GPT
forward, or 50 strict ops) after an untimed burst that warms the host's caches. Both trees meet
the same drift; the medians (and minima) per op are compared.

Usage::

    git worktree add /tmp/before <commit> && cp src/torch_tpu/_C*.so /tmp/before/src/torch_tpu/
    python bench/ab_eager.py /tmp/before . --rounds 60
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

BENCH = os.path.dirname(os.path.abspath(__file__))


def _cases() -> dict[str, Callable[[], float]]:
    """Each case: one sample, seconds per op (run in a worker: imports torch_tpu of its tree)."""
    import copy

    import bench_eager
    import bench_fused
    import torch
    import torch.nn.functional as F

    import torch_tpu
    from torch_tpu.testing.ops_seen import OpsSeen

    model, idx, targets = bench_fused._model_and_batch(bench_eager.GPT_CONFIG, bench_eager.GPT_BATCH)
    replica = copy.deepcopy(model).to("tpu")
    idx, targets = idx.to("tpu"), targets.to("tpu")
    x, x2 = torch.randn(8, 64, 128).to("tpu"), torch.randn(512, 128).to("tpu")
    g, w, b = torch.randn(128).to("tpu"), torch.randn(384, 128).to("tpu"), torch.randn(384).to("tpu")
    tokens, table = torch.randint(0, 96, (8, 64)).to("tpu"), torch.randn(96, 128).to("tpu")
    logits, labels = torch.randn(8, 64, 96).to("tpu"), torch.randint(0, 96, (8, 64)).to("tpu")
    q, a = torch.randn(8, 4, 64, 32).to("tpu"), torch.randn(16).to("tpu")
    small_x, small_w = torch.randn(4, 16).to("tpu"), torch.randn(32, 16).to("tpu")  # bench_eager's
    rows, stored = torch.tensor([0, 2, 3]).to("tpu"), torch.randn(3, 16).to("tpu")
    param = torch.randn(16).to("tpu")
    mask, moments = a > 0, [torch.randn(16).to("tpu") for _ in range(8)]  # (an optimizer's lists)
    with OpsSeen() as seen:  # the forward's ATen ops, as bench_eager counts them
        replica(idx, targets)
    torch_tpu.sync()
    fused_ops = {
        "fused gelu": lambda: F.gelu(x),
        "fused x + x": lambda: x + x,
        "fused x * 2": lambda: x * 2,
        "fused layer_norm": lambda: F.layer_norm(x, (128,), g, g),
        "fused addmm, transposed weight": lambda: torch.addmm(b, x2, w.t()),
        "fused arange(64)": lambda: torch.arange(64, device="tpu"),
        "fused embedding": lambda: F.embedding(tokens, table),
        "fused cross_entropy of views": lambda: F.cross_entropy(logits.flatten(0, 1), labels.reshape(-1)),
        "fused causal SDPA": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
    }

    def fused(op: Callable) -> float:
        with torch_tpu.eager_mode("fused"):
            torch.tpu.synchronize()
            started = time.perf_counter()
            for _ in range(10):
                op()
            seconds = time.perf_counter() - started
            torch_tpu.sync()
        return seconds / 10

    def forward() -> float:  # recorded again at once: the host's caches warm (bench_eager's "host warm")
        with torch_tpu.eager_mode("fused"):
            torch.tpu.synchronize()
            first = replica(idx, targets)
            started = time.perf_counter()
            again = replica(idx, targets)
            seconds = time.perf_counter() - started
            del first, again
            torch_tpu.sync()
        return seconds / len(seen.ops)

    strict_ops = {  # on 16 elements: the per-op path, not XLA's compute
        "strict add, 16 elements": lambda: a + a,
        "strict a * 2": lambda: a * 2,
        "strict exp": lambda: a.exp(),
        "strict softmax(a, -1)": lambda: torch.softmax(a, -1),
        "strict in-place mul_": lambda: a.mul_(1.0),
        "strict linear, transposed weight": lambda: F.linear(small_x, small_w),
        "strict index with a tensor": lambda: small_w[rows],
        "strict index_select": lambda: small_w.index_select(0, rows),
        "strict embedding": lambda: F.embedding(rows, small_w),
        "strict store at indices (index_put_)": lambda: small_w.index_put_((rows,), stored),
        "strict gather": lambda: torch.gather(a, 0, rows),
        "strict floor division by a number": lambda: rows // 2,
        "strict add with alpha=2 (a keyword)": lambda: a.add(a, alpha=2),
        "strict in-place add_ with alpha (an SGD step)": lambda: param.add_(a, alpha=-1e-3),
        "strict gelu, approximate='tanh'": lambda: F.gelu(a, approximate="tanh"),
        "strict masked_fill with a number": lambda: a.masked_fill(mask, -1e9),
        "strict full_like": lambda: torch.full_like(a, 3.0),
        "strict leaky_relu(a, 0.2)": lambda: F.leaky_relu(a, 0.2),
        "strict hardtanh of integers": lambda: F.hardtanh(rows),
        "strict _foreach_lerp_ of 8 tensors (Adam's)": lambda: torch._foreach_lerp_(moments, moments, 0.1),
    }

    def strict(op: Callable) -> float:
        torch.tpu.synchronize()
        started = time.perf_counter()
        for _ in range(50):
            op()
        return (time.perf_counter() - started) / 50

    cases = {"GPT forward, per ATen op": forward}
    cases.update({name: (lambda op=op: strict(op)) for name, op in strict_ops.items()})
    cases.update({name: (lambda op=op: fused(op)) for name, op in fused_ops.items()})
    return cases


def worker() -> None:
    """Answer one sample per case name read from stdin (after an untimed one)."""
    sys.path.insert(0, BENCH)
    cases = _cases()
    for case in cases.values():
        case()
    print(json.dumps(list(cases)), flush=True)  # ready: its case names
    for line in sys.stdin:
        case = cases[line.strip()]
        case()
        print(case(), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, help="two source trees (the repository roots)")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    workers = []
    for tree in args.trees:
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(tree), "src"))
        process = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        ready = process.stdout.readline()
        if not ready:
            sys.exit(f"the worker for {tree} did not start")
        names = json.loads(ready)
        workers.append(process)
    # (by worker, not by tree: a tree against itself measures the noise)
    samples = {(worker, name): [] for worker in range(2) for name in names}
    for _ in range(args.rounds):
        for name in names:
            for worker in random.sample(range(2), 2):
                workers[worker].stdin.write(name + "\n")
                workers[worker].stdin.flush()
                samples[worker, name].append(float(workers[worker].stdout.readline()))
    for process in workers:
        process.stdin.close()
        process.wait()
    before, after = args.trees
    print(f"| case | {before} | {after} | after / before |\n|---|---|---|---|")
    for name in names:
        cells = [samples[worker, name] for worker in range(2)]
        medians = [statistics.median(c) * 1e6 for c in cells]
        text = [f"{m:.1f} us (min {min(c) * 1e6:.1f})" for m, c in zip(medians, cells)]
        print(f"| {name} | {text[0]} | {text[1]} | {medians[1] / medians[0]:.2f}x |")


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        main()
