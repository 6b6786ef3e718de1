"""The opt-in CPU fallback, proven on op_db: every OpInfo that reaches an op tpu does not lower
still gives CPU's answer with ``TORCH_TPU_CPU_FALLBACK=1``, and each fallback is counted.

OpInfos that run natively are skipped here (``test_opinfo.py`` validates them); this file is the
separate count of what still needs the fallback.
"""

from __future__ import annotations

import pytest
import torch

from torch_tpu import config
from torch_tpu.ops import dispatch as _dispatch
from torch_tpu.ops.registry import LOWERINGS, qualified_name
from torch_tpu.testing.ops_seen import OpsSeen

from .test_opinfo import (
    DTYPES,
    OPS,
    SIGN_FREE_OPS,
    TIE_BREAK_OPS,
    _call,
    _compare,
    _grads,
    _name,
    _random,
    _resolve_ties,
    _run_or_skip,
    _to_tpu,
)


def _dtype(op) -> torch.dtype | None:
    supported = op.supported_dtypes("cpu")
    return next((d for d in DTYPES if d in supported), None)


def _first_sample(op, dtype):
    for sample in op.sample_inputs(
        "cpu", dtype, requires_grad=op.supports_autograd and dtype == torch.float32
    ):
        try:
            expected, _ = _call(op, sample, lambda x: x)
        except Exception:  # noqa: BLE001  (a sample CPU rejects says nothing about tpu)
            continue
        return sample, expected
    return None, None


_NATIVE = set(LOWERINGS) | set(_dispatch.DERIVED)


def _runs_on_tpu(op: torch._ops.OpOverload) -> bool:
    """Lowered, or a backend-independent composite (views, ``clone``) whose parts CPU and tpu
    share; either way no fallback at this level."""
    name = qualified_name(op)
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return op in _NATIVE or (has(name, "CompositeExplicitAutograd") and not has(name, "CPU"))


def _lowered_on_cpu(op, sample, name) -> bool:
    """True if every ATen op the CPU run reaches (forward and backward) runs on tpu: a cheap
    first look that spares compiling what test_opinfo.py already validates."""
    with OpsSeen() as recorder:
        _call(op, sample, lambda x: x, name)
        if op.supports_autograd and not _random(name, sample):
            _grads(op, sample, lambda x: x)
    return all(map(_runs_on_tpu, recorder.ops))


@pytest.mark.parametrize("op", OPS, ids=_name)
def test_op_runs_through_cpu_fallback(op, monkeypatch):
    name, dtype = _name(op), _dtype(op)
    if dtype is None:
        pytest.skip("no dtype tpu has")
    sample, expected = _first_sample(op, dtype)
    if sample is None:
        pytest.skip("no sample runs on CPU")
    if _lowered_on_cpu(op, sample, name):
        pytest.skip("runs natively: validated by test_opinfo.py")
    monkeypatch.setattr(config, "cpu_fallback", True)
    counts = _dispatch.cpu_fallback_counts
    before = counts.copy()
    try:
        actual, _ = _run_or_skip(lambda: _call(op, sample, _to_tpu, name))
        grads = op.supports_autograd and dtype == torch.float32 and not _random(name, sample)
        actual_grads = _run_or_skip(lambda: _grads(op, sample, _to_tpu)) if grads else None
        ran_on_cpu = counts != before
    finally:  # the counts are a process-wide report: leave them as other tests expect
        counts.clear()
        counts.update(before)
    if not ran_on_cpu:
        pytest.skip("runs natively: validated by test_opinfo.py")
    if name in SIGN_FREE_OPS:
        actual, expected = sample.output_process_fn_grad(actual), sample.output_process_fn_grad(expected)
    if name in TIE_BREAK_OPS:
        actual, expected = _resolve_ties(actual, expected, sample, TIE_BREAK_OPS[name], f"{name} forward")
    _compare(actual, expected, name, dtype, f"{name} forward via fallback", _random(name, sample))
    if grads:
        expected_grads = _grads(op, sample, lambda x: x)
        if expected_grads is not None:
            _compare(list(actual_grads), list(expected_grads), name, dtype, f"{name} backward via fallback")
