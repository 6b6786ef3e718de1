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


#: what to say of a host sync repeated at one line, by its kind (``{where}``: the line,
#: ``{n}``: how many times)
SYNC_ADVICE = {
    "item": "`.item()` at {where} ran {n} times: each call waits for the device (a host sync); "
    "read such values every N steps (log every 10 steps), or keep them on the device",
    "cpu/tolist": "`.cpu()`/`.tolist()` at {where} ran {n} times: each waits for the device and "
    "copies to the host; copy less often, or keep the tensor on tpu",
    "data-dependent shape": "an op at {where} has an output shape that depends on values ({n} "
    "times: nonzero, masked_select, unique, boolean indexing): the host waits for them; "
    "torch.where or a mask keeps the shape fixed",
    "value check": "an op at {where} checks values XLA cannot (index bounds, division by zero) "
    "and waits for them, {n} times; in fused eager (torch_tpu.set_eager_mode('fused')) the "
    "check runs with the graph instead",
}


def repeated_syncs(report: Report) -> list[str]:
    """A hint per line that synced with the host again and again, in :data:`SYNC_ADVICE`'s order."""
    return [
        advice.format(where=site.where(), n=n)
        for kind, advice in SYNC_ADVICE.items()
        for site, n in report.syncs.items()
        if site.what == kind and n >= REPEATED_SYNCS
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
    repeated_syncs,
    changing_shapes,
    matmul_precision,
    graph_breaks,
]


def hints(report: Report) -> list[str]:
    """Every rule's hints for ``report``."""
    return [hint for rule in RULES for hint in rule(report)]
