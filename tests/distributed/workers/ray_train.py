"""Ray Train on tpu: a ``TorchTrainer`` with two TPU workers on a local Ray cluster (the TPU
resources declared, as on a TPU host; on the CPU stand-in each worker's tpu is XLA's CPU device).
Ray picks ``"tpu_dist"`` from the TPU resource, loads torch_tpu through ``torch_tpu._loader``,
gives each worker ``torch.device("tpu")`` and ``TPU_VISIBLE_CHIPS``; ``prepare_model`` wraps the
model in DDP. Each worker trains on its half of every batch; the losses and final parameters must
equal this (driver) process training on the whole batch, within the rounding that run shows
against the same run in float64 on CPU. Prints ``ray ok <checks>`` at the end."""

from __future__ import annotations

import os
import sys

import ray
import ray.train
import ray.train.torch
import torch
from torch import nn

from torch_tpu.testing.reference import derived_tolerance

STEPS, BATCH, WORLD = 3, 4, 2


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 4))


def batches():
    g = torch.Generator().manual_seed(7)
    return [
        (torch.randn(WORLD * BATCH, 8, generator=g), torch.randn(WORLD * BATCH, 4, generator=g))
        for _ in range(STEPS)
    ]


def train(model, device, rows=slice(None)):
    """Losses and final parameters (on CPU, float64) after SGD on ``rows`` of every batch."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches():
        x, y = x[rows].to(device, model_dtype(model)), y[rows].to(device, model_dtype(model))
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), [p.detach().cpu() for p in model.parameters()]


def model_dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def train_loop_per_worker(config: dict) -> None:
    import jax
    import torch.distributed as dist

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    model = ray.train.torch.prepare_model(make_model())
    found = {
        "device": str(device),
        "backend": dist.get_backend(),
        "ddp": isinstance(model, nn.parallel.DistributedDataParallel),
        "param_device": next(model.parameters()).device.type,
        "visible_chips": os.environ.get("TPU_VISIBLE_CHIPS"),
        "world": world,
        "jax_process": (jax.process_index(), jax.process_count()),
    }
    losses, params = train(model, device, slice(rank * BATCH, (rank + 1) * BATCH))
    dist.all_reduce(losses, dist.ReduceOp.AVG)  # equal halves: the whole batch's loss
    # every rank's parameters, to check the replicas are identical
    gathered = []
    for p in params:
        both = [torch.empty_like(p, device="tpu") for _ in range(world)]
        dist.all_gather(both, p.to("tpu"))
        gathered.append([b.cpu() for b in both])
    if rank == 0:
        torch.save({"found": found, "losses": losses.cpu(), "params": gathered}, config["out"])


def main(out: str) -> None:
    ray.init(
        address="local",
        num_cpus=2,
        resources={"TPU": 4, "accelerator_type:TPU-V6E": 1},
        include_dashboard=False,
    )
    trainer = ray.train.torch.TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"out": out},
        scaling_config=ray.train.ScalingConfig(
            num_workers=WORLD,
            use_tpu=True,
            topology="2x2",
            accelerator_type="TPU-V6E",
            resources_per_worker={"TPU": 2},
        ),
        run_config=ray.train.RunConfig(storage_path=os.path.dirname(os.path.abspath(out))),
    )
    trainer.fit()
    ray.shutdown()
    saved = torch.load(out)

    found = saved["found"]
    assert found["device"] == "tpu" and found["backend"] == "tpu_dist", found
    assert found["ddp"] and found["param_device"] == "tpu" and found["world"] == WORLD, found
    assert found["jax_process"] == (0, WORLD), found  # rank 0 is JAX process 0 of 2
    assert len(found["visible_chips"].split(",")) == 2, found  # Ray's mask: the worker's 2 chips
    checks = 0
    losses, params = train(make_model().to("tpu"), "tpu")
    ref_losses, ref_params = train(make_model().double(), "cpu")
    pairs = [("losses", saved["losses"], losses.cpu(), ref_losses)]
    for i, (ranks, p, ref) in enumerate(zip(saved["params"], params, ref_params)):
        assert torch.equal(ranks[0], ranks[1]), f"parameter {i} differs between the workers"
        pairs.append((f"parameter {i}", ranks[0], p, ref))
    for what, workers, one_process, float64 in pairs:
        torch.testing.assert_close(
            workers, one_process, **derived_tolerance(one_process, float64), msg=lambda m: f"{what}: {m}"
        )
        checks += 1
    print(f"ray ok {checks}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
