"""Functional collectives (``torch.distributed._functional_collectives``, the
``_c10d_functional`` ops DTensor and FSDP2 use) on tpu tensors, against the same calls on CPU
tensors over gloo, bit for bit: in strict and fused eager (PyTorch's kernels call the process
group), and inside ``torch.compile(backend="tpu")``, where they are XLA collectives of the
graph's own program (one collective of the group per call, not one per collective node)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from common import Worker

import torch_tpu

w = Worker()
rank, world = w.rank, w.world
world_group = dist.group.WORLD
g = torch.Generator().manual_seed(100 + rank)
x, y = torch.randn(3, 5, generator=g), torch.randn(4, 6, generator=g)


def collectives(x, y, group):
    wait = funcol.wait_tensor
    return [
        funcol.all_reduce(x, "sum", group),
        funcol.all_reduce(x, "max", group),
        funcol.all_reduce(x.t(), "min", group),  # (a transposed view)
        funcol.all_gather_tensor(y, 0, group),
        funcol.all_gather_tensor(y, 1, group),
        funcol.reduce_scatter_tensor(y, "sum", 0, group),
        funcol.reduce_scatter_tensor(y, "sum", 1, group),
        funcol.all_to_all_single(y, None, None, group),
        funcol.broadcast(x, 1, group),
        *funcol.all_reduce_coalesced([x, y], "sum", group),
        *funcol.all_gather_into_tensor_coalesced([x, y], group),
        *funcol.reduce_scatter_tensor_coalesced([y, y * 2], "sum", [0, 0], group),
        wait(torch.ops._c10d_functional.all_reduce(y * 3, "product", dist._get_process_group_name(group))),
    ]


def averaged(x, group):
    return funcol.all_reduce(x, "avg", group)


want = [t.wait() if hasattr(t, "wait") else t for t in collectives(x, y, w.gloo)]
want_avg = funcol.all_reduce(x, "sum", w.gloo) / world


def check(got: list, got_avg: torch.Tensor, what: str) -> None:
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        w.same(a, b, f"{what}: collective {i}")
    w.same(got_avg, want_avg, f"{what}: avg")


for mode in ("strict", "fused"):
    with torch_tpu.eager_mode(mode):
        check(collectives(x.to("tpu"), y.to("tpu"), world_group), averaged(x.to("tpu"), world_group), mode)
        # an uneven all_to_all_single (rank r sends r + 1 rows to rank 0)
        splits_in = [rank + 1, 3 - rank]
        splits_out = [1, 2] if rank == 0 else [3, 2]
        z = torch.arange(16.0).reshape(4, 4) + 100 * rank
        w.same(
            funcol.all_to_all_single(z.to("tpu"), splits_out, splits_in, world_group),
            funcol.all_to_all_single(z, splits_out, splits_in, w.gloo).wait(),
            f"{mode}: uneven all_to_all_single",
        )

compiled = torch.compile(lambda x, y: collectives(x, y, world_group), backend="tpu")
compiled_avg = torch.compile(lambda x: averaged(x, world_group), backend="tpu")
for call in range(2):  # (the second call runs the stored executable)
    before = w.collectives()
    got = compiled(x.to("tpu"), y.to("tpu"))
    assert w.collectives() == before + 1, (
        f"rank {rank}: {w.collectives() - before} collectives for one compiled call"
    )
    check(got, compiled_avg(x.to("tpu")), f"compiled (call {call})")

# in the debug mode, ranks that call a compiled graph with different shapes: every rank raises,
# the group survives
dist.set_debug_level(dist.DebugLevel.DETAIL)
checked_group = dist.new_group(backend="tpu_dist")
dist.set_debug_level(dist.DebugLevel.OFF)
mismatched = torch.compile(lambda t: funcol.all_reduce(t * 2, "sum", checked_group), backend="tpu")
w.raises(
    RuntimeError,
    ["compiled graph", "different collectives"],
    lambda: mismatched(torch.ones(3 + rank, device="tpu")),
    "compiled graph called with different shapes",
)
w.same(
    funcol.all_reduce(torch.ones(2, device="tpu"), "sum", checked_group),
    torch.full((2,), 2.0),
    "the group after the mismatch",
)
uneven = torch.compile(lambda t: funcol.all_to_all_single(t, [1, 3], [1, 3], world_group), backend="tpu")
w.raises(
    NotImplementedError,
    ["uneven split sizes"],
    lambda: uneven(torch.ones(4, device="tpu")),
    "uneven all_to_all_single in a compiled graph",
)
w.done()
