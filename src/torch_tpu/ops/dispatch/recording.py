"""What the dispatcher records of the calls it serves: which ATen overloads reached a tpu
kernel (tests check every lowering is reached) and which ran on CPU through the opt-in fallback.
The C++ core reads ``recorded_ops`` from this module's namespace (``configure_plans``)."""

from __future__ import annotations

import collections

#: ATen overloads that ran on CPU through the opt-in fallback, with counts.
cpu_fallback_counts: collections.Counter = collections.Counter()

#: When a set, every kernel call adds its ATen overload.
recorded_ops: set | None = None


def record_ops(enabled: bool = True) -> set:
    """Start recording which ATen overloads reach a tpu kernel; returns the live set."""
    global recorded_ops
    recorded_ops = set() if enabled else None
    return recorded_ops if recorded_ops is not None else set()


def restore(ops: set | None) -> None:
    """Put back a recording :func:`record_ops` replaced (tests that record inside another)."""
    global recorded_ops
    recorded_ops = ops
