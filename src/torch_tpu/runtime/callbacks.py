"""The functions the C++ runtime core (:mod:`.native`) calls, by name, for its decisions.

Each imports what it needs when called (no JAX at import). Three belong to the device module
above the runtime (``torch_tpu.device``): it sets them at its import (:func:`register_device`),
before the core can call them.
"""

from __future__ import annotations

from collections.abc import Callable

#: ``torch.tpu.synchronize(index)``, ``torch.tpu.empty_cache()``, ``torch.tpu.mem_get_info(index)``
#: (set by :func:`register_device`)
synchronize: Callable[[int], None]
empty_cache: Callable[[], None]
mem_get_info: Callable[[int], tuple[int, int]]


def register_device(
    synchronize_fn: Callable[[int], None],
    empty_cache_fn: Callable[[], None],
    mem_get_info_fn: Callable[[int], tuple[int, int]],
) -> None:
    """Hand the core the device module's functions (called once, at ``torch_tpu.device``'s import)."""
    global synchronize, empty_cache, mem_get_info
    synchronize, empty_cache, mem_get_info = synchronize_fn, empty_cache_fn, mem_get_info_fn


def is_initialized() -> bool:
    from . import platform

    return platform.is_initialized()


def device_used(index: int) -> None:
    """A device other than tpu:0 became current for the first time."""
    from . import platform

    platform.use(index)


def memory_stats(index: int) -> tuple[int, int, int, int, int]:
    """(allocated, peak allocated, reserved, peak reserved, live buffers) in bytes."""
    from . import memory

    return memory.allocator_stats(index)


def reset_peak_memory_stats(index: int) -> None:
    from . import memory

    memory.reset_peak(index)


def resize_storage(storage, nbytes: int) -> None:
    """``storage.resize_(nbytes)``: the buffer keeps its first bytes (new bytes are zeros)."""
    from . import tensor

    tensor.resize_storage(storage, nbytes)
