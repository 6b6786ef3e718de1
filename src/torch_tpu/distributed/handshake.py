"""The debug mode's check of every collective (``TORCH_DISTRIBUTED_DEBUG=DETAIL``, as NCCL's
collective checks): before a collective runs on the device, its ranks meet on the group's store.

XLA's collectives (and gloo under them on the CPU stand-in) wait without limit for a rank that
never arrives, and read garbage when ranks disagree on shapes. So every rank first posts what
it is about to run (the collective, dtypes, shapes, options) under the collective's sequence
number and waits, up to the group's timeout, for every other rank's post. Then either all ranks
agree and run the program, or every rank raises the same error naming the ranks that differ
(the group stays usable), or the wait times out and the error names the collective and the
ranks that never joined (the group is unusable from then on, as a timed-out NCCL communicator
is).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence

import torch


class Handshake:
    def __init__(self, store, rank: int, timeout: datetime.timedelta, describe: str) -> None:
        self._store = store
        self._rank = rank
        self._timeout = timeout
        self.describe = describe  # "group <name>" for messages
        self.broken: str | None = None

    def meet(self, what: str, agree: str, members: Sequence[int], sequence: int, mine: object = None) -> list:
        """Post ``agree`` (what every member must post alike) and ``mine`` (this rank's own
        details) for collective number ``sequence`` among ``members`` (group ranks, including
        this one); return every member's ``mine``, in ``members`` order, once all have posted."""
        if self.broken:
            raise torch.distributed.DistBackendError(
                f"tpu_dist: {what} on {self.describe}: the group is unusable after an earlier "
                f"failure ({self.broken})"
            )
        members = tuple(members)
        prefix = "handshake/" + "-".join(map(str, members))
        keys = [f"{prefix}/{sequence}/{r}" for r in members]
        self._store.set(keys[members.index(self._rank)], json.dumps([what, agree, mine]))
        try:
            self._store.wait(keys, self._timeout)
        except RuntimeError:
            missing = [r for r, key in zip(members, keys) if not self._store.check([key])]
            if not missing:  # (arrived just after the deadline)
                return self._collect(what, prefix, keys, members, sequence)
            self.broken = (
                f"{what} timed out after {self._timeout.total_seconds():g} s waiting for "
                f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
            )
            raise torch.distributed.DistBackendError(
                f"tpu_dist: {what} on {self.describe} (rank {self._rank}, collective #{sequence}) "
                f"timed out after {self._timeout.total_seconds():g} s: "
                f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} never joined "
                "it (the rank died, hangs, or runs a different sequence of collectives)"
            ) from None
        return self._collect(what, prefix, keys, members, sequence)

    def _collect(self, what: str, prefix: str, keys: list, members: tuple, sequence: int) -> list:
        posts = [json.loads(v) for v in self._store.multi_get(keys)]
        if sequence:  # every member has left the previous meeting: this rank's post there can go
            self._store.delete_key(f"{prefix}/{sequence - 1}/{self._rank}")
        if any(p[:2] != posts[0][:2] for p in posts):
            calls = "; ".join(f"rank {r}: {p[0]}({p[1]})" for r, p in zip(members, posts))
            raise RuntimeError(
                f"tpu_dist: {what} on {self.describe}: the ranks called different collectives or "
                f"passed tensors that do not match ({calls})"
            )
        return [p[2] for p in posts]
