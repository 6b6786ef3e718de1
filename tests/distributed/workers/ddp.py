"""DistributedDataParallel on tpu (no ``device_ids``): each rank trains on its half of every
batch; losses and parameters must equal a single process training on the whole batch, and the
replicas must stay identical. Then the same with ``torch.compile(backend="tpu")``."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from common import Worker
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

w = Worker(backend=None)  # the default backend for the tpu accelerator: tpu_dist
rank, world = w.rank, w.world
assert dist.get_backend_config() == "tpu:tpu_dist", dist.get_backend_config()
assert dist.get_default_backend_for_device("tpu") == "tpu_dist"
mesh = dist.device_mesh.init_device_mesh("tpu", (world,))
t = torch.full((2,), float(rank + 1), device="tpu")
dist.all_reduce(t, group=mesh.get_group())
w.same(t, torch.full((2,), 3.0), "all_reduce over init_device_mesh('tpu', ...)'s group")
STEPS, BATCH = 3, 4


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 4))


def batches():
    g = torch.Generator().manual_seed(7)
    return [
        (torch.randn(world * BATCH, 8, generator=g), torch.randn(world * BATCH, 4, generator=g))
        for _ in range(STEPS)
    ]


def train(model, data, shard: bool, compile_model: bool = False):
    """Losses and final parameters (on CPU) after SGD on ``data`` (this rank's part if ``shard``)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step_model = torch.compile(model, backend="tpu") if compile_model else model
    losses = []
    for x, y in data:
        if shard:
            x, y = x[rank * BATCH : (rank + 1) * BATCH], y[rank * BATCH : (rank + 1) * BATCH]
        loss = nn.functional.mse_loss(step_model(x.to("tpu")), y.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    losses = torch.stack(losses)
    if shard:  # the whole batch's loss is the mean of the ranks' (equal halves)
        dist.all_reduce(losses, dist.ReduceOp.AVG)
    return losses.cpu(), [p.detach().cpu() for p in model.parameters()]


data = batches()
ref_losses, ref_params = train(make_model().to("tpu"), data, shard=False)
cpu_model = make_model()
cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1, momentum=0.9)


def close(got, want, what):
    torch.testing.assert_close(got, want, msg=lambda m: f"rank {rank}: {what}: {m}")
    w.checks += 1


def replicas_equal(params, what):
    for i, p in enumerate(params):
        both = [torch.empty_like(p, device="tpu") for _ in range(world)]
        dist.all_gather(both, p.to("tpu"))
        w.same(both[0], both[1].cpu(), f"{what}: parameter {i} equal on every rank")


variants = {
    "DDP": dict(),
    "DDP gradient_as_bucket_view": dict(gradient_as_bucket_view=True),
    "DDP compiled": dict(),
}
if "--no-compile" in sys.argv:
    del variants["DDP compiled"]
for name, options in variants.items():
    model = DDP(make_model().to("tpu"), **options)
    losses, params = train(model, data, shard=True, compile_model="compiled" in name)
    close(losses, ref_losses, f"{name}: losses vs one process on the whole batch")
    for i, (p, q) in enumerate(zip(params, ref_params)):
        close(p, q, f"{name}: parameter {i} vs one process on the whole batch")
    replicas_equal(params, name)

w.done()
