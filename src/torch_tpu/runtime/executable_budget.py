"""Keeps a process's loaded executables under the kernel's limit on memory mappings.

Every executable XLA:CPU loads (compiled, or read from the persistent cache) maps about three
memory regions for its machine code, and JAX's in-memory caches keep every executable a jitted
function ever built. Linux caps the mappings of a process (``vm.max_map_count``, 65,530 by
default). Near 20,000 live executables the next code allocation fails, and XLA crashes the
process with a segfault ("LLVM compilation error: Cannot allocate memory"). A long-running
process that meets many shapes gets there: a test suite, or a server seeing many lengths.

So after every :data:`CHECK_EVERY` executables loaded, the mapping count is read. Past
:data:`BUDGET` of the limit, the in-memory compilation caches are cleared before the next op:
JAX's, and the fused graphs' (``torch.tpu.compilation_cache_stats()["cache_trims"]`` counts
these). That releases every executable no live object holds. A program needed again comes back
from the persistent cache, or is compiled again: slower, never a different result.
Executables held by live objects stay loaded, such as a compiled model's programs.

On a system without ``/proc/self/maps`` nothing is counted and nothing is trimmed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .lru import Kind, caches

#: Read the mapping count after this many executables loaded.
CHECK_EVERY = 256
#: The share of ``vm.max_map_count`` past which the caches are cleared.
BUDGET = 0.6

_MAPS = "/proc/self/maps"
_log = logging.getLogger("torch_tpu")
_lock = threading.Lock()
_loaded_since_check = 0


def _not_yet_requestable() -> None:
    raise RuntimeError("executable_budget.request_trim used before runtime.platform registered it")


#: Ask for a :func:`trim` before the next op (past the budget, from inside a compilation, where
#: the caches must not be cleared now): ``platform.request_trim``, registered at its import.
request_trim: Callable[[], None] = _not_yet_requestable


def _read_limit() -> int | None:
    try:
        with open("/proc/sys/vm/max_map_count") as file:
            return int(file.read())
    except (OSError, ValueError):
        return None


#: The kernel's limit on this process's mappings (None: unknown, nothing is trimmed).
limit: int | None = _read_limit()


def mapping_count() -> int:
    """How many memory mappings this process has (0 where the system does not say)."""
    try:
        with open(_MAPS, "rb") as file:
            return file.read().count(b"\n")
    except OSError:
        return 0


def executable_loaded() -> bool:
    """Count one executable loaded; every :data:`CHECK_EVERY`, say whether the mappings are past
    the budget (the caller asks for a :func:`trim` at the next op: this is called from JAX's
    compile event, inside its compilation, where its caches must not be cleared)."""
    global _loaded_since_check
    if limit is None:
        return False
    _loaded_since_check += 1
    if _loaded_since_check < CHECK_EVERY:
        return False
    _loaded_since_check = 0
    return mapping_count() > BUDGET * limit


def trim() -> bool:
    """Clear the in-memory compilation caches (JAX's and torch_tpu's programs: ``caches``'
    :attr:`~.lru.Kind.PROGRAMS`), releasing the executables no live object holds; whether it
    did (another thread may have)."""
    import jax

    with _lock:
        before = mapping_count()
        if before <= BUDGET * limit:  # (another thread trimmed first)
            return False
        jax.clear_caches()
        caches.clear(Kind.PROGRAMS)
        _log.info(
            "torch_tpu: %d memory mappings of at most %d (vm.max_map_count): cleared the in-memory "
            "compilation caches, %d mappings now",
            before,
            limit,
            mapping_count(),
        )
        return True
