"""Device memory: what the device reports, and out-of-memory errors PyTorch code can catch.

XLA reports exhausted memory as ``XlaRuntimeError: RESOURCE_EXHAUSTED``; PyTorch code (users,
Accelerate's batch-size finder) catches ``torch.OutOfMemoryError``. Every place that runs device
work translates the one into the other (:func:`translate`), naming the bytes asked for and the
device's total. ``torch.empty`` allocates lazily, so an impossible size is refused at ``empty``
(:func:`check_allocation`) rather than at first use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re

import torch

from . import devices, hardware, memory_history, platform

_REQUESTED = re.compile(r"allocat\w* (?:of )?(\d[\d,]*) ?bytes", re.IGNORECASE)


# ----------------------------------------------------------------------------- statistics
# The one source of the memory numbers: ``torch.tpu.memory_*`` and, through the C++ allocator,
# ``torch.accelerator.memory_*`` both read these. Each is per device (``tpu:index``); the peak
# sampled where XLA keeps none is the device's ``DeviceState.peak_allocated``.


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
    state = devices.local.state(platform.check_index(index))
    state.peak_allocated = max(state.peak_allocated, current)
    return current


def _live_arrays() -> list:
    """(array, the devices it is on) for each live array."""
    import jax

    return [(a, a.sharding.device_set) for a in jax.live_arrays()]


def max_allocated(index: int = 0) -> int:
    """Peak of :func:`allocated` (device-tracked on TPU/GPU; sampled at queries on CPU)."""
    current = allocated(index)
    if not platform.is_initialized():
        return current
    peak = devices.local.state(platform.check_index(index)).peak_allocated  # (>= current)
    return int(device_stats(index).get("peak_bytes_in_use", peak))


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
    if platform.is_initialized():  # (before, nothing was measured)
        devices.local.state(platform.check_index(index)).peak_allocated = 0


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


#: HBM per chip, by generation (``runtime.hardware``'s names)
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


# ----------------------------------------------------------------------------- summary
@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """A line of :func:`summary`: a metric now, at its peak, and its totals added and removed."""

    name: str
    current: int
    peak: int
    allocated: int
    freed: int
    is_bytes: bool = True


_WIDTH = 75


def summary(index: int = 0, abbreviated: bool = False) -> str:
    """``torch.cuda.memory_summary``'s table for ``tpu:index``. Allocated, active and reserved
    bytes now and at their peak are the device's (:func:`allocated`...); the totals, the requested
    bytes and the allocation counts are the storages counted by the memory history while it
    records (``runtime.memory_history``; zeros if it never did). ``abbreviated``: without the
    notes under the title."""
    title = f" {'':16} PyTorch TPU memory summary, device ID {index}".ljust(_WIDTH)
    lines = ["=" * _WIDTH, title, "-" * _WIDTH]
    if not abbreviated:
        lines += [f"  {note}"[:_WIDTH].ljust(_WIDTH) for note in _summary_notes(index)]
    lines += ["=" * _WIDTH, "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    for row in _summary_rows(index):
        lines += ["-" * _WIDTH, _summary_line(row)]
    lines.append("=" * _WIDTH)
    return "|" + "|\n|".join(lines) + "|\n"


def _summary_notes(index: int) -> list[str]:
    name = platform.device_name() if platform.is_initialized() else "not started"
    recording = "on" if memory_history.is_recording() else "off"
    return [
        f"{name}: {live_buffers(index)} live XLA buffers; memory history recording: {recording}",
        "Tot Alloc/Freed, requested memory, allocs: tpu storages seen by the",
        "memory history (torch.tpu.memory._record_memory_history)",
    ]


def _summary_rows(index: int) -> list[SummaryRow]:
    counts = memory_history.counts(index)
    stored, blocks = counts.bytes, counts.blocks
    held, peak = allocated(index), max_allocated(index)
    totals = (stored.allocated, stored.freed)
    counted = (blocks.current, blocks.peak, blocks.allocated, blocks.freed)
    block_rows = ("Allocations", "Active allocs", "TPU reserved segments")  # (one segment per storage)
    return [
        SummaryRow("Allocated memory", held, peak, *totals),
        SummaryRow("Active memory", held, peak, *totals),  # (XLA frees a buffer after its last use)
        SummaryRow("Requested memory", stored.current, stored.peak, *totals),
        SummaryRow("TPU reserved memory", reserved(index), max_reserved(index), *totals),
        *(SummaryRow(name, *counted, is_bytes=False) for name in block_rows),
    ]


def _summary_line(row: SummaryRow) -> str:
    cells = (row.current, row.peak, row.allocated, row.freed)
    formatted = [_summary_size(n) if row.is_bytes else _summary_count(n) for n in cells]
    return f" {row.name:<21} | " + " | ".join(formatted) + " "


def _summary_size(nbytes: int) -> str:
    """``nbytes`` in the largest unit that keeps it above 768 of it (CUDA's summary's rule)."""
    prefix, value, scaled = "B  ", nbytes, float(nbytes)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if scaled < 768 * 1024:
            break
        prefix, value, scaled = unit, value // 1024, scaled / 1024
    return f"{value:6d} {prefix}"


def _summary_count(count: int) -> str:
    prefix, value, scaled = " ", count, float(count)
    for unit in ("K", "M"):
        if scaled < 750 * 1000:
            break
        prefix, value, scaled = unit, value // 1000, scaled / 1000
    return f"{value:7d} {prefix} "
