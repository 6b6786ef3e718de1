""":class:`diagnose`: the hooks that fill a :class:`~.report.Report` while a block runs.

Three hooks, installed on enter and removed on exit, so nothing is collected (or slowed)
outside the block:

- a dispatch mode (:class:`_OpWatch`) sees each ATen op the block runs on tpu: counts it, and
  notes the host syncs an op is (``.item()``, a copy to CPU, an op whose output shape depends
  on values) and the ops that ran on CPU fallback, with the user's line;
- JAX's monitoring events count XLA compiles, blamed on the op being run and its line;
- :mod:`torch_tpu.runtime.events` tells why programs compile again and when a value check
  made the host wait.

What is counted elsewhere (fused eager's graph runs, ``torch.compile``'s graph breaks, peak
memory) is read as the difference between the block's start and end.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import device as tpu
from ..runtime import events
from ..runtime.context import context
from ..runtime.events import user_line
from . import device, hints
from .report import Report, Site

aten = torch.ops.aten

_COMPILED, _DISK_HIT = events.JAX_COMPILED, events.JAX_DISK_HIT
_TO_HOST = (
    aten._to_copy.default,
    aten.copy_.default,
    aten._copy_from.default,
    aten._copy_from_and_resize.default,
)
_MATMULS = (
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten.convolution.default,
)


def _is_tpu(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "tpu"


def _on_tpu(args: tuple, kwargs: dict) -> bool:
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    return any(_is_tpu(x) or (isinstance(x, torch.device) and x.type == "tpu") for x in leaves)


def _copies_to_host(func: Any, args: tuple, kwargs: dict) -> bool:
    """A copy of a tpu tensor to the CPU (``.cpu()``, ``.tolist()``, ``cpu_tensor.copy_(x)``)."""
    if func not in _TO_HOST:
        return False
    if func is aten._to_copy.default:
        device = kwargs.get("device")
        return _is_tpu(args[0]) and device is not None and torch.device(device).type == "cpu"
    return isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu" and _is_tpu(args[1])


def _host_kind(op: Any) -> str:
    """The kind of host sync an op that runs on host values is."""
    name = str(op)
    return "value check" if "linalg" in name or "cholesky" in name else "data-dependent shape"


def _has_mask(indices: list) -> bool:
    """Boolean indices (``x[x > 0]``): the result's shape is the count of true values."""
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


class _OpWatch(TorchDispatchMode):
    """Counts the tpu ops of the block into ``report``; notes their host syncs and CPU
    fallbacks with the user's line; :attr:`current` is the op running now (compiles are
    blamed on it)."""

    def __init__(self, report: Report) -> None:
        super().__init__()
        self.report = report
        #: the op running now and the number of its call, or None
        self.current: tuple[str, int] | None = None
        self.calls = 0
        from ..ops import dispatch
        from ..ops.registry import LOWERINGS, Runs

        self.fallbacks = dispatch.cpu_fallback_counts
        on_host = [op for op, entry in LOWERINGS.items() if entry.runs is Runs.HOST]
        # (the factorizations among them read their values to report failures, not for a shape)
        self.host_kinds = {op: _host_kind(op) for op in on_host}

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """torch.compile compiles as without the mode (its programs' ops are not seen)."""
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None) -> Any:
        kwargs = kwargs or {}
        if not _on_tpu(args, kwargs):
            return func(*args, **kwargs)
        name = str(func)
        self._note(func, name, args, kwargs)
        self.calls += 1
        fallbacks, previous, self.current = self.fallbacks.total(), self.current, (name, self.calls)
        try:
            return func(*args, **kwargs)
        finally:
            self.current = previous
            if self.fallbacks.total() != fallbacks:
                self.report.cpu_fallbacks[Site(name, user_line())] += 1

    def _note(self, func: Any, name: str, args: tuple, kwargs: dict) -> None:
        report = self.report
        report.ops[name] += 1
        if func is aten._local_scalar_dense.default:
            report.syncs[Site("item", user_line())] += 1
        elif func in self.host_kinds:
            report.syncs[Site(self.host_kinds[func], user_line())] += 1
        elif func is aten.index.Tensor and _has_mask(args[1]):
            report.syncs[Site("data-dependent shape", user_line())] += 1
        elif _copies_to_host(func, args, kwargs):
            report.syncs[Site("cpu/tolist", user_line())] += 1
        elif func in _MATMULS and args[0].dtype == torch.float32:
            report.float32_matmuls += 1


