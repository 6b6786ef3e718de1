"""``torch.distributed.checkpoint`` of an FSDP2 model and its Adam state on tpu across a
restart. ``save``: train, save the sharded model and optimizer state dicts, train on, and record
this rank's state and later losses. ``load`` (a new torchrun): build the model again from other
parameters, load the checkpoint, train on: the state must be the one saved and the losses those
the first run had, bit for bit."""

from __future__ import annotations

import sys

import torch
import torch.distributed.checkpoint as dcp
from common import Worker, sharded_mlp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh

mode, directory, record = sys.argv[1:4]  # (record: this rank's saved state and later losses)
w = Worker()
rank, world = w.rank, w.world
mesh = init_device_mesh("tpu", (world,))
BATCH = 4

model, opt = sharded_mlp(mesh, seed=0 if mode == "save" else 1)  # (the loaded run: other parameters)
g = torch.Generator().manual_seed(7)
data = [
    (torch.randn(world * BATCH, 8, generator=g), torch.randn(world * BATCH, 4, generator=g)) for _ in range(6)
]


def train(batches) -> torch.Tensor:
    losses = []
    for x, y in batches:
        x, y = x[rank * BATCH : (rank + 1) * BATCH], y[rank * BATCH : (rank + 1) * BATCH]
        loss = nn.functional.mse_loss(model(x.to("tpu")), y.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses).cpu()


def state() -> dict:
    model_state, optimizer_state = get_state_dict(model, opt)
    return {"model": model_state, "optimizer": optimizer_state}


def local_values() -> list[torch.Tensor]:
    values = torch.utils._pytree.tree_leaves(state())
    # (copies: Adam's step counters are CPU tensors, updated in place)
    return [
        (v.to_local() if hasattr(v, "to_local") else v).cpu().clone()
        for v in values
        if isinstance(v, torch.Tensor)
    ]


if mode == "save":
    train(data[:3])
    dcp.save(state(), checkpoint_id=directory)
    saved = local_values()
    torch.save((saved, train(data[3:])), f"{record}.{rank}")
    w.checks += 1
else:
    loaded = state()
    dcp.load(loaded, checkpoint_id=directory)
    set_state_dict(model, opt, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])
    saved, losses = torch.load(f"{record}.{rank}")
    for i, (got, want) in enumerate(zip(local_values(), saved, strict=True)):
        assert torch.equal(got, want), f"rank {rank}: state value {i} differs from the saved one"
    w.checks += 1
    w.same(train(data[3:]), losses, "losses after loading the checkpoint")
w.done()
