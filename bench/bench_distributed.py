"""The ``tpu_dist`` backend against gloo, side by side in one run: collective latency and
bandwidth, and a DDP training step on one and two processes.

- **collectives**: ``all_reduce`` (SUM), ``all_gather_into_tensor``, ``reduce_scatter_tensor``
  and ``all_to_all_single`` of float32 tensors from 4 KB to 64 MB, on ``tpu_dist`` (tpu
  tensors) and on gloo (the same tensors on CPU), two and four ranks. Each round times a batch
  of calls on every rank from a common start (a gloo barrier) to the last result being ready
  (``torch.tpu.synchronize``; gloo's CPU collectives return done); a round's time is the slowest
  rank's. A round visits every (collective, size) in a new random order (the same on every
  rank), each on both backends in turn, so every figure is measured after arbitrary other
  collectives ran in the process (medians over rounds). The size is nccl-tests' (the per-rank
  buffer of ``all_reduce`` and ``all_to_all_single``, the gathered output, the scattered input);
  ``busbw`` is nccl-tests' bus bandwidth: size / time, times ``2(n-1)/n`` for ``all_reduce`` and
  ``(n-1)/n`` for the others.
- **coalesced**: 16 ``all_reduce`` calls of 16 KB, one by one and inside one
  ``_coalescing_manager`` (``tpu_dist`` runs them as one program; gloo as its
  ``allreduce_coalesced``).
- **DDP step**: one SGD step of the 4-layer GPT of ``bench_eager.py`` (batch 8 x 64 per process)
  on tpu and on CPU: one process without DDP, then two processes under DDP (``tpu_dist`` /
  gloo), each with its own batch of 8 (the work per process stays the same: on a machine with a
  core per process the two-process step would take as long as the one-process step plus the
  gradient all-reduce; on this 2-core stand-in each process also computes on fewer cores).

Usage (the command launches its own ``torchrun`` jobs)::

    python bench/bench_distributed.py              # everything (a few minutes)
    python bench/bench_distributed.py --quick      # fewer rounds and sizes
    python bench/bench_distributed.py --markdown   # the tables as Markdown, for docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import _docs

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [4 << 10, 1 << 20, 16 << 20]
OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"]
#: bytes per round and backend: small sizes repeat within a round, large ones run once or twice
BYTES_PER_ROUND = 8 << 20
DDP_STEPS, DDP_WARMUP = 10, 3


# ----------------------------------------------------------------------------- worker side


def _slowest(seconds: float, gloo) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, dist.ReduceOp.MAX, group=gloo)
    return t.item()


def _timed(fn, sync, calls: int, gloo) -> float:
    """Seconds per call, from a common start to the slowest rank's last result."""
    import torch.distributed as dist

    dist.barrier(group=gloo)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return _slowest((time.perf_counter() - start) / calls, gloo)


