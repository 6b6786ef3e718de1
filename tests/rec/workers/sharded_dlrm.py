"""TorchRec's DLRM, its embedding tables sharded over 2 processes by TorchRec's planner and
``DistributedModelParallel`` (fused optimizer in the backward, dense part data-parallel): on tpu
over tpu_dist, and the same on CPU over gloo in the same processes. Each rank prints its losses on
both, and ``rank <r> ok`` when the tpu ones are CPU's (table-wise on CPU for row-wise on tpu:
TorchRec shards row-wise on accelerators only).

Usage: ``torchrun --nproc-per-node 2 sharded_dlrm.py <sharding> <sgd|rowwise_adagrad> [kernel]``
(``kernel``: tpu's compute kernel, the planner's choice by default; CPU's is ``fused``)."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import ShardingEnv
from torchrec.models.dlrm import DLRM
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

import torch_tpu  # noqa: F401

SHARDING, OPTIMIZER = sys.argv[1], sys.argv[2]
KERNEL = sys.argv[3] if len(sys.argv) > 3 else None
TABLES, ROWS, DIM, DENSE, BATCH, STEPS = 3, 40, 16, 4, 4, 4  # (UNFUSED_TPU: widths of 16s)
FEATURES = [f"f{t}" for t in range(TABLES)]

dist.init_process_group()  # tpu:tpu_dist
rank, world = dist.get_rank(), dist.get_world_size()
GROUPS = {"tpu": dist.group.WORLD, "cpu": dist.new_group(backend="gloo")}


def reference_state() -> dict:
    """The unsharded model's parameters, the same on every rank (the seed)."""
    torch.manual_seed(0)
    return {k: v.detach().clone() for k, v in make_model(torch.device("cpu")).state_dict().items()}


def make_model(device, dense_device=None) -> DLRM:
    tables = [
        EmbeddingBagConfig(name=f"t{t}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[FEATURES[t]])
        for t in range(TABLES)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=device)
    return DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=DENSE,
        dense_arch_layer_sizes=[8, DIM],
        over_arch_layer_sizes=[8, 1],
        dense_device=dense_device or device,
    )


def batches() -> list:
    """This rank's batches: dense features, ids (1-3 per bag), labels."""
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(STEPS):
        lengths = torch.randint(1, 4, (TABLES * BATCH,), generator=g)
        ids = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
        out.append(
            (
                torch.randn(BATCH, DENSE, generator=g),
                lengths,
                ids,
                torch.randint(0, 2, (BATCH,), generator=g).float(),
            )
        )
    return out


def sharded(device_type: str, state: dict, sharding: str):
    """The DLRM sharded by the planner as ``sharding`` over this device's group, its tables
    filled from ``state``, with its optimizers."""
    device = torch.device(device_type)
    model = make_model(torch.device("meta"))
    fused = {
        "sgd": (torch.optim.SGD, {"lr": 0.1}),
        "rowwise_adagrad": (RowWiseAdagrad, {"lr": 0.1, "eps": 0.01}),
    }
    apply_optimizer_in_backward(*fused[OPTIMIZER][:1], model.sparse_arch.parameters(), fused[OPTIMIZER][1])
    topology = Topology(world_size=world, compute_device=device_type)
    kernels = [KERNEL] if KERNEL and device_type == "tpu" else None
    constraint = ParameterConstraints(sharding_types=[sharding], compute_kernels=kernels)
    constraints = {f"t{t}": constraint for t in range(TABLES)}
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    plan = planner.collective_plan(model, None, GROUPS[device_type])
    env = ShardingEnv.from_process_group(GROUPS[device_type])
    dmp = DistributedModelParallel(model, env=env, plan=plan, device=device)
    fill(dmp, state)
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda p: torch.optim.SGD(p, lr=0.1)
    )
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense])


def fill(dmp, state: dict) -> None:
    """Every local shard and replica from the full parameters (the shards' offsets say where)."""
    with torch.no_grad():
        for name, value in dmp.state_dict().items():
            full = state[name.removeprefix("module.")]
            if hasattr(value, "local_shards"):
                for shard in value.local_shards():
                    (r0, c0), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(full[r0 : r0 + rows, c0 : c0 + cols])
            else:
                value.copy_(full)


def train(device_type: str, state: dict, sharding: str) -> list:
    dmp, opt = sharded(device_type, state, sharding)
    device, losses = torch.device(device_type), []
    for dense, lengths, ids, labels in batches():
        kjt = KeyedJaggedTensor(keys=FEATURES, values=ids.to(device), lengths=lengths.to(device))
        logits = dmp(dense.to(device), kjt).squeeze(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def default_plan_runs() -> int:
    """``DistributedModelParallel(model, device=tpu)`` as TorchRec's README writes it: its own
    planner, topology and environment (the default group)."""
    tpu = torch.device("tpu")
    dmp = DistributedModelParallel(make_model(torch.device("meta"), dense_device=tpu), device=tpu)
    dense, lengths, ids, _ = batches()[0]
    kjt = KeyedJaggedTensor(keys=FEATURES, values=ids.to("tpu"), lengths=lengths.to("tpu"))
    assert dmp(dense.to("tpu"), kjt).shape == (BATCH, 1)
    return 1


state = reference_state()
# (TorchRec shards row-wise on accelerators only: CPU's reference is then its table-wise run, the
# same model and steps laid out otherwise)
expected = train("cpu", state, "table_wise" if SHARDING == "row_wise" else SHARDING)
got = train("tpu", state, SHARDING)
print(f"rank {rank} losses cpu {expected} tpu {got}", flush=True)
torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=1e-6)
assert expected[-1] != expected[0]
checks = len(got) + (default_plan_runs() if SHARDING == "table_wise" else 0)
print(f"rank {rank} ok {checks}", flush=True)
dist.destroy_process_group()
