"""Every argument check CPU performs raises on tpu with the same exception type and message.

For each OpInfo with error inputs (the dense ones, as in ``test_opinfo.py``), each ``ErrorInput``
runs on tpu and must raise its ``error_type`` with a message matching its ``error_regex``
(``re.search``), as the OpInfo expects of a device other than CPU (CPU's kernels word a few
checks their own way). Each input runs on CPU first: one CPU accepts is a check of another
device and says nothing about tpu. An input reaching an op
tpu has no lowering for is skipped (docs/ops.md tracks those). ``ERROR_XFAILS`` lists the known
mismatches, strictly: one that starts matching fails until its entry goes.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch.testing._internal.opinfo.core import ErrorInput
from torch.utils._pytree import tree_flatten

from torch_tpu.runtime.dtypes import UnsupportedDtypeError

from .expectations import ERROR_XFAILS
from .test_opinfo import OPS, _name, _to_tpu


def _moved(error_input):
    """A CPU error input with its tensors moved to tpu (None: a dtype tpu does not have)."""
    try:
        sample = error_input.sample_input.transform(_to_tpu)
    except UnsupportedDtypeError:
        return None
    return ErrorInput(sample, error_type=error_input.error_type, error_regex=error_input.error_regex)


def _pairs(op):
    """(CPU, tpu) versions of each error input of ``op``. The tpu ones come from the OpInfo
    (some mix devices on purpose); once it stops at a dtype tpu does not have, the CPU inputs
    after that one, moved."""
    on_cpu = list(op.error_inputs("cpu"))
    on_tpu = []
    try:
        on_tpu.extend(op.error_inputs("tpu"))
    except UnsupportedDtypeError:
        on_tpu.append(None)
        on_tpu.extend(_moved(e) for e in on_cpu[len(on_tpu) :])
    return zip(on_cpu, on_tpu)


def _raised(op, sample) -> Exception | None:
    """What calling ``op`` on ``sample`` raises, its results read back (value checks report at
    the read in fused eager)."""
    try:
        result = op(sample.input, *sample.args, **sample.kwargs)
        for leaf in tree_flatten(result)[0]:
            if isinstance(leaf, torch.Tensor):
                leaf.cpu()
    except Exception as error:  # noqa: BLE001  (the error is what is compared)
        return error
    return None


def _mismatch(error: Exception | None, error_input) -> str | None:
    want = f"{error_input.error_type.__name__} /{error_input.error_regex}/"
    if error is None:
        return f"nothing raised, CPU raises {want}"
    if not isinstance(error, error_input.error_type) or not re.search(error_input.error_regex, str(error)):
        return f"{type(error).__name__}: {str(error)[:200]!r}, CPU raises {want}"
    return None


def _unlowered(error: Exception | None) -> bool:
    return isinstance(error, NotImplementedError) and "has no tpu lowering" in str(error)


@pytest.mark.parametrize(
    "op", [pytest.param(op, id=_name(op)) for op in OPS if op.error_inputs_func is not None]
)
def test_error_inputs(op):
    name = _name(op)
    expected = ERROR_XFAILS.get(name, {})
    mismatches, passing_xfails, ran = [], [], 0
    for index, (on_cpu, on_tpu) in enumerate(_pairs(op)):
        if on_tpu is None or _raised(op, on_cpu.sample_input) is None:
            continue  # not an error on CPU: another device's check
        error = _raised(op, on_tpu.sample_input)
        if _unlowered(error):
            continue
        ran += 1
        mismatch = _mismatch(error, on_tpu)
        if index in expected and mismatch is None:
            passing_xfails.append(f"#{index} now matches CPU: remove its ERROR_XFAILS entry")
        elif index not in expected and mismatch is not None:
            mismatches.append(f"#{index}: {mismatch}")
    assert not mismatches + passing_xfails, f"{name}:\n" + "\n".join(mismatches + passing_xfails)
    if not ran:
        pytest.skip("no error input CPU rejects as the OpInfo says reaches a tpu lowering")
