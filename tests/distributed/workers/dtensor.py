"""DTensor on tpu: ``distribute_tensor`` (Shard, Replicate), ``redistribute`` between
placements (Partial included), ``full_tensor``, against the CPU tensors they came from; then
tensor parallelism (``parallelize_module`` with ColwiseParallel/RowwiseParallel) of an attention
block and an MLP, trained for a few steps eagerly and under ``torch.compile(backend="tpu")``
(the collectives inside the forward and backward graphs): losses and parameters equal one
process training the whole model."""

from __future__ import annotations

import torch
from common import Worker
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

w = Worker()
rank, world = w.rank, w.world
mesh = init_device_mesh("tpu", (world,))
torch.manual_seed(0)
a = torch.randn(6, 4)

# -- placements and redistribution
for placement, local in [
    (Shard(0), a.chunk(world, 0)[rank]),
    (Shard(1), a.chunk(world, 1)[rank]),
    (Replicate(), a),
]:
    d = distribute_tensor(a.to("tpu"), mesh, [placement])
    w.same(d.to_local(), local, f"distribute_tensor {placement}: the local shard")
    w.same(d.full_tensor(), a, f"{placement}: full_tensor")
    for target in (Shard(0), Shard(1), Replicate()):
        moved = d.redistribute(mesh, [target])
        w.same(moved.full_tensor(), a, f"redistribute {placement} -> {target}")
partial = DTensor.from_local(a.to("tpu") * (rank + 1), mesh, [Partial()])
w.same(partial.full_tensor(), a * sum(range(1, world + 1)), "Partial -> full_tensor (a sum)")
w.same(
    partial.redistribute(mesh, [Shard(0)]).to_local(),
    (a * sum(range(1, world + 1))).chunk(world, 0)[rank],
    "Partial -> Shard(0) (a reduce_scatter)",
)
sharded = distribute_tensor(a.to("tpu"), mesh, [Shard(0)])
torch.testing.assert_close((sharded @ sharded.T).full_tensor().cpu(), a @ a.T)
w.checks += 1


# -- tensor parallelism
class Attention(nn.Module):
    def __init__(self, dim: int, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        b, t, _ = x.shape
        # (-1 heads: a tensor-parallel rank holds its share of the heads)
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = Attention(dim, head_dim=4)
        self.mlp = nn.Sequential(nn.Linear(dim, 32), nn.GELU(), nn.Linear(32, dim))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def make_block() -> nn.Module:
    torch.manual_seed(0)
    return Block().to("tpu")


def make_mlp() -> nn.Module:
    """An MLP after a replicated linear: the input of the column-parallel layer needs a
    gradient, so the backward graph has a collective too."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 16), nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
    ).to("tpu")


BLOCK_PLAN = {
    "attention.q": ColwiseParallel(),
    "attention.k": ColwiseParallel(),
    "attention.v": ColwiseParallel(),
    "attention.o": RowwiseParallel(),
    "mlp.0": ColwiseParallel(),
    "mlp.2": RowwiseParallel(),
}
MLP_PLAN = {"1.0": ColwiseParallel(), "1.2": RowwiseParallel()}
g = torch.Generator().manual_seed(1)
data = [(torch.randn(2, 5, 16, generator=g), torch.randn(2, 5, 16, generator=g)) for _ in range(3)]


def train(model, compile_model: bool = False):
    # (per parameter: the LayerNorms hold plain tensors, the linears DTensors. Not Adam: the
    # keys' bias has a zero gradient up to rounding, which Adam would scale up to lr-sized noise)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
    step = torch.compile(model, backend="tpu") if compile_model else model
    losses, before = [], w.collectives()
    for x, y in data:
        loss = nn.functional.mse_loss(step(x.to("tpu")), y.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    if compile_model:  # the collectives ran inside the forward and backward graphs' programs
        assert w.collectives() - before == 2 * len(data), (
            f"rank {rank}: {w.collectives() - before} collectives"
        )
    params = {n: p.full_tensor() if isinstance(p, DTensor) else p for n, p in model.named_parameters()}
    return torch.stack(losses).cpu(), {n: p.detach().cpu() for n, p in params.items()}


def close(got, want, what):
    torch.testing.assert_close(got, want, msg=lambda m: f"rank {rank}: {what}: {m}")
    w.checks += 1


for what, make, plan, compile_model in [
    ("tensor parallel attention block", make_block, BLOCK_PLAN, False),
    ("tensor parallel MLP compiled", make_mlp, MLP_PLAN, True),
]:
    ref_losses, ref_params = train(make())
    model = parallelize_module(make(), mesh, plan)
    losses, params = train(model, compile_model)
    close(losses, ref_losses, f"{what}: losses vs one process")
    for name, p in params.items():
        close(p, ref_params[name], f"{what}: {name} vs one process")
    print(f"rank {rank} {what}: largest loss difference {(losses - ref_losses).abs().max().item():.3g}")
w.done()
