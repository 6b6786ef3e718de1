"""Failures raise, never hang. ``python failures.py <case>``:

- ``mismatch``: in the debug mode (a group created under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``),
  ranks that disagree on a collective all raise and the group goes on working; a rank that never
  joins makes the other raise at the meeting. The default groups go on working beside it.
- ``absent``: rank 1 never sends what rank 0 receives, then never calls a collective rank 0 runs,
  on a group with a 2 s timeout: rank 0's ``recv``, then its next read, raise
  ``DistBackendError`` within the timeout, naming the call and rank 1; its later collectives
  raise; both processes then exit normally.
- ``dead``: rank 1 exits abruptly after a collective; rank 0's next collective raises naming it.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from common import Worker

w = Worker()
rank = w.rank
case = sys.argv[1]
quick = datetime.timedelta(seconds=2)


def mismatch() -> None:
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    checked = dist.new_group([0, 1], backend="tpu_dist")
    checked_quick = dist.new_group([0, 1], timeout=quick, backend="tpu_dist")
    dist.set_debug_level(dist.DebugLevel.OFF)
    w.raises(
        RuntimeError,
        ["all_reduce", "rank 0: all_reduce(sum: float32[4])", "rank 1: all_reduce(sum: float32[5])"],
        lambda: dist.all_reduce(torch.ones(4 + rank, device="tpu"), group=checked),
        "all_reduce with shapes that differ",
    )
    w.raises(
        RuntimeError,
        ["do not match", "int64", "float32"],
        lambda: dist.all_gather_into_tensor(
            torch.empty(4, device="tpu", dtype=torch.float32 if rank else torch.int64),
            torch.ones(2, device="tpu", dtype=torch.float32 if rank else torch.int64),
            group=checked,
        ),
        "all_gather_into_tensor with dtypes that differ",
    )
    w.raises(
        RuntimeError,
        ["different collectives", "broadcast", "all_reduce"],
        lambda: (
            dist.broadcast(torch.ones(2, device="tpu"), 0, group=checked)
            if rank
            else dist.all_reduce(torch.ones(2, device="tpu"), group=checked)
        ),
        "one rank broadcasts, the other all-reduces",
    )
    for group in (checked, None):
        t = torch.full((3,), float(rank + 1), device="tpu")
        dist.all_reduce(t, group=group)
        w.same(t, torch.full((3,), 3.0), f"all_reduce after the errors ({group or 'default group'})")
    w.raises(
        ValueError,
        ["one tensor per rank"],
        lambda: dist.all_gather([torch.empty(1, device="tpu")], t[:1]),
        "bad list",
    )
    if rank == 0:  # (the meeting times out before any program runs: the process stays usable)
        w.raises(
            dist.DistBackendError,
            ["all_reduce", "timed out after 2 s", "rank 1 never joined"],
            lambda: dist.all_reduce(torch.ones(2, device="tpu"), group=checked_quick),
            "all_reduce that rank 1 never joins (debug mode)",
        )
    dist.barrier(group=w.gloo)
    t = torch.ones(2, device="tpu")
    dist.all_reduce(t)
    w.same(t, torch.full((2,), 2.0), "the default group after the debug group's timeout")


def absent() -> None:
    group = dist.new_group([0, 1], timeout=quick, backend="tpu_dist")
    t = torch.ones(2, device="tpu")
    dist.all_reduce(t, group=group)
    w.same(t, torch.full((2,), 2.0), "all_reduce before")
    if rank == 0:
        start = time.monotonic()
        w.raises(
            dist.DistBackendError,
            ["recv of float32[2] from rank 1 failed", "Timed out"],
            lambda: dist.recv(t, 1, group=group),
            "a recv rank 1 never sends",
        )
        waited = time.monotonic() - start
        assert 2 <= waited < 4, f"raised after {waited:.1f} s (timeout 2 s)"
        start = time.monotonic()
        w.raises(
            dist.DistBackendError,
            ["all_reduce", "timed out after 2 s", "rank 1 never joined", "collective #1"],
            lambda: (dist.all_reduce(t, group=group), t.cpu()),
            "reading the result of an all_reduce rank 1 never joins",
        )
        waited = time.monotonic() - start
        assert 2 <= waited < 4, f"raised after {waited:.1f} s (timeout 2 s)"
        w.raises(
            dist.DistBackendError,
            ["unusable", "rank 1 never joined"],
            lambda: dist.all_reduce(torch.ones(2, device="tpu")),
            "a collective after the timeout",
        )
        w.same(t + 1, torch.full((2,), 3.0), "the device after the timeout")  # (no collective)
    dist.barrier(group=w.gloo)  # (rank 1 waits here for rank 0 to have seen its errors)


def dead() -> None:
    group = dist.new_group([0, 1], timeout=quick, backend="tpu_dist")
    dist.all_reduce(torch.ones(1, device="tpu"), group=group)
    torch.tpu.synchronize()
    if rank == 1:
        print(f"rank {rank} ok {w.checks}", flush=True)
        os._exit(0)  # (as a killed rank, but torchrun would then stop rank 0 at once)
    time.sleep(1)
    start = time.monotonic()
    w.raises(
        dist.DistBackendError,
        ["broadcast", "rank 1"],
        lambda: (dist.broadcast(torch.ones(2, device="tpu"), 0, group=group), torch.tpu.synchronize()),
        "broadcast after rank 1 died",
    )
    assert time.monotonic() - start < 4, "raised after the timeout"


{"mismatch": mismatch, "absent": absent, "dead": dead}[case]()
print(f"rank {rank} ok {w.checks}", flush=True)
if case == "mismatch":
    # Known issue: after a debug-mode meeting timed out on the store, the process sometimes
    # aborts at its normal exit ("terminate called without an active exception", about 1 run
    # in 8 here); not yet explained, so this case ends at once.
    os._exit(0)
