"""What torch_tpu tells whoever watches it: why a program compiles, and where the host waits.

Two watchers exist: ``TORCH_TPU_LOG_RECOMPILES=1``, which prints each reason to stderr, and
:func:`torch_tpu.diagnose`, which adds a listener while it is active. With neither, nothing is
computed: the places that work out a reason check :data:`explaining` first, and the places that
report a host sync check :data:`listeners`.

>>> from torch_tpu.runtime import events
>>> seen = []
>>> events.listen(seen.append)
>>> events.explain("recompiling: an input changed shape")
>>> events.unlisten(seen.append)
>>> seen[0].kind, seen[0].detail
('recompile', 'recompiling: an input changed shape')
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
from collections.abc import Callable

from .. import config
from .flags import flags
from .library_dirs import USER_DIRS, library_dirs

_log = logging.getLogger("torch_tpu")

#: JAX's monitoring events torch_tpu watches: an executable built (JAX measures one it loads
#: from the disk cache too, after telling the hit) and a hit of the persistent cache
JAX_COMPILED = "/jax/core/compile/backend_compile_duration"
JAX_DISK_HIT = "/jax/compilation_cache/cache_hits"


@dataclasses.dataclass(frozen=True)
class Event:
    """One thing told: ``kind`` is ``"recompile"`` (``detail`` says why) or ``"sync"``
    (``detail`` names the host read: ``"value check"``...); ``line`` is the user's line."""

    kind: str
    detail: str
    line: str


#: Called with each :class:`Event` (the diagnosis adds one while it is active).
listeners: list[Callable[[Event], None]] = []
#: Whether reasons are printed to stderr (``TORCH_TPU_LOG_RECOMPILES=1``).
printing: bool = config.log_recompiles
#: Whether anyone wants reasons: the code that works one out checks this first (also
#: ``flags.log_recompiles``, where the C++ core reads it).
explaining: bool = printing
flags.log_recompiles = explaining


def listen(listener: Callable[[Event], None]) -> None:
    listeners.append(listener)
    _refresh()


def unlisten(listener: Callable[[Event], None]) -> None:
    if listener in listeners:
        listeners.remove(listener)
    _refresh()


def _refresh() -> None:
    global explaining
    explaining = printing or bool(listeners)
    flags.log_recompiles = explaining


def explain(message: str) -> None:
    """Say why something compiles: on the ``torch_tpu`` logger (INFO), on stderr under
    ``TORCH_TPU_LOG_RECOMPILES=1``, and to the listeners."""
    _log.info(message)
    if printing:
        print(f"[torch_tpu] {message}", file=sys.stderr)
    if listeners:
        tell("recompile", message)


def tell(kind: str, detail: str) -> None:
    """Hand the listeners an :class:`Event` at the user's current line (call only when there
    are listeners: finding the line walks the stack)."""
    event = Event(kind, detail, user_line())
    for listener in list(listeners):
        listener(event)


@functools.cache
def _skipped() -> tuple[str, ...]:
    """Where the files never blamed start: the library folders' names without their separator
    (so ``jaxlib``, ``torchvision`` too) and Python's frozen bootstrap."""
    return (*(d[: -len(os.sep)] for d in library_dirs()), "<frozen")


def user_line() -> str:
    """The innermost caller outside torch_tpu, torch and jax: the line to blame for an op."""
    skip = _skipped()
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(skip) or name.startswith(USER_DIRS):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"
