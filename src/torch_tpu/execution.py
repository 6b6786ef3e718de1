"""Execution modes: strict eager (the default), debug eager and fused eager.

- **strict**: each op is dispatched on its own, asynchronously, like CUDA.
- **debug** (``TPU_LAUNCH_BLOCKING=1``): each op waits for its result, so an error or a NaN
  surfaces at the op that caused it.
- **fused** (``TORCH_TPU_DEFER_AND_FUSE=1``): ops are recorded into a graph that runs as one XLA
  computation at the next sync point (a host read such as ``.item()``/``.cpu()``/printing, an op
  whose output shape depends on data, the end of ``backward()`` or ``optimizer.step()``,
  ``torch_tpu.sync()``, a mode switch, or a size limit). Each graph compiles once per
  fingerprint; ``torch.tpu.compilation_cache_stats()`` counts hits and misses.

Switching modes at any point is safe: pending work runs first.

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
from typing import Iterator, Optional, Union

import torch

from . import _graph, config

__all__ = ["EagerMode", "eager_mode", "get_eager_mode", "set_eager_mode", "pending_ops",
           "pending_stablehlo", "last_sync_reason"]


class EagerMode(str, enum.Enum):
    """The eager execution modes (upstream TorchTPU's names are aliases)."""
    STRICT = "strict"
    DEBUG = "debug"
    FUSED = "fused"
    DEFER_NEVER = "strict"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"
    DEFER_AND_FUSE = "fused"


def get_eager_mode() -> EagerMode:
    """The current mode."""
    if _graph.active():
        return EagerMode.FUSED
    return EagerMode.DEBUG if config.launch_blocking else EagerMode.STRICT


def set_eager_mode(mode: Union[EagerMode, str]) -> None:
    """Switch to ``mode`` ("strict", "debug" or "fused"); pending fused work runs first."""
    try:
        mode = EagerMode(mode)
    except ValueError:
        raise ValueError(f"unknown eager mode {mode!r}: expected one of 'strict', 'debug', "
                         "'fused'") from None
    _graph.set_active(mode is EagerMode.FUSED)
    config.launch_blocking = mode is EagerMode.DEBUG


@contextlib.contextmanager
def eager_mode(mode: Union[EagerMode, str]) -> Iterator[None]:
    """Run the block in ``mode``, then return to the previous mode (running pending work)."""
    previous = get_eager_mode()
    set_eager_mode(mode)
    try:
        yield
    finally:
        set_eager_mode(previous)


def pending_ops() -> int:
    """How many recorded ops wait for the next sync point (always 0 outside fused eager)."""
    return _graph.pending()


def pending_stablehlo() -> Optional[str]:
    """The pending graph as StableHLO text, without running it (None when nothing is pending):
    what XLA will compile at the next sync point."""
    return _graph.stablehlo()


def last_sync_reason() -> Optional[str]:
    """Why the last fused graph ran ("end of backward()", "host read", ...)."""
    return _graph.last_flush_reason


class _SyncingEngine(torch._C._ImperativeEngine):
    """Autograd's engine, plus a sync point at the end of every ``backward()`` in fused mode
    (the natural end of a training step's graph; without it the graph of one step would run into
    the next)."""

    def run_backward(self, *args, **kwargs):
        try:
            return super().run_backward(*args, **kwargs)
        finally:
            if _graph.active():
                _graph.flush("end of backward()")


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    if _graph.active():
        _graph.flush("end of optimizer.step()")


def install() -> None:
    """Hook the step boundaries and start in the mode the environment asks for."""
    torch.autograd.variable.Variable._execution_engine = _SyncingEngine()
    from torch.optim.optimizer import register_optimizer_step_post_hook
    register_optimizer_step_post_hook(_after_optimizer_step)
    if config.defer_and_fuse:
        set_eager_mode(EagerMode.FUSED)
