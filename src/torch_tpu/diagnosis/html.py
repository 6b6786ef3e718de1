"""A diagnosis as one self-contained HTML page: the report's text, its hints, and three plots
drawn as inline SVG (nothing fetched when it opens): the device's program runs over time, the
ops by device time, and the tpu memory held over time."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .device import DeviceTime

if TYPE_CHECKING:  # (report.py renders through this module)
    from .report import Report

WIDTH, BAR = 900, 18
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 960px; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; }
svg text { font-size: 11px; font-family: monospace; }
h2 { margin-top: 1.5em; }
"""
_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f")


def render(report: Report, title: str = "torch_tpu diagnosis") -> str:
    """The page for ``report``."""
    parts = [f"<h1>{html.escape(title)}</h1>", _hints(report)]
    if report.device is not None:
        parts += [
            "<h2>Ops by device time</h2>",
            op_bars(report.device),
            "<h2>Program runs on the device</h2>",
            timeline(report.device),
            "<h2>tpu memory held by the block's storages</h2>",
            memory_plot(report.device),
        ]
    parts += ["<h2>Report</h2>", f"<pre>{html.escape(report.text())}</pre>"]
    body = "\n".join(parts)
    return f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>' + (
        f"<style>{_STYLE}</style></head><body>\n{body}\n</body></html>\n"
    )


def _hints(report: Report) -> str:
    if not report.hints:
        return "<p>No hints: nothing this diagnosis knows to change.</p>"
    items = "".join(f"<li>{html.escape(h)}</li>" for h in report.hints)
    return f"<h2>Hints</h2><ul>{items}</ul>"


def _svg(height: int, content: Sequence[str]) -> str:
    return (
        f'<svg width="{WIDTH}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
        + "".join(content)
        + "</svg>"
    )


def _none(what: str) -> str:
    return f"<p>No {what} in this block.</p>"


def op_bars(device: DeviceTime, rows: int = 15) -> str:
    """A bar per op, its length its device time."""
    ops = device.ops[:rows]
    if not ops:
        return _none("device time")
    label, most = 260, ops[0].device_us
    bars = []
    for i, op in enumerate(ops):
        y, length = i * (BAR + 4), max(1.0, (WIDTH - label - 120) * op.device_us / most)
        bars += [
            f'<text x="0" y="{y + 13}">{html.escape(op.name[:36])}</text>',
            f'<rect x="{label}" y="{y}" width="{length:.1f}" height="{BAR}" fill="{_COLORS[0]}"/>',
            f'<text x="{label + length + 6:.1f}" y="{y + 13}">'
            f"{op.device_us / 1e3:.3f} ms, {op.calls} calls</text>",
        ]
    return _svg(len(ops) * (BAR + 4), bars)


def timeline(device: DeviceTime) -> str:
    """Each program run as a bar on a time axis, one row per program."""
    runs = device.runs
    if not runs:
        return _none("program runs")
    names = list(dict.fromkeys(r.what for r in runs))[:20]
    end = max(r.start_us + r.duration_us for r in runs) or 1.0
    label, scale = 200, (WIDTH - 200) / end
    shapes = [
        f'<text x="0" y="{i * (BAR + 2) + 13}">{html.escape(n[:28])}</text>' for i, n in enumerate(names)
    ]
    for r in runs:
        if r.what in names:
            row = names.index(r.what)
            shapes.append(
                f'<rect x="{label + r.start_us * scale:.1f}" y="{row * (BAR + 2)}" '
                f'width="{max(1.0, r.duration_us * scale):.1f}" height="{BAR}" '
                f'fill="{_COLORS[row % len(_COLORS)]}"><title>{html.escape(r.what)}: '
                f"{r.duration_us:.1f} us at {r.start_us / 1e3:.3f} ms</title></rect>"
            )
    axis = len(names) * (BAR + 2) + 14
    shapes.append(f'<text x="{label}" y="{axis}">0 ms</text>')
    shapes.append(f'<text x="{WIDTH - 80}" y="{axis}">{end / 1e3:.2f} ms</text>')
    return _svg(axis + 4, shapes)


def memory_plot(device: DeviceTime, height: int = 160) -> str:
    """The bytes held over time, as a step line."""
    points = device.memory
    if not points:
        return _none("tpu allocations")
    end = max(t for t, _ in points) or 1.0
    most = max(b for _, b in points) or 1
    x = lambda t: 60 + (WIDTH - 70) * t / end  # noqa: E731
    y = lambda b: height - 20 - (height - 30) * b / most  # noqa: E731
    path, held = [f"M {x(0):.1f} {y(0):.1f}"], 0
    for t, b in points:
        path += [f"L {x(t):.1f} {y(held):.1f}", f"L {x(t):.1f} {y(b):.1f}"]
        held = b
    shapes = [
        f'<path d="{" ".join(path)}" fill="none" stroke="{_COLORS[3]}" stroke-width="1.5"/>',
        f'<text x="0" y="{y(most) + 4:.1f}">{most / 2**20:.2f} MiB</text>',
        f'<text x="0" y="{y(0):.1f}">0</text>',
        f'<text x="{WIDTH - 80}" y="{height - 4}">{end / 1e3:.2f} ms</text>',
    ]
    return _svg(height, shapes)
