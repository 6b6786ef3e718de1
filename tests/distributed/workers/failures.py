"""Failures raise, never hang: ranks that disagree on a collective all raise (and the group goes
on working); a rank that never joins a collective, or dies, makes the others raise within the
group's timeout, naming the collective and the missing rank."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from common import Worker

w = Worker()
rank = w.rank
other = 1 - rank

# -- disagreements: every rank raises the same error, the group stays usable
w.raises(
    RuntimeError,
    ["all_reduce", "rank 0: all_reduce(sum: float32[4])", "rank 1: all_reduce(sum: float32[5])"],
    lambda: dist.all_reduce(torch.ones(4 + rank, device="tpu")),
    "all_reduce with shapes that differ",
)
w.raises(
    RuntimeError,
    ["do not match", "int64", "float32"],
    lambda: dist.all_gather_into_tensor(
        torch.empty(4, device="tpu", dtype=torch.float32 if rank else torch.int64),
        torch.ones(2, device="tpu", dtype=torch.float32 if rank else torch.int64),
    ),
    "all_gather_into_tensor with dtypes that differ",
)
w.raises(
    RuntimeError,
    ["different collectives", "broadcast", "all_reduce"],
    lambda: (
        dist.broadcast(torch.ones(2, device="tpu"), 0)
        if rank
        else dist.all_reduce(torch.ones(2, device="tpu"))
    ),
    "one rank broadcasts, the other all-reduces",
)
t = torch.full((3,), float(rank + 1), device="tpu")
dist.all_reduce(t)
w.same(t, torch.full((3,), 3.0), "all_reduce after the errors")
w.raises(
    ValueError,
    ["one tensor per rank"],
    lambda: dist.all_gather([torch.empty(1, device="tpu")], t[:1]),
    "bad list",
)

# -- a rank that never joins: rank 0 all-reduces on a group with a 2 s timeout, rank 1 does not
quick = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2), backend="tpu_dist")
if rank == 0:
    w.raises(
        dist.DistBackendError,
        ["all_reduce", "timed out after 2 s", "rank 1 never joined"],
        lambda: dist.all_reduce(torch.ones(2, device="tpu"), group=quick),
        "all_reduce that rank 1 never joins",
    )
    w.raises(
        dist.DistBackendError,
        ["unusable", "rank 1"],
        lambda: dist.all_reduce(torch.ones(2, device="tpu"), group=quick),
        "the group after the timeout",
    )
dist.barrier(group=w.gloo)  # (rank 1 waits here for rank 0 to have seen its errors)

# -- a rank that dies: rank 1 exits; rank 0's next collective raises naming it
mortal = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2), backend="tpu_dist")
dist.all_reduce(torch.ones(1, device="tpu"), group=mortal)
if rank == 1:
    print(f"rank {rank} ok {w.checks}", flush=True)
    os._exit(0)
w.raises(
    dist.DistBackendError,
    ["broadcast", "rank 1 never joined"],
    lambda: dist.broadcast(torch.ones(2, device="tpu"), 0, group=mortal),
    "broadcast after rank 1 died",
)
print(f"rank {rank} ok {w.checks}", flush=True)
os._exit(0)  # (JAX's shutdown would wait for the dead rank; torchrun would have stopped us)
