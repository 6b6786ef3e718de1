"""Every c10d collective on tpu tensors (``tpu_dist``) against the same call on CPU tensors
(gloo), in one launch: reductions of every op and several dtypes, broadcast, gathers, scatters,
all-to-all (even and uneven), point to point, barrier, async work, subgroups, object
collectives."""

from __future__ import annotations

import torch
import torch.distributed as dist
from common import Worker

# The device starts before the group: it joins JAX's multi-process runtime from torchrun's
# environment (the other workers create the group first, which joins it).
early = torch.ones(3, device="tpu")
w = Worker()
rank, world = w.rank, w.world
dist.all_reduce(early)
w.same(early, torch.full((3,), 2.0), "all_reduce of a tensor made before init_process_group")
R = dist.ReduceOp
g = torch.Generator().manual_seed(1000 + rank)


def data(*shape, dtype=torch.float32) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-50, 50, shape, generator=g).to(dtype)


def compare(what: str, tensors, tpu_call, cpu_call=None) -> None:
    """``tpu_call(tensors on tpu)`` with the default (tpu_dist) group and ``cpu_call(tensors on
    CPU)`` with gloo (default: the same call with ``group=w.gloo``); every tensor must then hold
    the same values on both."""
    tpu = [t.to("tpu") for t in tensors]
    cpu = [t.clone() for t in tensors]
    tpu_call(tpu, None)
    (cpu_call or tpu_call)(cpu, w.gloo)
    for i, (a, b) in enumerate(zip(tpu, cpu)):
        w.same(a, b, f"{what} (tensor {i})")


# -- all_reduce: every op, several dtypes, 0-d, a non-contiguous view
for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32):
    for op in (R.SUM, R.MIN, R.MAX, R.PRODUCT):
        compare(
            f"all_reduce {op} {dtype}",
            [data(3, 5, dtype=dtype)],
            lambda ts, grp: dist.all_reduce(ts[0], op, grp),
        )
for op in (R.BAND, R.BOR, R.BXOR):
    compare(f"all_reduce {op}", [data(7, dtype=torch.int64)], lambda ts, grp: dist.all_reduce(ts[0], op, grp))
compare("all_reduce 0-d", [data(dtype=torch.float32)], lambda ts, grp: dist.all_reduce(ts[0], group=grp))
compare(
    "all_reduce of a transposed slice (in place into its base)",
    [data(6, 4)],
    lambda ts, grp: dist.all_reduce(ts[0][1:5].t(), group=grp),
)
compare(
    "all_reduce AVG (gloo: SUM / world)",
    [data(4, 3)],
    lambda ts, grp: dist.all_reduce(ts[0], R.AVG, grp),
    lambda ts, grp: (dist.all_reduce(ts[0], group=grp), ts[0].div_(world)),
)
factor = 0.25
compare(
    "all_reduce PREMUL_SUM (gloo: SUM of x * factor)",
    [data(5)],
    lambda ts, grp: dist.all_reduce(ts[0], dist._make_nccl_premul_sum(factor), grp),
    lambda ts, grp: (ts[0].mul_(factor), dist.all_reduce(ts[0], group=grp)),
)
w.raises(
    ValueError,
    ["AVG", "int64"],
    lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64, device="tpu"), R.AVG),
    "integer AVG",
)

# -- broadcast: bit exact (NaN, -0.0), any dtype
special = torch.tensor([float("nan"), -0.0, float("inf"), 1.5]) * (rank + 1)
for root in range(world):
    compare(f"broadcast from {root}", [special.clone(), data(2, 3, dtype=torch.int64)],
            lambda ts, grp: [dist.broadcast(t, root, group=grp) for t in ts])  # fmt: skip
compare(
    "broadcast bfloat16", [data(8, dtype=torch.bfloat16)], lambda ts, grp: dist.broadcast(ts[0], 1, group=grp)
)

