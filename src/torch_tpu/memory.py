"""The ``torch.tpu.memory`` module (``torch.cuda.memory``'s counterpart): ``torch.tpu``'s memory
statistics, and the memory history in CUDA's format (``runtime/memory_history.py`` records it;
``docs/profiling.md``, "Memory history").

Example::

    >>> import torch, torch_tpu
    >>> torch.tpu.memory._record_memory_history(max_entries=100_000)
    >>> x = torch.randn(1024, device="tpu")
    >>> torch.tpu.memory._dump_snapshot("snapshot.pickle")  # open it at https://pytorch.org/memory_viz
    >>> torch.tpu.memory._record_memory_history(enabled=None)
"""

from __future__ import annotations

import pickle
import sys
from inspect import signature
from typing import Any

import torch

from .device import (
    _DeviceLike,
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_peak_memory_stats,
)
from .runtime import memory_history

__all__ = [
    "empty_cache",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "reset_peak_memory_stats",
]


def _record_memory_history(enabled: str | bool | None = "all", *args: Any, **kwargs: Any) -> None:
    """Record which Python code allocates each tpu storage, and (``enabled="all"``) a history of
    allocations and frees: ``torch.cuda.memory._record_memory_history``'s arguments and meaning.

    ``enabled``: None stops (and drops the history, as CUDA does), "state" keeps the stacks of
    live allocations, "all" also the history. ``context``: which stacks are kept (None, "state":
    live allocations', "alloc": also on the history's allocations, "all": also where frees
    happened). ``stacks``: Python frames in both cases (there are no C++ frames to add).
    ``max_entries``: the history keeps the last ones. ``skip_actions``: actions not recorded.
    ``device``, ``compile_context`` and ``global_record_annotations`` are accepted and have no
    effect (every device is recorded). The older form (``enabled`` a bool) is taken too."""
    if isinstance(enabled, bool):
        _record_memory_history_legacy(enabled, *args, **kwargs)
    else:
        _record_memory_history_impl(enabled, *args, **kwargs)


def _record_memory_history_impl(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: _DeviceLike = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
) -> None:
    memory_history.record(enabled, context, stacks, max_entries, clear_history, skip_actions)


_record_memory_history.__signature__ = signature(_record_memory_history_impl)


def _record_memory_history_legacy(
    enabled: bool,
    record_context: bool = True,
    trace_alloc_max_entries: int = 1,
    trace_alloc_record_context: bool = False,
    device: _DeviceLike = None,
    record_context_cpp: bool = False,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
) -> None:
    """The bool form: a history when it keeps more than one entry, stacks as asked."""
    if not enabled:
        memory_history.record(None)
        return
    context = "alloc" if trace_alloc_record_context else "state" if record_context else None
    enabled_as = "all" if trace_alloc_max_entries > 1 else "state"
    stacks = "all" if record_context_cpp else "python"
    memory_history.record(enabled_as, context, stacks, trace_alloc_max_entries, clear_history, skip_actions)


def _snapshot(device: _DeviceLike = None, augment_with_fx_traces: bool = False) -> dict:
    """The tpu memory now, in ``torch.cuda.memory._snapshot()``'s format: ``segments`` (each live
    tpu storage a segment holding one block, with the stack that allocated it if recorded) and
    ``device_traces`` (per device, the history recorded). Every device's (``device`` is ignored,
    as CUDA ignores it)."""
    snapshot = memory_history.snapshot()
    if augment_with_fx_traces:
        snapshot = torch._utils._augment_memory_snapshot_stack_traces(snapshot)
    return snapshot


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    """Pickle :func:`_snapshot` to ``filename``, for https://pytorch.org/memory_viz or
    ``python -m torch.cuda._memory_viz``."""
    snapshot = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)
