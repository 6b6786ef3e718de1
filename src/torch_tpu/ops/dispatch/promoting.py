"""The dtypes an elementwise op computes in and returns, as ``torch.result_type`` decides them."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ...runtime.dtypes import to_jax
from .. import cpu_dtypes
from ..promotion import elementwise_dtypes
from ..registry import Promote, Types


@functools.lru_cache(maxsize=4096)
def promoted(kind, signature, default_dtype: torch.dtype) -> Types:
    """The compute/result dtypes of an elementwise op for inputs of this signature
    ((dtype or Python type, is 0-dim) per input) under this default dtype, which is where
    integers and Python floats promote to (``torch.set_default_dtype``)."""
    _check_unsigned_promotion(signature)
    compute, result = elementwise_dtypes(signature, kind, default_dtype)
    return Types(to_jax(compute), to_jax(result))


def _check_unsigned_promotion(signature) -> None:
    """torch.result_type's RuntimeError for uint16/32/64 with another integer or bool dtype,
    which ``elementwise_dtypes`` does not raise: tensors with dimensions promote among
    themselves, as do 0-dim ones (a 0-dim tensor or a number of the same kind defers)."""
    if not any(s in cpu_dtypes.UNSIGNED for s, _ in signature):
        return
    for zero_dim in (False, True):
        dtypes = [s for s, z in signature if isinstance(s, torch.dtype) and z == zero_dim]
        if dtypes:
            functools.reduce(torch.promote_types, dtypes)  # raises CPU's error


_Tensor = torch.Tensor


def operand_signature(values, positions=None) -> tuple:
    """What promotion depends on: (dtype, is 0-dim) per tensor, (type, True) per number, of
    ``values`` (those at ``positions``; None: all)."""
    signature = []
    for v in values if positions is None else map(values.__getitem__, positions):
        if v is None:
            continue
        signature.append((v.dtype, not v.dim()) if isinstance(v, _Tensor) else (type(v), True))
    return tuple(signature)


def promoted_types(kind, values) -> Types:
    """``promoted`` for these operands (see :func:`operand_signature`)."""
    return promoted(kind, operand_signature(values), torch.get_default_dtype())


def common_dtype(kind, promote_pos) -> Callable:
    """The dtype CPU's TensorIterator runs an elementwise op in: the promotion of its operands
    (``DEFAULT``'s result dtype; half types not widened, integers not made float)."""
    if kind is Promote.DEFAULT:
        return lambda values, types: types.result
    return lambda values, types: promoted_types(Promote.DEFAULT, [values[i] for i in promote_pos]).result
