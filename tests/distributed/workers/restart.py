"""A job that survives a killed rank (``torchrun --max-restarts 1``, c10d rendezvous: each
attempt's keys are apart on the store). FSDP2 trains 6 Adam steps
and saves a distributed checkpoint after each; ``python restart.py DIR kill``: in the first
attempt rank 1 is SIGKILLed in the middle of step 3 (after its forward); torchrun restarts both
ranks, which resume from the last checkpoint. Each rank appends ``attempt step loss`` to
``DIR/losses-<rank>.txt``; the test compares them with an uninterrupted run (``... DIR go``)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from common import Worker, sharded_mlp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh

directory, mode = Path(sys.argv[1]), sys.argv[2]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
# (no gloo group of torch's: its keys on the store torchrun's attempts share are not kept apart,
# and a restarted rank can read the last attempt's; tpu_dist keeps its own apart)
w = Worker(timeout=20, gloo=False)
rank, world = w.rank, w.world
mesh = init_device_mesh("tpu", (world,))
STEPS, BATCH, KILLED_AT = 6, 4, 3

model, opt = sharded_mlp(mesh, seed=0)

latest = directory / "latest"
start = 0
if latest.exists():  # (a restart: resume after the last saved step)
    saved = int(latest.read_text())
    model_state, optimizer_state = get_state_dict(model, opt)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(directory / f"step-{saved}"))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    start = saved + 1

for step in range(start, STEPS):
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(world * BATCH, 8, generator=g), torch.randn(world * BATCH, 4, generator=g)
    x, y = x[rank * BATCH : (rank + 1) * BATCH], y[rank * BATCH : (rank + 1) * BATCH]
    loss = nn.functional.mse_loss(model(x.to("tpu")), y.to("tpu"))
    if mode == "kill" and attempt == 0 and step == KILLED_AT and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with open(directory / f"losses-{rank}.txt", "a") as f:
        f.write(f"{attempt} {step} {loss.item()!r}\n")
    model_state, optimizer_state = get_state_dict(model, opt)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.save(state, checkpoint_id=str(directory / f"step-{step}"))
    dist.barrier()
    if rank == 0:
        latest.write_text(str(step))
w.done()
