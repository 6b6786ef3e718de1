"""Warm-up: compile the programs a model will need before its first step, in the background.

``async_compile(fn, warmup_inputs)`` (upstream TorchTPU's name) calls ``fn`` on each warm-up
input on worker threads and returns at once: the calls trace (Dynamo, AOTAutograd, the
lowerings, fused eager's recording) and compile the XLA programs of each input's shapes, size
bucket by size bucket, while the caller goes on. Tracing holds Python's lock and XLA's compiler
does not, so one input's compile overlaps the next one's trace, and both overlap the caller's own
work. Afterwards a call whose sizes fall in a warmed bucket compiles nothing.

``fn`` really runs on each input (there is no other way to learn what it compiles): give it
inputs whose results may be dropped, as in a warm-up step: a forward or ``generate`` call, an
evaluation step, a training step on a copy of the model. Each worker runs in the caller's eager
mode and grad mode. Dimensions whose size differs between the warm-up inputs are marked
dynamic (``torch._dynamo.maybe_mark_dynamic``), so a compiled ``fn`` traces them symbolic and
pads them to size buckets from the first call. PyTorch's tracing keeps process-wide state, so
the workers trace one at a time (compiling meanwhile), and the caller should not call the same
compiled function before :meth:`Warmup.wait` returns.

Example::

    >>> import torch, torch_tpu
    >>> f = torch.compile(lambda x: (x * 2).softmax(-1).sum(0), backend="tpu", dynamic=True)
    >>> warm = torch_tpu.async_compile(f, [torch.ones(n, 4, device="tpu") for n in (8, 16, 32)])
    >>> warm.wait().calls
    3
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ..runtime.context import context
from . import fused, modes

__all__ = ["Warmup", "async_compile"]


@dataclasses.dataclass
class Warmup:
    """The running warm-up of :func:`async_compile`: :meth:`wait` for it (raising what a call
    raised), or ask whether it is :meth:`done`."""

    futures: list[concurrent.futures.Future]
    executor: concurrent.futures.ThreadPoolExecutor
    #: how many calls of ``fn`` completed
    calls: int = 0

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def wait(self, timeout: float | None = None) -> Warmup:
        """Block until every warm-up call finished (``TimeoutError`` after ``timeout`` seconds);
        the first exception a call raised is raised here."""
        finished, pending = concurrent.futures.wait(self.futures, timeout)
        if pending:
            raise TimeoutError(f"warm-up: {len(pending)} of {len(self.futures)} calls still running")
        self.executor.shutdown(wait=False)
        for future in self.futures:
            future.result()  # (raises the call's exception)
        self.calls = len(finished)
        return self


#: Held by a warm-up call except while XLA compiles (``runtime.context.compiling``): PyTorch's
#: tracing (Dynamo, AOTAutograd) keeps process-wide state, so two calls never trace at once
_tracing = threading.Lock()


@contextlib.contextmanager
def _holding(lock: threading.Lock) -> Iterator[None]:
    """This thread's compiles let go of ``lock`` (which it holds) while XLA works."""
    context.tracing_lock = lock
    try:
        yield
    finally:
        context.tracing_lock = None


def _arguments(inputs: Any) -> tuple[tuple, dict]:
    """One warm-up input as a call's arguments: a tuple or list (positional), a dict (keyword),
    anything else (a tensor) the single argument."""
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    if isinstance(inputs, dict):
        return (), dict(inputs)
    return (inputs,), {}


def _mark_varying(calls: list[list]) -> None:
    """Mark the dims whose size differs between the warm-up inputs dynamic for Dynamo
    (``maybe_mark_dynamic``): the first call then compiles the graph with those sizes
    symbolic, bucketed from the start, instead of a graph for its sizes alone."""
    for position in range(min(map(len, calls), default=0)):
        tensors = [call[position] for call in calls]
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            continue
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) < 2 or len({len(shape) for shape in shapes}) > 1:
            continue
        varying = [d for d, sizes in enumerate(zip(*shapes)) if len(set(sizes)) > 1]
        for t in tensors:
            for d in varying:
                torch._dynamo.maybe_mark_dynamic(t, d)


def async_compile(fn: Callable, warmup_inputs: Iterable[Any], *, workers: int = 2) -> Warmup:
    """Call ``fn`` on each of ``warmup_inputs`` on ``workers`` background threads, compiling
    the programs their shapes need; returns a :class:`Warmup` at once (see the module's doc)."""
    if not callable(fn):
        raise TypeError(f"async_compile() needs a callable, got {type(fn).__name__}")
    if workers < 1:
        raise ValueError(f"async_compile(): workers must be at least 1, got {workers}")
    calls = [_arguments(inputs) for inputs in warmup_inputs]
    _mark_varying([torch.utils._pytree.tree_leaves(call) for call in calls])
    mode, grad = modes.get_eager_mode(), torch.is_grad_enabled()

    def call(args: tuple, kwargs: dict) -> None:
        with _tracing, _holding(_tracing), modes.eager_mode(mode), torch.set_grad_enabled(grad):
            fn(*args, **kwargs)
            fused.sync("warm-up call")  # (its graph compiled and run here, not by a later reader)

    executor = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="torch_tpu-warmup")
    return Warmup([executor.submit(call, args, kwargs) for args, kwargs in calls], executor)
