"""Per-thread execution state: how ops run in this thread right now.

Everything that decides how an op executes lives in one thread-local object, so threads never
see each other's mode, fused graph, trace or op: ``eager_mode("fused")`` in one thread leaves
the others as they were, two fused threads record into two graphs, and a thread that traces a
compiled program does not hand its tracers to another thread's ops. A new thread starts in the
process's default mode (``TORCH_TPU_DEFER_AND_FUSE`` / ``TPU_LAUNCH_BLOCKING``).

State that is shared on purpose stays elsewhere: the default generator (``runtime.random``,
shared like PyTorch's), compiled executables and the persistent cache.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .. import config

#: Makes this thread's fused-eager recorder (set by ``torch_tpu.execution`` at initialization,
#: so a thread that starts in fused mode records from its first op).
new_recorder: Callable[[], Any] | None = None


class ExecutionContext(threading.local):
    """This thread's execution state (one instance, :data:`context`, seen per thread)."""

    def __init__(self) -> None:
        #: deferred value checks whose results exist but were not reported yet
        #: (``runtime.checks.Check``), oldest first
        self.checks: list = []
        #: debug eager: wait for every op (``TPU_LAUNCH_BLOCKING=1``)
        self.launch_blocking: bool = config.launch_blocking
        #: fused eager's recorder while this thread is in fused mode, else None
        self.recorder: Any = new_recorder() if config.defer_and_fuse and new_recorder else None
        #: the compiled program being traced in this thread (``execution.tracing.Trace``)
        self.trace: Any = None
        #: the ATen op being dispatched, named by the errors of its deferred checks
        self.op: str = ""
        #: the tpu index that values made from no input array go to (a factory's device, a
        #: compiled program's; ``platform.placing``)
        self.index: int = 0
        #: reads hand padded values as they are (``runtime.padding``): set by the dispatcher
        #: while it converts the arguments of an op with a padding rule
        self.padding_reads: bool = False
        #: the dimensions Dynamo made symbolic in the value a bucketed compiled graph computes
        #: now, (dim, largest size or None) each (``frontends.compile.program``): a tensor made
        #: there is padded along them
        self.symbolic_dims: tuple[tuple[int, int | None], ...] | None = None
        #: the lock a warm-up worker holds while it traces (``execution.warmup``), let go
        #: while XLA compiles (:func:`compiling`) so that another worker traces meanwhile
        self.tracing_lock: Any = None
        #: a tpu graph is being captured in this thread (``execution.capture``)
        self.capturing: bool = False
        #: this thread's shapes come from a bounded set (a server's batch sizes): fused eager
        #: compiles each once and never takes ops that change shape out of its graphs
        #: (``execution.fused``'s churn); set by the vLLM worker
        self.shapes_recur: bool = False


context = ExecutionContext()


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """Around an XLA compile (which needs no Python): a warm-up worker lets go of its tracing
    lock, so that one input's compile overlaps the next one's trace."""
    lock = context.tracing_lock
    if lock is None:
        yield
        return
    lock.release()
    try:
        yield
    finally:
        lock.acquire()
