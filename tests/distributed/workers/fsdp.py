"""FSDP2 (``fully_shard``) on tpu: a model built on the meta device, sharded per layer and at the
root, materialized with ``to_empty(device="tpu")``, trains for a few steps on each rank's half
of every batch; losses and parameters equal one process training on the whole batch (resharding
after forward or not, a gradient divide factor given (PREMUL_SUM), and under ``torch.compile``).
With a bfloat16 ``MixedPrecisionPolicy`` it equals FSDP2 with the same policy on a one-rank
mesh (the same casts, one process) within bfloat16's tolerance."""

from __future__ import annotations

import torch
import torch.distributed as dist
from common import Worker
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

w = Worker()
rank, world = w.rank, w.world
mesh = init_device_mesh("tpu", (world,))
alone, _ = dist.new_subgroups(group_size=1)  # (a one-rank group per rank)
alone_mesh = DeviceMesh.from_group(alone, "tpu")
STEPS, BATCH = 3, 4


def make(device="cpu") -> nn.Module:
    torch.manual_seed(0)
    with torch.device(device):
        return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 4))


g = torch.Generator().manual_seed(7)
data = [
    (torch.randn(world * BATCH, 8, generator=g), torch.randn(world * BATCH, 4, generator=g))
    for _ in range(STEPS)
]


def sharded(on, divide_factor=None, compile_model=False, **options) -> tuple[nn.Module, nn.Module]:
    """The model on the meta device, sharded over ``on``, materialized on tpu and loaded with
    the reference's initial parameters; and the module to call."""
    model = make("meta")
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=on, **options)
    fully_shard(model, mesh=on, **options)
    model.to_empty(device="tpu")
    with torch.no_grad():
        for p, q in zip(model.parameters(), make().parameters()):
            p.copy_(distribute_tensor(q.to("tpu"), on, p.placements))
    if divide_factor is not None:
        for module in (model[0], model[3], model):  # (each sharded module's own setting)
            module.set_gradient_divide_factor(divide_factor)
    return model, torch.compile(model, backend="tpu") if compile_model else model


def train(model, call, shard: bool, loss_scale: float = 1.0):
    """Losses and final parameters (full, on CPU) after SGD with momentum on ``data`` (this rank's half if
    ``shard``), minimizing ``loss_scale`` times the loss."""
    # (not Adam: it would scale bfloat16 rounding in near-zero gradients up to lr-sized steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in data:
        if shard:
            x, y = x[rank * BATCH : (rank + 1) * BATCH], y[rank * BATCH : (rank + 1) * BATCH]
        loss = nn.functional.mse_loss(call(x.to("tpu")).float(), y.to("tpu"))
        opt.zero_grad()
        (loss * loss_scale).backward()
        opt.step()
        losses.append(loss.detach())
    losses = torch.stack(losses)
    if shard:  # the whole batch's loss: the mean of the ranks' (equal halves)
        dist.all_reduce(losses, dist.ReduceOp.AVG)
    params = [p.full_tensor() if isinstance(p, DTensor) else p for p in model.parameters()]
    return losses.cpu(), [p.detach().cpu() for p in params]


def close(got, want, what, **tolerance):
    torch.testing.assert_close(got, want, msg=lambda m: f"rank {rank}: {what}: {m}", **tolerance)
    w.checks += 1


def compare(what, got, want, dtype=None):
    """Equal within float32's tolerance, or within ``dtype``'s (relative, and absolute at the
    scale of each tensor: the resolution of ``dtype`` for its largest element)."""
    (losses, params), (ref_losses, ref_params) = got, want
    for i, (p, q) in enumerate(zip([losses, *params], [ref_losses, *ref_params], strict=True)):
        tolerance = {}
        if dtype is not None:
            tolerance = dict(rtol=torch.testing._comparison.default_tolerances(dtype)[0])
            tolerance["atol"] = torch.finfo(dtype).eps * q.abs().max().item()
        close(p, q, f"{what}: {f'parameter {i - 1}' if i else 'losses'}", **tolerance)
    print(f"rank {rank} {what}: largest loss difference {(losses - ref_losses).abs().max().item():.3g}")


reference = make().to("tpu")
one_process = train(reference, reference, shard=False)
for what, options in [
    ("FSDP2", {}),  # (gradients reduce-scattered with AVG)
    ("FSDP2 reshard_after_forward=False", dict(reshard_after_forward=False)),
    ("FSDP2 compiled", dict(compile_model=True)),
]:
    model, call = sharded(mesh, **options)
    assert isinstance(model[0].weight, DTensor) and model[0].weight.to_local().shape == (16 // world, 8)
    compare(what, train(model, call, shard=True), one_process)
# A divide factor other than the world size reduce-scatters with PREMUL_SUM(1 / factor): twice
# the world size halves the gradients, exactly as halving the loss does (a power of two).
reference = make().to("tpu")
compare(
    "FSDP2 gradient divide factor (PREMUL_SUM)",
    train(*sharded(mesh, divide_factor=2.0 * world), shard=True),
    train(reference, reference, shard=False, loss_scale=0.5),
)

bf16 = dict(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
compare(
    "FSDP2 bfloat16 MixedPrecisionPolicy",
    train(*sharded(mesh, **bf16), shard=True),
    train(*sharded(alone_mesh, **bf16), shard=False),
    dtype=torch.bfloat16,
)
w.done()