# -- gathers
compare(
    "all_gather (list)",
    [data(2, 3), *[torch.full((2, 3), -7.0) for _ in range(world)]],
    lambda ts, grp: dist.all_gather(ts[1:], ts[0], group=grp),
)
compare(
    "all_gather_into_tensor",
    [data(2, 3, dtype=torch.int64), torch.full((2 * world, 3), -7, dtype=torch.int64)],
    lambda ts, grp: dist.all_gather_into_tensor(ts[1], ts[0], group=grp),
)
for root in range(world):
    outs = [torch.full((3,), -7.0) for _ in range(world)] if rank == root else []
    compare(
        f"gather to {root}",
        [data(3), *outs],
        lambda ts, grp: dist.gather(ts[0], ts[1:] if rank == root else None, root, group=grp),
    )
    ins = [data(2, 2) for _ in range(world)] if rank == root else []
    compare(
        f"scatter from {root}",
        [torch.full((2, 2), -7.0), *ins],
        lambda ts, grp: dist.scatter(ts[0], ts[1:] if rank == root else None, root, group=grp),
    )

# -- reductions to one rank, reduce-scatter
for root in range(world):
    t = data(4)
    tpu = t.to("tpu")
    dist.reduce(tpu, root, R.MAX)
    ref = t.clone()
    dist.reduce(ref, root, R.MAX, group=w.gloo)
    if rank == root:  # (elsewhere the tensor's contents are unspecified)
        w.same(tpu, ref, f"reduce MAX to {root}")
for op in (R.SUM, R.MAX):
    compare(
        f"reduce_scatter_tensor {op}",
        [data(2 * world, 3), torch.full((2, 3), -7.0)],
        lambda ts, grp: dist.reduce_scatter_tensor(ts[1], ts[0], op, group=grp),
    )
compare(
    "reduce_scatter_tensor AVG (gloo: SUM / world)",
    [data(2 * world), torch.full((2,), -7.0)],
    lambda ts, grp: dist.reduce_scatter_tensor(ts[1], ts[0], R.AVG, group=grp),
    lambda ts, grp: (dist.reduce_scatter_tensor(ts[1], ts[0], group=grp), ts[1].div_(world)),
)
compare(
    "reduce_scatter (list)",
    [torch.full((3,), -7.0), *[data(3) for _ in range(world)]],
    lambda ts, grp: dist.reduce_scatter(ts[0], ts[1:], group=grp),
)

# -- all-to-all: even, uneven, list form
compare(
    "all_to_all_single (even)",
    [data(2 * world, 3), torch.full((2 * world, 3), -7.0)],
    lambda ts, grp: dist.all_to_all_single(ts[1], ts[0], group=grp),
)
# rank r sends r + j + 1 rows to rank j (so receives j + r + 1 rows from rank j)
sends = [rank + j + 1 for j in range(world)]
receives = [j + rank + 1 for j in range(world)]
compare(
    "all_to_all_single (uneven splits)",
    [data(sum(sends), 2, dtype=torch.int64), torch.full((sum(receives), 2), -7, dtype=torch.int64)],
    lambda ts, grp: dist.all_to_all_single(ts[1], ts[0], receives, sends, group=grp),
)
compare(
    "all_to_all (list)",
    [*[data(2, 2) for _ in range(world)], *[torch.full((2, 2), -7.0) for _ in range(world)]],
    lambda ts, grp: dist.all_to_all(ts[world:], ts[:world], group=grp),
)


def all_to_all_flat(ts, grp):  # gloo's all_to_all needs equal shapes: the same exchange, flat
    out = torch.empty(sum(t.numel() for t in ts[world:]))
    sizes = [t.numel() for t in ts[world:]], [t.numel() for t in ts[:world]]
    dist.all_to_all_single(out, torch.cat([t.flatten() for t in ts[:world]]), *sizes, group=grp)
    for t, piece in zip(ts[world:], out.split(sizes[0])):
        t.copy_(piece.view(t.shape))


compare(
    "all_to_all (list, shapes differ per peer)",
    [*[data(j + 1, 2) for j in range(world)], *[torch.full((rank + 1, 2), -7.0) for _ in range(world)]],
    lambda ts, grp: dist.all_to_all(ts[world:], ts[:world], group=grp),
    all_to_all_flat,
)
w.raises(
    RuntimeError,
    ["split sizes disagree"],
    lambda: dist.all_to_all_single(
        torch.empty(3, device="tpu"), torch.ones(3, device="tpu"), [1, 2] if rank == 0 else [2, 1], [2, 1]
    ),
    "all_to_all_single with split sizes that disagree",
)

