"""DLRM training on tpu next to TorchRec on CPU, in one run: steps per second on 1 and 2
processes (the tables sharded by TorchRec's planner, tpu_dist on tpu, gloo on CPU), and the
sparse part's share of a step (the sharded embedding lookup's forward: input all-to-all, lookup,
output exchange).

Each configuration is its own ``torchrun`` job running this file with ``--worker``; on the CPU
stand-in two processes share the box's cores, so 2-process figures measure the exchange's
overhead more than its scaling. Needs TorchRec (``scripts/install_rec.sh``).

Usage::

    python bench/bench_dlrm.py              # the table
    python bench/bench_dlrm.py --markdown   # as Markdown, for docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import _docs
import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CONFIGS = [("cpu", 1), ("tpu", 1), ("cpu", 2), ("tpu", 2)]


@dataclass
class Result:
    device: str
    processes: int
    steps_per_s: float
    samples_per_s: float
    lookup_ms: float
    step_ms: float


def _sync(device: torch.device) -> None:
    if device.type == "tpu":
        torch.tpu.synchronize()


def _timed(fn, device: torch.device, rounds: int) -> float:
    """Seconds per call of ``fn`` (after one warm call), the device drained before and after."""
    fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(rounds):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / rounds


def worker(args) -> None:
    """One configuration under torchrun: prints its ``Result`` as JSON on rank 0."""
    sys.path.insert(0, str(EXAMPLES))
    import dlrm  # examples/dlrm.py: its model, sharding and optimizers
    import torch.distributed as dist
    from torchrec.datasets.random import RandomRecDataset

    import torch_tpu  # noqa: F401

    device = torch.device(args.worker)
    dist.init_process_group(backend="gloo" if device.type == "cpu" else None)
    options = dlrm.parse_args(
        ["--rows", str(args.rows), "--dim", str(args.dim), "--batch-size", str(args.batch_size)]
    )
    dmp, optimizer = dlrm.sharded(options, dlrm.model(options, device), device)
    keys = [f"f{i}" for i in range(dlrm.SPARSE)]
    data = RandomRecDataset(
        keys=keys, batch_size=args.batch_size, hash_size=args.rows, ids_per_feature=3,
        num_dense=dlrm.DENSE, manual_seed=dist.get_rank(), num_generated_batches=1,
    )  # fmt: skip
    batch = next(iter(data)).to(device)

    def step():
        logits = dmp(batch.dense_features, batch.sparse_features).squeeze(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels.float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    def lookup():
        with torch.no_grad():
            dmp.module.sparse_arch(batch.sparse_features)

    step_s = _timed(step, device, args.rounds)
    lookup_s = _timed(lookup, device, args.rounds)
    if dist.get_rank() == 0:
        world = dist.get_world_size()
        samples = args.batch_size * world / step_s
        result = Result(device.type, world, 1 / step_s, samples, lookup_s * 1e3, step_s * 1e3)
        print("RESULT " + json.dumps(result.__dict__), flush=True)
    dist.destroy_process_group()


def run(device: str, processes: int, args) -> Result:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={processes}",
               "--master-addr=127.0.0.1", f"--master-port={29600 + processes}", __file__, "--worker", device,
               "--rows", str(args.rows), "--dim", str(args.dim), "--batch-size", str(args.batch_size),
               "--rounds", str(args.rounds)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{device} x{processes} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return Result(**json.loads(lines[0].removeprefix("RESULT ")))


def table(results: list[Result], markdown: bool) -> str:
    cpu = {r.processes: r for r in results if r.device == "cpu"}
    header = [
        "device",
        "processes",
        "steps/s",
        "samples/s",
        "step ms",
        "lookup fwd ms",
        "lookup share",
        "vs CPU",
    ]
    rows = [
        [r.device, str(r.processes), f"{r.steps_per_s:.1f}", f"{r.samples_per_s:.0f}", f"{r.step_ms:.1f}",
         f"{r.lookup_ms:.1f}", f"{r.lookup_ms / r.step_ms:.0%}",
         f"{r.steps_per_s / cpu[r.processes].steps_per_s:.2f}x"]
        for r in results
    ]  # fmt: skip
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
    widths = [max(len(x) for x in column) for column in zip(header, *rows)]
    return "\n".join("  ".join(x.rjust(w) for x, w in zip(line, widths)) for line in [header, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["cpu", "tpu"], help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=10_000, help="rows per table (10000)")
    parser.add_argument("--dim", type=int, default=64, help="embedding width (64)")
    parser.add_argument("--batch-size", type=int, default=512, help="samples per step and process (512)")
    parser.add_argument("--rounds", type=int, default=20, help="timed steps (20)")
    parser.add_argument("--markdown", action="store_true")
    _docs.add_flag(parser)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    results = [run(device, processes, args) for device, processes in CONFIGS]
    size = f"26 tables of {args.rows} x {args.dim}, batch {args.batch_size} per process"
    with _docs.section("dlrm", args):
        print(f"DLRM, {size}, fused rowwise Adagrad\n")
        print(table(results, args.markdown))


if __name__ == "__main__":
    main()
