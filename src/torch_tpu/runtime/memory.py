"""Device memory: what the device reports, and out-of-memory errors PyTorch code can catch.

XLA reports exhausted memory as ``XlaRuntimeError: RESOURCE_EXHAUSTED``; PyTorch code (users,
Accelerate's batch-size finder) catches ``torch.OutOfMemoryError``. Every place that runs device
work translates the one into the other (:func:`translate`), naming the bytes asked for and the
device's total. ``torch.empty`` allocates lazily, so an impossible size is refused at ``empty``
(:func:`check_allocation`) rather than at first use.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re

import torch

from . import platform

_REQUESTED = re.compile(r"allocat\w* (?:of )?(\d[\d,]*) ?bytes", re.IGNORECASE)


# ----------------------------------------------------------------------------- statistics
# The one source of the memory numbers: ``torch.tpu.memory_*`` and, through the C++ allocator,
# ``torch.accelerator.memory_*`` both read these.
_peak_allocated = 0


def allocated() -> int:
    """Bytes held by live device buffers (on stand-in platforms: summed over live arrays); 0
    before the device has started (nothing is held, and asking must not start it)."""
    global _peak_allocated
    if not platform.is_initialized():
        return 0
    stats = device_stats()
    if "bytes_in_use" in stats:
        current = int(stats["bytes_in_use"])
    else:
        import jax

        current = sum(a.nbytes for a in jax.live_arrays())
    _peak_allocated = max(_peak_allocated, current)
    return current


def max_allocated() -> int:
    """Peak of :func:`allocated` (device-tracked on TPU/GPU; sampled at queries on CPU)."""
    current = allocated()
    return int(device_stats().get("peak_bytes_in_use", max(_peak_allocated, current)))


def reserved() -> int:
    return int(device_stats().get("bytes_reserved", allocated()))


def max_reserved() -> int:
    return max(reserved(), max_allocated())


def live_buffers() -> int:
    if not platform.is_initialized():
        return 0
    import jax

    return len(jax.live_arrays())


def reset_peak() -> None:
    global _peak_allocated
    _peak_allocated = 0


def allocator_stats() -> tuple[int, int, int, int, int]:
    """What the C++ device allocator reports: allocated and reserved bytes with their peaks,
    and the number of live buffers."""
    return allocated(), max_allocated(), reserved(), max_reserved(), live_buffers()


def device_stats() -> dict[str, int]:
    """The XLA device's own memory statistics (empty where the platform keeps none: CPU)."""
    if not platform.is_initialized():
        return {}
    stats = None
    with contextlib.suppress(Exception):
        stats = platform.device().memory_stats()
    return stats or {}


@functools.cache
def total_memory() -> int:
    """Bytes the device can hold: its memory limit, or the host's RAM on the CPU stand-in."""
    platform.initialize()  # the limit is the device's
    total = device_stats().get("bytes_limit", 0)
    if not total:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(total)


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} bytes"


def out_of_memory(requested: int, detail: str = "") -> torch.OutOfMemoryError:
    """PyTorch's out-of-memory error for tpu, naming the request and the device's total."""
    message = (
        f"tpu out of memory. Tried to allocate {_size(requested)} ({requested} bytes); "
        f"the device ({platform.device_name()}) has {_size(total_memory())} in total."
    )
    return torch.OutOfMemoryError(f"{message} {detail}".strip())


def is_out_of_memory(error: BaseException) -> bool:
    return "RESOURCE_EXHAUSTED" in str(error) or "Out of memory" in str(error)


def check_allocation(nbytes: int) -> None:
    """Refuse a buffer larger than the device can ever hold."""
    if nbytes > total_memory():
        raise out_of_memory(nbytes)


def translate(error: BaseException, requested: int = 0) -> BaseException:
    """``torch.OutOfMemoryError`` for XLA's RESOURCE_EXHAUSTED (any other error as it is);
    ``requested`` is the size of what was being computed, when XLA does not say."""
    if isinstance(error, torch.OutOfMemoryError) or not is_out_of_memory(error):
        return error
    match = _REQUESTED.search(str(error))
    size = int(match.group(1).replace(",", "")) if match else requested
    translated = out_of_memory(size, f"(XLA: {str(error).splitlines()[0][:300]})")
    translated.__cause__ = error
    return translated
