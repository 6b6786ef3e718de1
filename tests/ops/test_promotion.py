"""torch_tpu's elementwise type promotion is PyTorch's (``torch._prims_common.elementwise_dtypes``,
which torch_tpu does not call: it imports sympy) for every operand signature: each dtype as a
tensor with dimensions or 0-dim, and each kind of Python number, under two default dtypes."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Promote
from torch._prims_common import elementwise_dtypes as torch_elementwise_dtypes

from torch_tpu.ops.promotion import elementwise_dtypes

DTYPES = [
    torch.bool,
    *(torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64),
    *(torch.uint16, torch.uint32, torch.uint64),  # (the dispatcher refuses their mixes first)
    *(torch.float16, torch.bfloat16, torch.float32, torch.float64),
    *(torch.complex64, torch.complex128),
]
OPERANDS = [(d, zero_dim) for d in DTYPES for zero_dim in (False, True)] + [
    (t, True) for t in (bool, int, float, complex)
]
#: every signature of one and two operands, and a fixed sample of 800 of three
SIGNATURES = [
    *((a,) for a in OPERANDS),
    *itertools.product(OPERANDS, repeat=2),
    *random.Random(0).sample(list(itertools.product(OPERANDS, repeat=3)), 800),
]


def _example(dtype, zero_dim):
    if isinstance(dtype, torch.dtype):
        return torch.empty(() if zero_dim else (2,), dtype=dtype, device="meta")
    return dtype(1)


def _outcome(promote):
    """The dtypes, or the type of the exception raised (mixes of unsigned and signed types
    PyTorch cannot order: torch_tpu's dispatcher raises torch.result_type's error first)."""
    try:
        return promote()
    except Exception as error:  # noqa: BLE001
        return type(error)


@pytest.mark.parametrize("default", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("kind", list(Promote), ids=lambda k: k.name)
def test_promotion_is_pytorchs(kind, default):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        for signature in SIGNATURES:
            examples = [_example(*s) for s in signature]
            expected = _outcome(lambda: torch_elementwise_dtypes(*examples, type_promotion_kind=kind))
            assert _outcome(lambda: elementwise_dtypes(signature, kind, default)) == expected, signature
    finally:
        torch.set_default_dtype(previous)
