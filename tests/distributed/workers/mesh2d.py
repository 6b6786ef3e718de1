"""Two nodes of two processes (two launches on this machine: ``torchrun`` with c10d
rendezvous, or ``torch_tpu.distributed.run`` in a simulated TPU VM environment): a 2-D mesh built
by ``topology.device_mesh`` with tensor parallelism within a node and FSDP across nodes.

- The mesh's layout: the ``tp`` axis pairs ranks of one node (torchrun numbers a node's
  processes consecutively), the ``dp`` axis crosses nodes; collectives on each axis's group.
- FSDP2 x TP (``fully_shard`` over ``dp`` of a module parallelized over ``tp``, as TorchTitan
  composes them) trains an MLP for 3 SGD steps on each ``dp`` rank's half of the batch: the
  losses (averaged over ``dp``) and the parameters equal one CPU process on the whole batch.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from common import Worker
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from torch_tpu.distributed.topology import device_mesh

w = Worker()
rank, world = w.rank, w.world
assert world == 4, world
mesh = device_mesh((2, 2), ("dp", "tp"))
node = int(os.environ["GROUP_RANK"])  # (torchrun's node rank)
assert mesh.mesh.tolist() == [[0, 1], [2, 3]] and rank // 2 == node, (mesh, rank, node)
w.checks += 1

if os.environ.get("TORCH_TPU_CHIP_PER_PROCESS"):  # (launched by torch_tpu.distributed.run)
    chip = (
        os.environ["TPU_VISIBLE_CHIPS"],
        os.environ["CLOUD_TPU_TASK_ID"],
        os.environ["TPU_PROCESS_BOUNDS"],
    )
    assert chip == (os.environ["LOCAL_RANK"], str(rank), "2,2,1"), chip
    w.checks += 1

# -- a collective on each axis
row, column = mesh.get_group("tp"), mesh.get_group("dp")
t = torch.full((3,), float(rank), device="tpu")
dist.all_reduce(t, group=row)
w.same(t, torch.full((3,), float(4 * node + 1)), "all_reduce over tp (this node's ranks)")
t = torch.full((3,), float(rank), device="tpu")
dist.all_reduce(t, group=column)
w.same(t, torch.full((3,), float(2 * (rank % 2) + 2)), "all_reduce over dp (across the nodes)")


# -- FSDP x TP against one CPU process
def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


g = torch.Generator().manual_seed(3)
batches = [(torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)) for _ in range(3)]


def train(model, shard=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in batches:
        if shard is not None:
            x, y = x.chunk(2)[shard].to("tpu"), y.chunk(2)[shard].to("tpu")
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


reference = mlp()
want = train(reference)
model = parallelize_module(mlp().to("tpu"), mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
fully_shard(model, mesh=mesh["dp"])
got = train(model, shard=mesh.get_local_rank("dp"))
for step, (mine, whole) in enumerate(zip(got, want)):
    averaged = mine.clone()
    dist.all_reduce(averaged, op=dist.ReduceOp.AVG, group=column)
    torch.testing.assert_close(averaged.cpu(), whole, msg=lambda m: f"rank {rank}: loss {step}: {m}")
    w.checks += 1
for (name, p), q in zip(model.named_parameters(), reference.parameters()):
    full = p.full_tensor() if isinstance(p, DTensor) else p
    torch.testing.assert_close(full.detach().cpu(), q.detach(), msg=lambda m: f"rank {rank}: {name}: {m}")
    w.checks += 1
w.done()
