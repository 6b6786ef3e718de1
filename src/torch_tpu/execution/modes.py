"""Execution modes: strict eager (the default), debug eager and fused eager.

- **strict**: each op is dispatched on its own, asynchronously, like CUDA.
- **debug** (``TPU_LAUNCH_BLOCKING=1``): each op waits for its result, so an error or a NaN
  surfaces at the op that caused it.
- **fused** (``TORCH_TPU_DEFER_AND_FUSE=1``): ops are recorded into a graph that runs as one XLA
  computation at the next sync point (a host read such as ``.item()``/``.cpu()``/printing, an op
  whose output shape depends on data, the end of ``backward()`` or ``optimizer.step()``,
  ``torch_tpu.sync()``, a mode switch, or a size limit). Each graph compiles once per
  fingerprint; ``torch.tpu.compilation_cache_stats()`` counts hits and misses.

The mode belongs to the thread: switching it in one thread leaves the others as they are, and
a new thread starts in the mode the environment asks for. Switching at any point is safe:
pending work runs first.

Example::

    >>> import torch, torch_tpu
    >>> with torch_tpu.eager_mode("fused"):
    ...     x = torch.ones(3, device="tpu")
    ...     y = (x * 2 + 1).sum()        # recorded, not run yet
    ...     y.item()                     # a host read: the graph runs here
    9.0
    >>> torch_tpu.get_eager_mode()
    <EagerMode.STRICT: 'strict'>
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator

import torch

from .. import config
from ..runtime import context as _context
from ..runtime import platform
from ..runtime.context import context

__all__ = [
    "EagerMode",
    "eager_mode",
    "get_eager_mode",
    "set_eager_mode",
    "pending_ops",
    "pending_stablehlo",
    "last_sync_reason",
]


class EagerMode(enum.StrEnum):
    """The eager execution modes (upstream TorchTPU's names are aliases)."""

    STRICT = "strict"
    DEBUG = "debug"
    FUSED = "fused"
    DEFER_NEVER = "strict"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"
    DEFER_AND_FUSE = "fused"


def get_eager_mode() -> EagerMode:
    """This thread's mode."""
    if context.recorder is not None:
        return EagerMode.FUSED
    return EagerMode.DEBUG if context.launch_blocking else EagerMode.STRICT


def set_eager_mode(mode: EagerMode | str) -> None:
    """Switch this thread to ``mode`` ("strict", "debug" or "fused"); pending fused work runs
    first."""
    try:
        mode = EagerMode(mode)
    except ValueError:
        raise ValueError(f"unknown eager mode {mode!r}: expected one of 'strict', 'debug', 'fused'") from None
    platform.start()  # (fused eager records JAX values)
    from . import fused

    fused.set_active(mode is EagerMode.FUSED)
    context.launch_blocking = mode is EagerMode.DEBUG


@contextlib.contextmanager
def eager_mode(mode: EagerMode | str) -> Iterator[None]:
    """Run the block in ``mode``, then return to the previous mode (running pending work)."""
    previous = get_eager_mode()
    set_eager_mode(mode)
    try:
        yield
    finally:
        set_eager_mode(previous)


def pending_ops() -> int:
    """How many recorded ops wait for the next sync point (always 0 outside fused eager)."""
    if context.recorder is None:
        return 0
    return context.recorder.pending()


def pending_stablehlo() -> str | None:
    """The pending graph as StableHLO text, without running it (None when nothing is pending):
    what XLA will compile at the next sync point."""
    if context.recorder is None:
        return None
    return context.recorder.graph.stablehlo()


def last_sync_reason() -> str | None:
    """Why the last fused graph ran ("end of backward()", "host read", ...)."""
    from . import fused

    return fused.last_flush_reason


# ----------------------------------------------------------------------------- step boundaries
def _accumulating_leaves(roots) -> list[torch.Tensor]:
    """The leaf tensors a ``backward()`` from ``roots`` accumulates gradients into."""
    seen, leaves = set(), []
    stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None:
            leaves.append(variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return leaves


class _GradientSnapshot:
    """The ``.grad`` of each leaf before a backward, to put back if the step turns out to have
    failed: a value check of the step raises at the end of ``backward()``, and as on CPU (where
    the failing op raises before any gradient exists) ``.grad`` must not keep that step's
    gradients, or a loop that catches the error and steps on would apply them."""

    def __init__(self, leaves: list[torch.Tensor]):
        from ..runtime import buffer

        self._entries = [
            (leaf, leaf.grad, None if leaf.grad is None else buffer.get(leaf.grad.untyped_storage()))
            for leaf in leaves
            if leaf.device.type == "tpu"
        ]

    def restore(self) -> None:
        from ..runtime import buffer

        for leaf, grad, value in self._entries:
            if grad is not None:
                buffer.restore(grad.untyped_storage(), value)
            leaf.grad = grad


class _SyncingEngine(torch._C._ImperativeEngine):
    """Autograd's engine, run on the calling thread, plus a step boundary at the end of every
    ``backward()``: in fused mode the graph of the step runs there (without it one step's graph
    would run into the next), and the value checks of the step are reported there, restoring
    ``.grad`` if one failed.

    The engine would otherwise run a device's backward ops on its own worker thread, where this
    thread's execution state (fused recording, debug mode) does not apply; one device gains
    nothing from that thread, as XLA runs asynchronously anyway."""

    def run_backward(
        self, tensors, grad_tensors, keep_graph, create_graph, inputs, allow_unreachable, accumulate_grad
    ):
        recorder = context.recorder
        snapshot = None
        if accumulate_grad and (recorder is not None or context.checks):
            snapshot = _GradientSnapshot(_accumulating_leaves(tensors))
        with torch.autograd.set_multithreading_enabled(False):
            result = super().run_backward(
                tensors, grad_tensors, keep_graph, create_graph, inputs, allow_unreachable, accumulate_grad
            )
        from ..runtime import checks
        from . import fused

        try:
            if recorder is not None and context.recorder is recorder:
                fused.flush("end of backward()")
            checks.report_all("at the end of backward()")
        except Exception:
            if snapshot is not None:
                snapshot.restore()
            raise
        return result


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    if context.recorder is not None:
        context.recorder.flush("end of optimizer.step()")


def install() -> None:
    """Hook the step boundaries; start this thread, and every new one, in the environment's
    mode."""
    torch.autograd.variable.Variable._execution_engine = _SyncingEngine()
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_after_optimizer_step)
    from . import fused

    _context.new_recorder = fused.Recorder
    if config.defer_and_fuse and context.recorder is None:
        fused.set_active(True)
