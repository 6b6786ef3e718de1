"""The device side of a diagnosis: a ``torch.profiler`` session with tpu activities around the
block, read into a :class:`DeviceTime` (ops by device time, the program runs' timeline, memory
over time) for the report and its HTML page."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class OpTime:
    """An op's time on the device over the block: its name, microseconds, calls."""

    name: str
    device_us: float
    calls: int


@dataclasses.dataclass(frozen=True)
class Span:
    """A program's run on the device (``what``: its program, or ``tpu::fused_graph``),
    microseconds from the block's start."""

    what: str
    start_us: float
    duration_us: float


@dataclasses.dataclass
class DeviceTime:
    """What the device did during the block."""

    #: ATen ops by self device time, the most first
    ops: list[OpTime] = dataclasses.field(default_factory=list)
    #: each program run, in order
    runs: list[Span] = dataclasses.field(default_factory=list)
    #: (microseconds from the block's start, tpu bytes held by the storages made in the block)
    memory: list[tuple[float, int]] = dataclasses.field(default_factory=list)

    @property
    def total_us(self) -> float:
        return sum(r.duration_us for r in self.runs)


class Session:
    """The profiler session of a diagnosis: :meth:`start` on entry, :meth:`stop` on exit;
    absent where another profiler records already (one at a time)."""

    def __init__(self) -> None:
        self._profile: Any = None

    def start(self) -> None:
        from torch.autograd.profiler import _is_profiler_enabled
        from torch.profiler import ProfilerActivity, profile

        from ..runtime import native

        if _is_profiler_enabled or not native.available():
            return
        self._profile = profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True
        )
        self._profile.__enter__()

    def stop(self) -> DeviceTime | None:
        if self._profile is None:
            return None
        prof, self._profile = self._profile, None
        prof.__exit__(None, None, None)
        return read(prof)


def read(prof: Any) -> DeviceTime:
    """The :class:`DeviceTime` of a finished ``torch.profiler.profile``."""
    events = prof.events()
    origin = min((e.time_range.start for e in events), default=0.0)
    return DeviceTime(_ops(events), _runs(events, origin), _memory(prof.profiler.kineto_results, origin))


def _ops(events: list) -> list[OpTime]:
    """The ops that launched device work, by their device time. (Counted from the op calls
    that launched it: under a dispatch mode, such as the diagnosis's own, the profiler records
    each op twice, once at the mode and once at its kernel, which launches.)"""
    times: dict[str, list] = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU and e.self_device_time_total > 0:
            entry = times.setdefault(e.key, [0.0, 0])
            entry[0] += e.self_device_time_total
            entry[1] += 1
    timed = [OpTime(name, us, calls) for name, (us, calls) in times.items()]
    return sorted(timed, key=lambda o: o.device_us, reverse=True)


def _runs(events: list, origin: float) -> list[Span]:
    device = [e for e in events if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    spans = [Span(e.name, e.time_range.start - origin, e.time_range.elapsed_us()) for e in device]
    return sorted(spans, key=lambda s: s.start_us)


def _memory(results: Any, origin: float) -> list[tuple[float, int]]:
    """The tpu bytes held over time, from the allocator's reports (each storage made or freed)."""
    start = results.trace_start_ns()
    changes = sorted(
        ((e.start_ns() - start) / 1e3 - origin, e.nbytes())
        for e in results.events()
        if e.device_type() == torch.autograd.DeviceType.PrivateUse1 and e.name() == "[memory]"
    )
    held, out = 0, []
    for moment, change in changes:
        held += change
        out.append((moment, held))
    return out