def _collective(op: str, size: int, device: str, group, world: int):
    """A call of ``op`` on float32 tensors of ``size`` bytes (nccl-tests' size) on ``device``."""
    import torch
    import torch.distributed as dist

    n = size // 4
    if op == "all_reduce":
        x = torch.ones(n, device=device)
        return lambda: dist.all_reduce(x, group=group)
    if op == "all_gather_into_tensor":
        x, out = torch.ones(n // world, device=device), torch.empty(n, device=device)
        return lambda: dist.all_gather_into_tensor(out, x, group=group)
    if op == "all_to_all_single":
        x, out = torch.ones(n, device=device), torch.empty(n, device=device)
        return lambda: dist.all_to_all_single(out, x, group=group)
    x, out = torch.ones(n, device=device), torch.empty(n // world, device=device)
    return lambda: dist.reduce_scatter_tensor(out, x, group=group)


def run_collectives(sizes, rounds: int, gloo, world: int) -> list[dict]:
    import torch
    import torch.distributed as dist

    backends = {"tpu_dist": ("tpu", dist.group.WORLD, torch.tpu.synchronize), "gloo": ("cpu", gloo, _no_sync)}
    cases = [(op, size) for op in OPS for size in sizes]
    fns = {
        case: {name: _collective(*case, dev, group, world) for name, (dev, group, _) in backends.items()}
        for case in cases
    }
    for case in cases:  # warm up: compile, connect
        for name, fn in fns[case].items():
            _timed(fn, backends[name][2], 2, gloo)
    samples = {case: {name: [] for name in backends} for case in cases}
    order = random.Random(0)
    for _ in range(rounds):
        for case in order.sample(cases, len(cases)):
            calls = max(1, min(50, BYTES_PER_ROUND // case[1]))
            for name, fn in fns[case].items():
                samples[case][name].append(_timed(fn, backends[name][2], calls, gloo))
    return [
        {"op": op, "size": size, **{n: statistics.median(s) for n, s in samples[op, size].items()}}
        for op, size in cases
    ]


def _no_sync() -> None:
    pass


#: the coalesced case: this many float32 tensors of this many bytes each
COALESCED = (16, 16 << 10)


def _all_reduces(tensors, group, coalesced: bool):
    import torch.distributed as dist

    def separate():
        for t in tensors:
            dist.all_reduce(t, group=group)

    def together():
        with dist._coalescing_manager(group):
            separate()

    return together if coalesced else separate


def run_coalesced(rounds: int, gloo) -> dict:
    """Seconds per batch of :data:`COALESCED` all-reduces, one by one and in one
    ``_coalescing_manager`` (tpu_dist: one program; gloo: its ``allreduce_coalesced``)."""
    import torch
    import torch.distributed as dist

    count, size = COALESCED
    backends = {"tpu_dist": ("tpu", dist.group.WORLD, torch.tpu.synchronize), "gloo": ("cpu", gloo, _no_sync)}
    samples = {}
    for name, (device, group, sync) in backends.items():
        tensors = [torch.ones(size // 4, device=device) for _ in range(count)]
        for coalesced in (False, True):
            fn = _all_reduces(tensors, group, coalesced)
            _timed(fn, sync, 2, gloo)  # (warm up)
            times = [_timed(fn, sync, 5, gloo) for _ in range(rounds)]
            samples[f"{name} {'coalesced' if coalesced else 'one by one'}"] = statistics.median(times)
    return samples


def run_ddp(device: str, gloo) -> float:
    """Median seconds per SGD step of the GPT (DDP when there are several processes)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torch_tpu.demo.model import GPT, GPTConfig

    config = GPTConfig(vocab_size=96, block_size=64, n_layer=4, n_head=4, n_embd=128)
    torch.manual_seed(0)
    model = GPT(config).to(device)
    world = dist.get_world_size()
    if world > 1:
        model = DDP(model, process_group=None if device == "tpu" else gloo)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    idx = torch.randint(0, config.vocab_size, (8, config.block_size + 1), generator=g).to(device)
    sync = torch.tpu.synchronize if device == "tpu" else _no_sync

    def step():
        _, loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(DDP_WARMUP):
        step()
    return statistics.median(_timed(step, sync, 1, gloo) for _ in range(DDP_STEPS))


def worker(args) -> None:
    import warnings

    import torch.distributed as dist

    import torch_tpu  # noqa: F401  (registers tpu and "tpu_dist")

    # torch 2.13 suggests *_single for the two *_tensor collectives (the same calls)
    warnings.filterwarnings("ignore", category=FutureWarning, message=".*is deprecated. Please use")
    dist.init_process_group("tpu_dist")
    gloo = dist.new_group(backend="gloo")
    world = dist.get_world_size()
    result: dict = {"world": world}
    if world > 1:
        sizes = QUICK_SIZES if args.quick else SIZES
        result["collectives"] = run_collectives(sizes, 3 if args.quick else 7, gloo, world)
        result["coalesced"] = run_coalesced(3 if args.quick else 7, gloo)
    if world <= 2:  # (DDP compares one process with two)
        result["ddp"] = {device: run_ddp(device, gloo) for device in ("tpu", "cpu")}
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- launcher side


def launch(nproc: int, quick: bool) -> dict:
    from torch_tpu.distributed.runtime import free_port_pair

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        command = [
            sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
            "--master-addr=127.0.0.1", f"--master-port={free_port_pair()}",
            os.path.abspath(__file__), "--worker", "--out", out, *(["--quick"] if quick else []),
        ]  # fmt: skip
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        with open(out) as f:
            return json.load(f)


def _size(b: int) -> str:
    return f"{b >> 20} MB" if b >= 1 << 20 else f"{b >> 10} KB"


def _busbw(op: str, size: int, seconds: float, world: int) -> float:
    factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
    return size / seconds * factor / 1e9


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


COLLECTIVE_HEADER = [
    "collective",
    "ranks",
    "size",
    "tpu_dist",
    "gloo",
    "tpu_dist / gloo",
    "busbw tpu_dist GB/s",
    "busbw gloo GB/s",
]
DDP_HEADER = ["DDP (tpu: tpu_dist, cpu: gloo)", "1 process", "2 processes", "2 / 1", "2 - 1"]
COALESCED_HEADER = [
    "ranks",
    f"{COALESCED[0]} all_reduces of {_size(COALESCED[1])}",
    "tpu_dist",
    "gloo",
    "tpu_dist / gloo",
]


def tables(runs: dict[int, dict]) -> list[tuple[list[str], list[list[str]]]]:
    collectives = [
        [
            r["op"],
            str(world),
            _size(r["size"]),
            _time(r["tpu_dist"]),
            _time(r["gloo"]),
            f"{r['tpu_dist'] / r['gloo']:.2f}x",
            f"{_busbw(r['op'], r['size'], r['tpu_dist'], world):.2f}",
            f"{_busbw(r['op'], r['size'], r['gloo'], world):.2f}",
        ]
        for world, run in sorted(runs.items())
        for r in run.get("collectives", [])
    ]
    one, two = runs[1]["ddp"], runs[2]["ddp"]
    ddp = [
        [
            f"GPT step, {device}",
            _time(one[device]),
            _time(two[device]),
            f"{two[device] / one[device]:.2f}x",
            _time(two[device] - one[device]),
        ]
        for device in ("tpu", "cpu")
    ]
    ddp.append(["tpu / cpu", "", f"{two['tpu'] / two['cpu']:.2f}x", "", ""])
    coalesced = [
        [
            str(world),
            how,
            _time(r[f"tpu_dist {how}"]),
            _time(r[f"gloo {how}"]),
            f"{r[f'tpu_dist {how}'] / r[f'gloo {how}']:.2f}x",
        ]
        for world, run in sorted(runs.items())
        if (r := run.get("coalesced"))
        for how in ("one by one", "coalesced")
    ]
    return [(COLLECTIVE_HEADER, collectives), (COALESCED_HEADER, coalesced), (DDP_HEADER, ddp)]


def print_tables(parts, markdown: bool) -> None:
    for header, rows in parts:
        if markdown:
            print("| " + " | ".join(header) + " |")
            print("|" + "---|" * len(header))
            for r in rows:
                print("| " + " | ".join(r) + " |")
        else:
            widths = [max(len(x) for x in col) for col in zip(header, *rows)]
            for r in [header, *rows]:
                print("  ".join(x.ljust(w) for x, w in zip(r, widths)))
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument(
        "--ranks", type=lambda v: [int(x) for x in v.split(",")], default=[2, 4], help="job sizes (2,4)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    _docs.add_flag(parser)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    start = time.time()
    runs = {world: launch(world, args.quick) for world in (*args.ranks, 1)}
    print(f"# bench_distributed ({time.time() - start:.0f} s, load average {os.getloadavg()[0]:.1f})")
    with _docs.section("distributed", args):
        print_tables(tables(runs), args.markdown)


if __name__ == "__main__":
    main()