# -- point to point (rank 0 -> 1, then 1 -> 0), barrier
for src, dst in ((0, 1), (1, 0)):
    t = data(3, dtype=torch.float64) if rank == src else torch.zeros(3, dtype=torch.float64)
    tpu, ref = t.to("tpu"), t.clone()
    if rank == src:
        dist.send(tpu, dst)
        dist.send(ref, dst, group=w.gloo)
    else:
        dist.recv(tpu, src)
        dist.recv(ref, src, group=w.gloo)
    w.same(tpu, ref, f"send {src} -> recv {dst}")

# Both ranks send before they receive (a ring, as pipeline schedules batch their sends and
# receives): sends are asynchronous, so neither waits for the other's receive.
peer = 1 - rank
mine = {torch.float32: data(4, 3), torch.bfloat16: data(5, dtype=torch.bfloat16)}
theirs = {dtype: torch.zeros(t.shape, dtype=dtype, device="tpu") for dtype, t in mine.items()}
ops = [dist.P2POp(dist.isend, t.to("tpu"), peer) for t in mine.values()]
ops += [dist.P2POp(dist.irecv, t, peer) for t in theirs.values()]
for work in dist.batch_isend_irecv(ops):
    work.wait()
refs = {dtype: torch.zeros(t.shape, dtype=dtype) for dtype, t in mine.items()}
ops = [dist.P2POp(dist.isend, t, peer, w.gloo) for t in mine.values()]
ops += [dist.P2POp(dist.irecv, t, peer, w.gloo) for t in refs.values()]
for work in dist.batch_isend_irecv(ops):
    work.wait()
for dtype in mine:
    w.same(theirs[dtype], refs[dtype], f"batch_isend_irecv, both ranks sending first ({dtype})")
# rank 0 receives first, rank 1 sends first; tags keep two messages apart; the receiving tensor
# is a leaf that requires grad (a pipeline stage's input) and a transposed view
got = torch.zeros(3, 2, device="tpu", requires_grad=True)
view = torch.zeros(2, 3, device="tpu")
sends = [data(3, 2), data(3, 2)]
if rank == 0:
    works = [dist.irecv(view.t(), peer, tag=7), dist.irecv(got, peer, tag=3)]
    works += [dist.isend(sends[0].to("tpu"), peer, tag=3), dist.isend(sends[1].to("tpu"), peer, tag=7)]
else:
    works = [dist.isend(sends[0].to("tpu"), peer, tag=3), dist.isend(sends[1].to("tpu"), peer, tag=7)]
    works += [dist.irecv(got, peer, tag=3), dist.irecv(view.t(), peer, tag=7)]
assert all(work.wait() for work in works) and all(work.is_completed() for work in works)
refs = [torch.zeros(3, 2), torch.zeros(3, 2)]
ops = [dist.P2POp(dist.isend, t, peer, w.gloo, tag) for t, tag in zip(sends, (3, 7))]
ops += [dist.P2POp(dist.irecv, t, peer, w.gloo, tag) for t, tag in zip(refs, (3, 7))]
for work in dist.batch_isend_irecv(ops):
    work.wait()
w.same(got.detach(), refs[0], "irecv into a leaf that requires grad (tag 3)")
w.same(view.t(), refs[1], "irecv into a transposed view (tag 7)")
assert got.requires_grad and got.is_leaf
dist.barrier()
w.checks += 1

# -- async work
t = data(6)
tpu, ref = t.to("tpu"), t.clone()
work = dist.all_reduce(tpu, async_op=True)
assert work.wait()
dist.all_reduce(ref, group=w.gloo)
w.same(tpu, ref, "all_reduce async_op=True, wait()")
w.same(work.get_future().wait()[0], ref, "all_reduce async_op=True, get_future()")
out = torch.empty(2 * world, device="tpu")
dist.all_gather_into_tensor(out, torch.full((2,), float(rank), device="tpu"), async_op=True).wait()
w.same(out, torch.tensor([0.0, 0.0, 1.0, 1.0]), "all_gather_into_tensor async_op=True")