class diagnose:  # noqa: N801  (used like torch.no_grad)
    """Collect what the block makes torch_tpu do; at its end, print the report to stderr
    (``print=False``: not) and leave it, a :class:`Report`, as the ``with`` target. The
    device's side (ops by device time, each program run, memory over time) comes from a
    ``torch.profiler`` session around the block (``profile=False``: none; none either where
    another profiler records).

    >>> import torch, torch_tpu
    >>> with torch_tpu.diagnose(print=False) as report:
    ...     x = torch.ones(4, device="tpu")
    ...     total = (x * 2).sum().item()
    >>> report.ops["aten.mul.Tensor"], [site.what for site in report.syncs]
    (1, ['item'])
    """

    def __init__(self, *, print: bool = True, profile: bool = True) -> None:  # noqa: A002  (the option's name)
        self.print = print
        self.report = Report()
        #: a torch.profiler session for the device's side (``profile=False``: none)
        self._device = device.Session() if profile else None
        self._watch: _OpWatch | None = None
        self._last_compiling_call: tuple[str, int] | None = None

    def __enter__(self) -> Report:
        tpu.init()
        tpu.synchronize()  # (what ran before the block is not its)
        self._before = _Baseline.now()
        torch.tpu.reset_peak_memory_stats()
        self._install()
        if self._device is not None:
            self._device.start()
        self._started = time.perf_counter()
        return self.report

    def __exit__(self, kind, error, traceback) -> None:
        try:
            if kind is None:
                torch.tpu.synchronize()  # (the block's pending work is its)
        finally:
            if self._device is not None:
                self.report.device = self._device.stop()
            self._remove()
        self._conclude()
        if self.print:
            print(self.report.text(), file=sys.stderr)

    def _install(self) -> None:
        import jax

        self._watch = _OpWatch(self.report)
        self._watch.__enter__()
        events.listen(self._on_event)
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_jax_event)

    def _remove(self) -> None:
        import jax

        jax.monitoring.unregister_event_listener(self._on_jax_event)
        jax.monitoring.unregister_event_duration_listener(self._on_duration)
        events.unlisten(self._on_event)
        self._watch.__exit__(None, None, None)

    def _on_event(self, event: events.Event) -> None:
        counts = self.report.recompiles if event.kind == "recompile" else self.report.syncs
        counts[Site(event.detail.strip(), event.line)] += 1

    def _on_duration(self, event: str, duration: float, **_: Any) -> None:
        if event != _COMPILED:
            return
        current = self._watch.current
        what = "a fused graph" if context.recorder is not None or current is None else current[0]
        site = Site(what, user_line())
        report = self.report
        report.compiles[site] += 1
        report.compile_seconds += duration
        if current is not None and current != self._last_compiling_call:
            report.compiling_calls[site] += 1
        self._last_compiling_call = current

    def _on_jax_event(self, event: str, **_: Any) -> None:
        if event == _DISK_HIT:
            self.report.disk_cache_hits += 1

    def _conclude(self) -> None:
        report, after = self.report, _Baseline.now()
        report.wall_seconds = time.perf_counter() - self._started
        report.flushes = after.flushes - self._before.flushes
        report.graph_breaks = after.graph_breaks - self._before.graph_breaks
        report.dynamo_graphs = after.dynamo_graphs - self._before.dynamo_graphs
        report.peak_memory_bytes = torch.tpu.max_memory_allocated()
        report.matmul_precision = torch.get_float32_matmul_precision()
        report.hints = hints.hints(report)


@dataclasses.dataclass(frozen=True)
class _Baseline:
    """The counters kept elsewhere, at one moment: a report holds their change."""

    flushes: collections.Counter
    graph_breaks: collections.Counter
    dynamo_graphs: int

    @classmethod
    def now(cls) -> _Baseline:
        from ..execution import fused

        dynamo = sys.modules.get("torch._dynamo.utils")  # (not imported for the report)
        counters = dynamo.counters if dynamo is not None else {}
        return cls(
            collections.Counter(fused.stats.sync_reasons),
            collections.Counter(counters.get("graph_break", {})),
            counters.get("stats", {}).get("unique_graphs", 0),
        )
