"""Train TorchRec's DLRM on tpu, its embedding tables sharded over the processes by TorchRec.

TorchRec's random Criteo-like data (``RandomRecDataset``: 13 dense features, 26 sparse ones)
trains ``torchrec.models.dlrm.DLRM``; ``DistributedModelParallel`` shards the tables over the
processes as TorchRec's planner chooses (or as ``--sharding`` says), with the embedding optimizer
(rowwise Adagrad) fused into the backward and the dense part data-parallel. Nothing tpu-specific
is configured beyond the device. It needs TorchRec (``scripts/install_rec.sh``). Run it with::

    python examples/dlrm.py                                   # one process
    torchrun --nproc-per-node 2 examples/dlrm.py              # tables sharded over 2 processes
    torchrun --nproc-per-node 4 examples/dlrm.py --full       # Criteo-sized: 26 tables of 1M rows

It prints the loss every few steps and the steps per second; the exit status is non-zero when
the loss did not fall (the data repeats every 10 batches, which the model learns).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from _common import loss_fell, parse_training_args
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.datasets.random import RandomRecDataset
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.models.dlrm import DLRM
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

import torch_tpu  # noqa: F401

DENSE, SPARSE = 13, 26  # Criteo's features


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps (40)")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step and process (32)")
    parser.add_argument("--rows", type=int, default=1000, help="rows per table (1000)")
    parser.add_argument("--dim", type=int, default=16, help="embedding width (16)")
    parser.add_argument("--lr", type=float, default=0.02, help="learning rate (0.02)")
    parser.add_argument("--sharding", help="table_wise, row_wise, column_wise, ... (the planner's choice)")
    parser.add_argument("--full", action="store_true", help="Criteo-sized: 1M rows of 128, batch 2048")
    args = parse_training_args(parser, argv)
    if args.full:
        args.rows, args.dim, args.batch_size = 1_000_000, 128, 2048
    return args


def model(args, device: torch.device) -> DLRM:
    """DLRM with its tables on the meta device (``DistributedModelParallel`` makes their shards)."""
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=[f"f{i}"]
        )
        for i in range(SPARSE)
    ]
    return DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
        dense_in_features=DENSE,
        dense_arch_layer_sizes=[64, args.dim],
        over_arch_layer_sizes=[64, 32, 1],
        dense_device=device,
    )


def sharded(args, dlrm: DLRM, device: torch.device):
    """The model sharded by TorchRec, and its optimizers (fused for the tables, Adagrad for the rest)."""
    apply_optimizer_in_backward(RowWiseAdagrad, dlrm.sparse_arch.parameters(), {"lr": args.lr})
    plan = None
    if args.sharding:
        constraints = {f"t{i}": ParameterConstraints(sharding_types=[args.sharding]) for i in range(SPARSE)}
        topology = Topology(world_size=dist.get_world_size(), compute_device=device.type)
        plan = EmbeddingShardingPlanner(topology=topology, constraints=constraints).collective_plan(dlrm)
    dmp = DistributedModelParallel(dlrm, device=device, plan=plan)
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=args.lr),
    )
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense])


def train(args, dmp, optimizer, device: torch.device) -> list[float]:
    data = RandomRecDataset(
        keys=[f"f{i}" for i in range(SPARSE)], batch_size=args.batch_size, hash_size=args.rows,
        ids_per_feature=3, num_dense=DENSE, manual_seed=dist.get_rank(), num_generated_batches=10,
    )  # fmt: skip
    losses, batches, start = [], iter(data), None
    for step in range(args.steps):
        batch = next(batches).to(device)
        logits = dmp(batch.dense_features, batch.sparse_features).squeeze(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels.float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        start = start or time.perf_counter()  # (after the first step's compiles)
        if dist.get_rank() == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.4f}", flush=True)
    if dist.get_rank() == 0:
        rate = (args.steps - 1) / (time.perf_counter() - start)
        print(f"{rate:.1f} steps/s ({rate * args.batch_size * dist.get_world_size():.0f} samples/s)")
    return losses


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # (one process without torchrun)
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group(
        rank=int(os.environ.get("RANK", 0)), world_size=int(os.environ.get("WORLD_SIZE", 1))
    )
    device = torch.device("tpu")
    dmp, optimizer = sharded(args, model(args, device), device)
    if dist.get_rank() == 0:
        print(
            f"DLRM: {SPARSE} tables of {args.rows} x {args.dim} on {dist.get_world_size()} process(es); plan:"
        )
        print(dmp.plan)
    losses = train(args, dmp, optimizer, device)
    window = min(10, len(losses) // 2)
    failed = loss_fell(losses, window) if dist.get_rank() == 0 else 0
    dist.destroy_process_group()
    return failed


if __name__ == "__main__":
    sys.exit(main())
