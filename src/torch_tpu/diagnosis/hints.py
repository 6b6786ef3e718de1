"""The hints a report ends with: each rule a small function of the :class:`~.report.Report`,
returning its hints (none where it does not apply). :data:`RULES` lists them in the order
printed."""

from __future__ import annotations

from collections.abc import Callable

from .. import config
from .report import Report, short_reason

#: a sync at one line this many times is worth a hint
REPEATED_SYNCS = 3
#: this many calls of one op at one line that compiled: its shapes change from call to call
REPEATED_COMPILES = 3


def item_syncs(report: Report) -> list[str]:
    return [
        f"`.item()` at {site.where()} ran {n} times: each call waits for the device (a host "
        "sync); read such values every N steps (log every 10 steps), or keep them on the device"
        for site, n in report.syncs.items()
        if site.what == "item" and n >= REPEATED_SYNCS
    ]


def host_copies(report: Report) -> list[str]:
    return [
        f"`.cpu()`/`.tolist()` at {site.where()} ran {n} times: each waits for the device and "
        "copies to the host; copy less often, or keep the tensor on tpu"
        for site, n in report.syncs.items()
        if site.what == "cpu/tolist" and n >= REPEATED_SYNCS
    ]


def data_dependent_shapes(report: Report) -> list[str]:
    return [
        f"an op at {site.where()} has an output shape that depends on values ({n} times: "
        "nonzero, masked_select, unique, boolean indexing): the host waits for them; "
        "torch.where or a mask keeps the shape fixed"
        for site, n in report.syncs.items()
        if site.what == "data-dependent shape" and n >= REPEATED_SYNCS
    ]


def value_checks(report: Report) -> list[str]:
    return [
        f"an op at {site.where()} checks values XLA cannot (index bounds, division by zero) "
        f"and waits for them, {n} times; in fused eager (torch_tpu.set_eager_mode('fused')) "
        "the check runs with the graph instead"
        for site, n in report.syncs.items()
        if site.what == "value check" and n >= REPEATED_SYNCS
    ]


def changing_shapes(report: Report) -> list[str]:
    by_line: dict[str, list[str]] = {}
    for site, calls in report.compiling_calls.items():
        if calls >= REPEATED_COMPILES:
            by_line.setdefault(site.where(), []).append(f"{site.what} {calls}")
    remedy = (
        "pad inputs to a few sizes (torch_tpu.pad_to_bucket, torch_tpu.bucket_size)"
        if config.buckets
        else "turn size buckets on (TORCH_TPU_BUCKETS=1; they are off) or pad inputs with "
        "torch_tpu.pad_to_bucket"
    )
    return [
        f"ops at {line} compiled again and again ({', '.join(ops)} calls compiled): their shapes "
        f"change from call to call; {remedy}"
        for line, ops in by_line.items()
    ]


def cpu_fallbacks(report: Report) -> list[str]:
    return [
        f"{site.what} runs on CPU fallback at {site.where()} ({n} call{'s' * (n != 1)}): each copies its "
        "inputs to the host and back; it has no tpu lowering yet"
        for site, n in report.cpu_fallbacks.items()
    ]


def matmul_precision(report: Report) -> list[str]:
    if not report.float32_matmuls or report.matmul_precision != "highest":
        return []
    return [
        f"{report.float32_matmuls} float32 matmuls ran at full precision: "
        "torch.set_float32_matmul_precision('high') lets XLA use faster passes"
    ]


def graph_breaks(report: Report) -> list[str]:
    return [
        f"torch.compile graph break ({n}x): {short_reason(reason)}"
        for reason, n in report.graph_breaks.items()
    ]


RULES: list[Callable[[Report], list[str]]] = [
    cpu_fallbacks,
    item_syncs,
    host_copies,
    data_dependent_shapes,
    value_checks,
    changing_shapes,
    matmul_precision,
    graph_breaks,
]


def hints(report: Report) -> list[str]:
    """Every rule's hints for ``report``."""
    return [hint for rule in RULES for hint in rule(report)]