# -- coalesced: one program per dtype (counted at the program layer), values as gloo's per tensor
from torch_tpu.distributed import programs  # noqa: E402

programs_run = programs.run_many
programs_ran = []
programs.run_many = lambda kind, *rest: programs_ran.append(kind) or programs_run(kind, *rest)
sums = [data(3, 2), data(5), data(4, dtype=torch.int64), data(1)]
tpu = [t.to("tpu") for t in sums]
with dist._coalescing_manager():
    for t in tpu:
        dist.all_reduce(t)
for t, ref in zip(tpu, sums):
    dist.all_reduce(ref, group=w.gloo)
    w.same(t, ref, f"all_reduce in _coalescing_manager ({ref.dtype}{list(ref.shape)})")
assert programs_ran == ["all_reduce"] * 2, programs_ran  # (float32, then int64)
programs_ran.clear()
inputs = [data(2, 3), data(4), data(3, dtype=torch.bfloat16)]
outs = [torch.empty(world * t.numel(), dtype=t.dtype, device="tpu") for t in inputs]
with dist._coalescing_manager():
    for out, t in zip(outs, inputs):
        dist.all_gather_into_tensor(out, t.to("tpu"))
for out, t in zip(outs, inputs):
    ref = torch.empty(world * t.numel(), dtype=t.dtype)
    dist.all_gather_into_tensor(ref, t.reshape(-1), group=w.gloo)
    w.same(out, ref, f"all_gather_into_tensor in _coalescing_manager ({t.dtype}{list(t.shape)})")
assert programs_ran == ["all_gather"] * 2, programs_ran
programs_ran.clear()
inputs = [data(world * 3), data(world, 2), data(world * 5)]
outs = [torch.empty(t.numel() // world, device="tpu") for t in inputs]
with dist._coalescing_manager():
    for out, t in zip(outs, inputs):
        dist.reduce_scatter_tensor(out, t.to("tpu"))
for out, t in zip(outs, inputs):
    ref = torch.empty(t.numel() // world)
    dist.reduce_scatter_tensor(ref, t.reshape(-1), group=w.gloo)
    w.same(out, ref, f"reduce_scatter_tensor in _coalescing_manager ({list(t.shape)})")
assert programs_ran == ["reduce_scatter"], programs_ran
programs.run_many = programs_run

# -- subgroups: the whole world again, and a group of rank 1 alone (rank 0 never runs it)
pair = dist.new_group([0, 1], backend="tpu_dist")
alone = dist.new_group([1], backend="tpu_dist")
t = data(5)
tpu, ref = t.to("tpu"), t.clone()
dist.all_reduce(tpu, group=pair)
dist.all_reduce(ref, group=w.gloo)
w.same(tpu, ref, "all_reduce on new_group([0, 1])")
if rank == 1:
    tpu = t.to("tpu")
    dist.all_reduce(tpu, group=alone)
    w.same(tpu, t, "all_reduce on new_group([1])")
    out = torch.empty(5, device="tpu")
    dist.all_gather_into_tensor(out, tpu, group=alone)
    w.same(out, t, "all_gather_into_tensor on new_group([1])")

# -- object collectives (CPU tensors: the group's gloo side) and CPU tensors on tpu_dist
objects = [None] * world
dist.all_gather_object(objects, {"rank": rank, "name": f"r{rank}"})
assert objects == [{"rank": r, "name": f"r{r}"} for r in range(world)], objects
w.checks += 1
box = [{"from": rank}]
dist.broadcast_object_list(box, src=1)
assert box == [{"from": 1}], box
w.checks += 1
t = data(3)
on_default, on_gloo = t.clone(), t.clone()
dist.all_reduce(on_default)  # a CPU tensor on the (tpu_dist) default group goes to its gloo side
dist.all_reduce(on_gloo, group=w.gloo)
w.same(on_default, on_gloo, "all_reduce of a CPU tensor on the tpu_dist group")
w.raises(
    ValueError,
    ["one device type"],
    lambda: dist.all_gather([torch.empty(2)] * world, torch.ones(2, device="tpu")),
    "mixed devices",
)

w.done()
