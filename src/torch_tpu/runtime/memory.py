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

from .._internal.utils import hardware
from . import platform

_REQUESTED = re.compile(r"allocat\w* (?:of )?(\d[\d,]*) ?bytes", re.IGNORECASE)


# ----------------------------------------------------------------------------- statistics
# The one source of the memory numbers: ``torch.tpu.memory_*`` and, through the C++ allocator,
# ``torch.accelerator.memory_*`` both read these. Each is per device (``tpu:index``).
_peak_allocated: dict[int, int] = {}


def allocated(index: int = 0) -> int:
    """Bytes held by live buffers on ``tpu:index`` (on stand-in platforms: summed over live
    arrays); 0 before the device has started (nothing is held, and asking must not start it)."""
    if not platform.is_initialized():
        return 0
    stats = device_stats(index)
    if "bytes_in_use" in stats:
        current = int(stats["bytes_in_use"])
    else:
        device = platform.jax_device(index)
        current = sum(a.nbytes // len(d) for a, d in _live_arrays() if device in d)
    _peak_allocated[index] = max(_peak_allocated.get(index, 0), current)
    return current


def _live_arrays() -> list:
    """(array, the devices it is on) for each live array."""
    import jax

    return [(a, a.sharding.device_set) for a in jax.live_arrays()]


def max_allocated(index: int = 0) -> int:
    """Peak of :func:`allocated` (device-tracked on TPU/GPU; sampled at queries on CPU)."""
    current = allocated(index)
    return int(device_stats(index).get("peak_bytes_in_use", max(_peak_allocated.get(index, 0), current)))


def reserved(index: int = 0) -> int:
    return int(device_stats(index).get("bytes_reserved", allocated(index)))


def max_reserved(index: int = 0) -> int:
    return max(reserved(index), max_allocated(index))


def live_buffers(index: int = 0) -> int:
    if not platform.is_initialized():
        return 0
    device = platform.jax_device(index)
    return sum(device in d for _, d in _live_arrays())


def reset_peak(index: int = 0) -> None:
    _peak_allocated.pop(index, None)


def allocator_stats(index: int = 0) -> tuple[int, int, int, int, int]:
    """What the C++ device allocator reports for ``tpu:index``: allocated and reserved bytes
    with their peaks, and the number of live buffers."""
    return allocated(index), max_allocated(index), reserved(index), max_reserved(index), live_buffers(index)


def device_stats(index: int = 0) -> dict[str, int]:
    """The XLA device's own memory statistics (empty where the platform keeps none: CPU)."""
    if not platform.is_initialized():
        return {}
    stats = None
    with contextlib.suppress(Exception):
        stats = platform.jax_device(index).memory_stats()
    return stats or {}


@functools.cache
def total_memory() -> int:
    """Bytes the device can hold: its memory limit, or the host's RAM on the CPU stand-in."""
    platform.initialize()  # the limit is the device's
    return int(device_stats().get("bytes_limit", 0) or _host_ram())


def _host_ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


#: HBM per chip, by generation (``_internal.utils.hardware``'s names)
_HBM_BYTES = {
    "TPU v4": 32 << 30,
    "TPU v5p": 95 << 30,
    "TPU v5e": 16 << 30,
    "TPU v6e": 32 << 30,
    "TPU v7": 192 << 30,
}


def known_total_memory() -> int | None:
    """:func:`total_memory` where it is known without starting the device (a process about to
    fork workers must not start XLA's runtime, as vLLM's front end asks CUDA's NVML, not CUDA):
    the started device's; a TPU chip's on the PCI bus (its generation's HBM); the host's RAM
    where the stand-in is XLA:CPU. None where only a started runtime can say (a GPU)."""
    if platform.is_initialized():
        return total_memory()
    chips = hardware.tpu_chips()
    if chips:
        return _HBM_BYTES.get(chips[0])
    return _host_ram() if platform.stand_in_is_cpu() else None


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
