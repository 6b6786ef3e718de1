"""The record a diagnosis fills (:class:`Report`) and its text."""

from __future__ import annotations

import collections
import dataclasses
import os

from .device import DeviceTime


@dataclasses.dataclass(frozen=True)
class Site:
    """Something that happened at a line of the user's code: ``what`` is an op's name, a kind
    of host sync or a reason to compile; ``line`` is ``path:lineno``."""

    what: str
    line: str

    def where(self) -> str:
        """``line`` with its path relative to the working directory where it lies below it."""
        path, _, number = self.line.rpartition(":")
        if not path or not os.path.isabs(path):
            return self.line
        relative = os.path.relpath(path)
        return f"{path if relative.startswith('..') else relative}:{number}"


@dataclasses.dataclass
class Report:
    """What the code inside ``torch_tpu.diagnose()`` made torch_tpu do. The counters fill while
    the block runs; the totals and :attr:`hints` are set when it ends."""

    #: tpu ATen ops run, by name (``aten.add.Tensor``)
    ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: ops run on CPU through ``TORCH_TPU_CPU_FALLBACK=1``: (op, line) -> calls
    cpu_fallbacks: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: XLA compiles (executables loaded from the disk cache included): (the op or program being
    #: run, line) -> compiles
    compiles: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: the calls of an op that compiled (one call may compile several programs): (op, line) ->
    #: calls; an op compiling at most of its calls has shapes that change
    compiling_calls: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    compile_seconds: float = 0.0
    #: executables loaded from the disk cache instead of compiled
    disk_cache_hits: int = 0
    #: why programs compiled again: (reason, line) -> times
    recompiles: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: host syncs: (kind, line) -> times; kinds ``item``, ``cpu/tolist``, ``data-dependent
    #: shape``, ``value check``
    syncs: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: fused eager's graph runs, by what made them run (``fused.stats.sync_reasons``)
    flushes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    #: ``torch.compile`` graph breaks by reason, and the graphs Dynamo compiled
    graph_breaks: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    dynamo_graphs: int = 0
    #: float32 matrix products and convolutions run, and the precision they ran at
    float32_matmuls: int = 0
    matmul_precision: str = ""
    peak_memory_bytes: int = 0
    wall_seconds: float = 0.0
    hints: list[str] = dataclasses.field(default_factory=list)
    #: what the device did (ops by device time, program runs, memory over time); None where
    #: no profiler session ran (``diagnose(profile=False)``, or another profiler recording)
    device: DeviceTime | None = None

    @property
    def compile_count(self) -> int:
        return sum(self.compiles.values())

    def html(self) -> str:
        """The report as one self-contained HTML page, with plots of the device's side."""
        from .html import render

        return render(self)

    def save_html(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html())

    def text(self) -> str:
        """The report as printed at the end of the block."""
        sections = (
            _summary,
            _op_lines,
            _device_lines,
            _compile_lines,
            _recompile_lines,
            _sync_lines,
            _flush_lines,
            _dynamo_lines,
        )
        lines = [line for section in sections for line in section(self)]
        lines += ["hints:"] + [f"  - {hint}" for hint in self.hints] if self.hints else ["hints: none"]
        return "\n".join(lines)


#: at most this many rows per table
_ROWS = 8


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def _summary(report: Report) -> list[str]:
    peak = _mib(report.peak_memory_bytes) if report.peak_memory_bytes else "not reported by this device"
    return [f"torch_tpu diagnosis: {report.wall_seconds:.2f} s, peak memory {peak}"]


def _site_rows(counts: collections.Counter) -> list[str]:
    rows = [f"  {n:>5}  {site.what}  at {site.where()}" for site, n in counts.most_common(_ROWS)]
    if len(counts) > _ROWS:
        rows.append(f"  ... {len(counts) - _ROWS} more")
    return rows


def _op_lines(report: Report) -> list[str]:
    fallbacks = sum(report.cpu_fallbacks.values())
    lines = [
        f"ops: {sum(report.ops.values())} run on tpu ({len(report.ops)} kinds), {fallbacks} on CPU fallback"
    ]
    top = ", ".join(f"{name} {n}" for name, n in report.ops.most_common(5))
    lines += [f"  most run: {top}"] if top else []
    return lines + _site_rows(report.cpu_fallbacks)


def _device_lines(report: Report) -> list[str]:
    device = report.device
    if device is None:
        return []
    head = f"device time: {device.total_us / 1e3:.2f} ms in {len(device.runs)} program runs"
    rows = [f"  {op.device_us / 1e3:>8.2f} ms  {op.name} ({op.calls} calls)" for op in device.ops[:_ROWS]]
    return [head] + rows


def _compile_lines(report: Report) -> list[str]:
    cached = (
        f"; {report.disk_cache_hits} of them loaded from the disk cache" if report.disk_cache_hits else ""
    )
    head = f"XLA compiles: {report.compile_count} ({report.compile_seconds:.2f} s{cached})"
    return [head] + _site_rows(report.compiles)


def _recompile_lines(report: Report) -> list[str]:
    return ["recompiles, and why:"] + _site_rows(report.recompiles) if report.recompiles else []


def _sync_lines(report: Report) -> list[str]:
    return [f"host syncs: {sum(report.syncs.values())}"] + _site_rows(report.syncs)


def _flush_lines(report: Report) -> list[str]:
    if not report.flushes:
        return []
    return [
        "fused graph runs, by cause: " + ", ".join(f"{why} {n}" for why, n in report.flushes.most_common())
    ]


def short_reason(reason: str) -> str:
    """A graph break's reason in one line: Dynamo's first line and its explanation."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    explanation = next((line for line in lines if line.startswith("Explanation:")), None)
    if not lines or explanation is None:
        return " ".join(lines)
    return f"{lines[0]}: {explanation.removeprefix('Explanation:').strip()}"


def _dynamo_lines(report: Report) -> list[str]:
    if not (report.graph_breaks or report.dynamo_graphs):
        return []
    breaks = sum(report.graph_breaks.values())
    lines = [f"torch.compile: {report.dynamo_graphs} graphs compiled, {breaks} graph breaks"]
    return lines + [
        f"  {n:>5}  {short_reason(reason)}" for reason, n in report.graph_breaks.most_common(_ROWS)
    ]
