"""What the dispatcher records of the calls it serves: which ATen overloads reached a tpu
kernel (tests check every lowering is reached) and which ran on CPU through the opt-in fallback.
The set being recorded into is ``flags.recorded_ops`` (runtime/flags.py), where the C++ core's
planned kernels add to it too; this module owns it."""

from __future__ import annotations

import collections

from ...runtime.flags import flags

#: ATen overloads that ran on CPU through the opt-in fallback, with counts.
cpu_fallback_counts: collections.Counter = collections.Counter()


def record_ops(enabled: bool = True) -> set:
    """Start recording which ATen overloads reach a tpu kernel; returns the live set."""
    flags.recorded_ops = set() if enabled else None
    return flags.recorded_ops if flags.recorded_ops is not None else set()


def restore(ops: set | None) -> None:
    """Put back a recording :func:`record_ops` replaced (tests that record inside another)."""
    flags.recorded_ops = ops
