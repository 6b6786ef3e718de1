"""torch.profiler's tpu activities: what ran on the device, for how long, launched by which op.

``torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])``
(PrivateUse1 is tpu; it is among the defaults) starts the C++ core's Kineto activity profiler
(``csrc/runtime/TpuProfiler.cpp``), which calls this module:

- :func:`start` starts JAX's own profiler session, the one that sees XLA's program runs;
- :func:`stop` waits for the block's work (pending fused ops run) and stops it;
- :func:`activities` reads the session's trace into :class:`Activity` records: each XLA
  program run on the device, with its duration, tied to the op that launched it, and each
  compile on the host, with its reason. The C++ core makes them Kineto activities.

The op that launched a program is found by time: XLA's trace holds each launch on the host
(``...LoadedExecutable::Execute...``) and each run on the device (the events carrying a
``run_id``); a device runs its programs in launch order, so the n-th run belongs to the n-th
launch, and the launch lies inside the op that was open on the host then (Kineto tells the C++
core each op's correlation id as it opens and closes). A fused graph's run also names the ops
it holds and why it ran.

With no profiler active nothing here runs and nothing is recorded: the hot paths check
:data:`active` (one module attribute) at most once per fused graph.

>>> import torch, torch_tpu
>>> from torch.profiler import profile, ProfilerActivity
>>> x = torch.ones(8, device="tpu")
>>> with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
...     y = (x * 2).sum().item()
>>> any(e.device_type == torch.autograd.DeviceType.PrivateUse1 for e in prof.events())
True
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
from typing import Any

from .. import config
from . import events

#: Whether a profiler session records now (fused eager's flushes note their ops while it does).
active: bool = False

#: ``Activity.kind``: a program run on the device, or an event on the host (a compile, a flush)
DEVICE, HOST = 0, 1

_COMPILED, _DISK_HIT = events.JAX_COMPILED, events.JAX_DISK_HIT
#: the names of torch_tpu's events in the trace: a fused graph's run (on the host, and its
#: program on the device), an XLA compile, and an executable loaded from the disk cache instead
FUSED_GRAPH, COMPILE, CACHE_LOAD = "tpu::fused_graph", "tpu::compile", "tpu::cache_load"


@dataclasses.dataclass(frozen=True)
class Activity:
    """One event for the trace, as the C++ core reads it (``TpuProfiler.cpp``'s ``add``):
    times in ns since the epoch; ``correlation`` is the launching op's id (0: none);
    ``device`` the tpu index (device events); ``resource`` the stream (device) or thread
    (host)."""

    kind: int
    name: str
    start: int
    end: int
    correlation: int
    device: int
    resource: int
    metadata: dict[str, str]

    def as_record(self) -> tuple:
        return (
            self.kind,
            self.name,
            self.start,
            self.end,
            self.correlation,
            self.device,
            self.resource,
            self.metadata,
        )


@dataclasses.dataclass(frozen=True)
class Interval:
    """An op the torch profiler recorded: its correlation id and when it was open (ns)."""

    id: int
    thread: int
    start: int
    end: int


@dataclasses.dataclass(frozen=True)
class Note:
    """What torch_tpu tells the trace of a span of host time: a fused graph's run (its ops and
    why it ran) or a compile (its reason)."""

    name: str
    start: int
    end: int
    thread: int
    metadata: dict[str, str]


@dataclasses.dataclass
class _Recording:
    """The one session recording now, or the last one, until :func:`activities` reads it."""

    session: Any = None
    started: int = 0
    trace: bytes | None = None
    notes: list[Note] = dataclasses.field(default_factory=list)
    reasons: list[str] = dataclasses.field(default_factory=list)


_recording = _Recording()


# ----------------------------------------------------------------------------- the session
def start() -> None:
    """Called by the C++ core as a torch profiler session that wants tpu activities starts."""
    global active, _recording
    import jax
    from jax._src.lib import _profiler

    _recording = _Recording(started=time.time_ns())
    try:
        _recording.session = _profiler.ProfilerSession(_options())
    except Exception as error:  # (another JAX profiler session is active: no device events)
        import warnings

        warnings.warn(
            f"torch_tpu: JAX's profiler could not start ({error}); this profile has no tpu device events",
            RuntimeWarning,
            stacklevel=2,
        )
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    jax.monitoring.register_event_listener(_on_jax_event)
    events.listen(_on_event)
    active = True


def _options() -> Any:
    """JAX's profiler options for a session: XLA's launches and program runs, not every
    Python call (its Python tracer multiplies a step's host time) nor the HLO of each program."""
    from jax._src.lib import _profiler

    options = _profiler.ProfileOptions()
    options.python_tracer_level = 0
    options.enable_hlo_proto = False
    options.host_tracer_level = HOST_TRACER_LEVEL
    return options


#: XLA's host events kept: 2 holds the launches and the CPU backend's program runs
HOST_TRACER_LEVEL = 2


def stop() -> None:
    """Called by the C++ core as the session stops: the block's work finishes first."""
    global active
    import jax

    from . import platform

    try:
        if platform.is_initialized():
            import torch

            torch.tpu.synchronize()
    finally:
        active = False
        events.unlisten(_on_event)
        jax.monitoring.unregister_event_listener(_on_jax_event)
        jax.monitoring.unregister_event_duration_listener(_on_duration)
        if _recording.session is not None:
            _recording.trace = _recording.session.stop()
            _recording.session = None
            if config.xla_trace_dir:
                save_xla_trace(_recording.trace, config.xla_trace_dir)


def save_xla_trace(trace: bytes, directory: str) -> str:
    """Write XLA's trace of a session where TensorBoard's profile plugin and XProf look for it
    (``<directory>/plugins/profile/<time>/<host>.xplane.pb``); the file's path."""
    import os
    import socket

    run = os.path.join(directory, "plugins", "profile", time.strftime("%Y_%m_%d_%H_%M_%S"))
    os.makedirs(run, exist_ok=True)
    path = os.path.join(run, f"{socket.gethostname()}.xplane.pb")
    with open(path, "wb") as f:
        f.write(trace)
    return path


def note(name: str, started: int, metadata: dict[str, str]) -> None:
    """Tell the trace of a span of host time that began at ``started`` (``time.time_ns()``)
    and ends now (call only while :data:`active`)."""
    _recording.notes.append(Note(name, started, time.time_ns(), threading.get_native_id(), metadata))


def _on_event(event: Any) -> None:
    if event.kind == "recompile":
        _recording.reasons.append(event.detail.strip())


#: whether this thread's program being compiled was loaded from the disk cache instead (JAX
#: tells the hit before the duration, which it measures for loads too)
_loaded = threading.local()


def _on_jax_event(event: str, **_: Any) -> None:
    if event == _DISK_HIT:
        _loaded.hit = True


def _on_duration(event: str, duration: float, **_: Any) -> None:
    if event != _COMPILED:
        return
    started = time.time_ns() - int(duration * 1e9)
    if getattr(_loaded, "hit", False):
        _loaded.hit = False
        note(CACHE_LOAD, started, {})
        return
    reasons, _recording.reasons = _recording.reasons, []
    reason = "; ".join(reasons) or "a program not compiled before in this process"
    note(COMPILE, started, {"reason": reason})


# ----------------------------------------------------------------------------- the trace
def activities(intervals: list[tuple]) -> list[tuple]:
    """The session's activities, as records for the C++ core, given the ops the torch
    profiler recorded (``(correlation id, thread, start, end)``, ns)."""
    opened = _Ops([Interval(*i) for i in intervals])
    out = [_host_activity(n, opened) for n in _recording.notes]
    if _recording.trace is not None:
        out += _device_activities(_recording.trace, opened, _recording.notes)
    _recording.trace, _recording.notes = None, []
    return [a.as_record() for a in out]


class _Ops:
    """The ops the profiler recorded, to find the innermost one open at a moment."""

    def __init__(self, intervals: list[Interval]) -> None:
        self.intervals = sorted(intervals, key=lambda i: i.start)
        self.starts = [i.start for i in self.intervals]

    def at(self, moment: int, thread: int | None = None) -> int:
        """The correlation id of the innermost op open at ``moment`` (on ``thread`` if given);
        0 if none."""
        for i in reversed(range(bisect.bisect_right(self.starts, moment))):
            interval = self.intervals[i]
            if interval.end >= moment and (thread is None or interval.thread == thread):
                return interval.id
        return 0


def _host_activity(n: Note, opened: _Ops) -> Activity:
    return Activity(HOST, n.name, n.start, n.end, opened.at(n.start, n.thread), 0, n.thread, n.metadata)


@dataclasses.dataclass(frozen=True)
class _Run:
    """A program's run on the device, from XLA's trace (ns since the epoch)."""

    module: str
    start: int
    end: int
    device: int


def _device_activities(trace: bytes, opened: _Ops, notes: list[Note]) -> list[Activity]:
    from jax.profiler import ProfileData

    profile = ProfileData.from_serialized_xspace(trace)
    base = _start_time(profile)
    launches = sorted(base + int(e.start_ns) for e in _launch_events(profile))
    runs = sorted(_runs(profile, base), key=lambda r: r.start)
    flushes = [n for n in notes if n.name == FUSED_GRAPH]
    out = []
    for launch, run in zip(launches, runs):
        name, metadata = run.module, {"program": run.module}
        flush = next((n for n in flushes if n.start <= launch <= n.end), None)
        if flush is not None:  # (a fused graph's run: named as its host event, with its ops)
            name = FUSED_GRAPH
            metadata.update(flush.metadata)
        out.append(Activity(DEVICE, name, run.start, run.end, opened.at(launch), run.device, 0, metadata))
    return out


def _start_time(profile: Any) -> int:
    """The epoch time (ns) the trace's event times count from."""
    for plane in profile.planes:
        stats = dict(plane.stats)
        if "profile_start_time" in stats:
            return int(stats["profile_start_time"])
    return _recording.started


#: the host event of a program's launch (PJRT's ``...LoadedExecutable::Execute...``) and one
#: inside it that is not another launch
_LAUNCH, _NOT_LAUNCH = "LoadedExecutable::Execute", "Prepare"


def _launch_events(profile: Any) -> list:
    """Each program launch on the host: the outermost launch event of each nesting."""
    found = []
    for plane in profile.planes:
        if not plane.name.startswith("/host:"):
            continue
        for line in plane.lines:
            end = -1.0
            for event in sorted(line.events, key=lambda e: e.start_ns):
                if _LAUNCH in event.name and _NOT_LAUNCH not in event.name and event.start_ns >= end:
                    found.append(event)
                    end = event.start_ns + event.duration_ns
    return found


#: the beginnings of the names of XLA's host machinery events, which are no part of a run (not
#: reading their statistics halves the time a trace takes to read)
_MACHINERY = (
    "ThreadpoolListener::",
    "ThunkExecutor::",
    "Wait for ",
    "ParseArguments",
    "PjitFunction(",
    "CommonPjRt",
    "Handle input",
    "AllocateOutputBuffers",
    "PythonRefManager",
    "end: ",
)


def _runs(profile: Any, base: int) -> list[_Run]:
    """Each program run: the span of the events XLA tagged with one ``run_id``."""
    spans: dict[int, list] = {}
    for plane in profile.planes:
        for line in plane.lines:
            for event in line.events:
                if event.name.startswith(_MACHINERY):
                    continue
                stats = dict(event.stats)
                if "run_id" in stats and "hlo_module" in stats:
                    start, end = event.start_ns, event.start_ns + event.duration_ns
                    key = stats["run_id"]
                    if key in spans:
                        span = spans[key]
                        span[1], span[2] = min(span[1], start), max(span[2], end)
                    else:
                        spans[key] = [stats["hlo_module"], start, end, int(stats.get("device_ordinal", 0))]
    return [
        _Run(module, base + int(start), base + int(end), device)
        for module, start, end, device in spans.values()
    ]
