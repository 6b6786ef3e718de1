"""Background compiles: a fused graph met at new shapes runs op by op while its program compiles.

A graph whose start (its first op and line) already ran compiled, and now meets shapes it has
not met (a new size bucket, the last partial batch), would otherwise wait for XLA to compile
its whole program: seconds for a model's step on a TPU. With background compiles on
(``config.background_compile``) the graph's program is traced and lowered at once, compiled
on a worker thread, and this run calls the graph's ops one by one through their per-op
programs (strict eager's, each compiled per op and shape); the next run of the same graph
takes the compiled program if it is ready, or goes op by op again if not. The results are the
same either way: the per-op programs and the graph's program compute the same lowerings.

On by default where the device is a TPU (XLA compiles on the host's cores while the chip
computes); off on the XLA:CPU stand-in, whose compiles and computation share the same cores
(a 2-core box gains nothing from overlapping them, and a new bucket's per-op programs would
compile too). ``TORCH_TPU_BACKGROUND_COMPILE=1`` / ``0`` or :func:`set_enabled` override it.

Example::

    >>> torch_tpu.execution.background.set_enabled(True)
    >>> torch.tpu.compilation_cache_stats()["background_compiles"]  # graphs compiled apart
    0
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable
from typing import Any

from .. import config
from ..runtime import platform

__all__ = ["enabled", "set_enabled", "submit", "take", "compiling", "forget", "wait"]

_enabled: bool | None = config.background_compile
_worker: concurrent.futures.ThreadPoolExecutor | None = None
_lock = threading.Lock()
#: graph fingerprint -> the future of its executable, while it compiles
_pending: dict[tuple, concurrent.futures.Future] = {}


def enabled() -> bool:
    """Whether a known graph meeting new shapes compiles in the background (see the module)."""
    if _enabled is None:
        return platform.is_initialized() and platform.platform() == "tpu"
    return _enabled


def set_enabled(on: bool | None) -> None:
    """Turn background compiles on or off (None: the default, on where the device is a TPU)."""
    global _enabled
    _enabled = on


def _compile(lowered: Any, options: dict | None) -> Any:
    """The worker's compile (the one place it runs: tests make it fail here)."""
    return lowered.compile(options)


def submit(fingerprint: tuple, lowered: Any, options: dict | None) -> None:
    """Compile ``lowered`` (a graph's lowered program) on the worker thread."""
    global _worker
    with _lock:
        if _worker is None:
            _worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="torch_tpu-compile")
        _pending[fingerprint] = _worker.submit(_compile, lowered, options)


def compiling(fingerprint: tuple) -> bool:
    """Whether the graph of ``fingerprint`` is compiling in the background now."""
    return fingerprint in _pending


def take(fingerprint: tuple, compile_now: Callable[[], Any]) -> Any:
    """The executable of a graph compiled in the background once it is ready (None while it
    is not). A compile that failed is redone by ``compile_now``, where its error is raised as
    a foreground compile's would be."""
    future = _pending.get(fingerprint)
    if future is None or not future.done():
        return None
    _pending.pop(fingerprint, None)  # (another thread's graph of this fingerprint may have)
    if future.exception() is not None:
        return compile_now()
    return future.result()


def wait() -> None:
    """Wait for the compiles in flight (tests, and a benchmark's steady state)."""
    for future in list(_pending.values()):
        concurrent.futures.wait([future])


def forget() -> None:
    """Drop the compiles in flight (their results are not kept)."""
    _pending.clear()


def _after_fork() -> None:
    global _worker, _lock
    _worker, _lock = None, threading.Lock()  # (the parent's thread is not in the child)
    _pending.clear()


os.register_at_fork(after_in_child=_after_fork)
