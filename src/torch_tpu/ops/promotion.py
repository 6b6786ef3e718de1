"""PyTorch's elementwise type promotion (``torch._prims_common.elementwise_dtypes``), computed
from an op's operand signature.

The same rules as PyTorch's function, which also takes symbolic (sympy) numbers and so imports
sympy at its first call: half a second of the first elementwise op of every fresh process.
``tests/ops/test_promotion.py`` holds this one equal to PyTorch's for every signature.
"""

from __future__ import annotations

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Promote
from torch._prims_common import (
    corresponding_complex_dtype,
    corresponding_real_dtype,
    dtype_to_type,
    get_computation_dtype,
    get_higher_dtype,
    get_higher_type,
    is_complex_dtype,
    is_float_dtype,
    is_integer_dtype,
)

from ..runtime.dtypes import FLOAT8, type_name

#: An operand: (its dtype, is 0-dim) for a tensor, (bool/int/float/complex, True) for a number.
Signature = tuple[tuple[torch.dtype | type, bool], ...]


def _higher(highest: torch.dtype | None, dtype: torch.dtype) -> torch.dtype:
    """``get_higher_dtype``, refusing to promote a float8 dtype with another as c10 does."""
    if highest is not None and highest != dtype and (highest in FLOAT8 or dtype in FLOAT8):
        raise RuntimeError(
            "Promotion for Float8 Types is not supported, attempted to promote "
            f"{type_name(highest)} and {type_name(dtype)}"
        )
    return get_higher_dtype(highest, dtype)


def _highest_tensor_dtype(signature: Signature, wanted, as_complex: bool = False) -> torch.dtype | None:
    """The highest ``wanted`` dtype among tensors with dimensions, else among 0-dim ones."""
    highest = {False: None, True: None}  # (keyed by is 0-dim)
    for dtype, zero_dim in signature:
        if isinstance(dtype, torch.dtype) and wanted(dtype):
            if as_complex and is_float_dtype(dtype):
                dtype = corresponding_complex_dtype(dtype)
            highest[zero_dim] = _higher(highest[zero_dim], dtype)
    return highest[True] if highest[False] is None else highest[False]


def _result_dtype(signature: Signature, default: torch.dtype) -> torch.dtype:
    category = bool  # bool < int < float < complex: the lowest holding every operand
    for dtype, _ in signature:
        kind = dtype_to_type(dtype) if isinstance(dtype, torch.dtype) else dtype
        category = get_higher_type(category, kind)
    if category is float:
        return _highest_tensor_dtype(signature, is_float_dtype) or default
    if category is complex:
        found = _highest_tensor_dtype(
            signature, lambda d: is_float_dtype(d) or is_complex_dtype(d), as_complex=True
        )
        return found or corresponding_complex_dtype(default)
    if category is int:
        return _highest_tensor_dtype(signature, is_integer_dtype) or torch.long
    return torch.bool


def elementwise_dtypes(
    signature: Signature, kind: Promote, default: torch.dtype
) -> tuple[torch.dtype, torch.dtype]:
    """(compute dtype, result dtype) of an elementwise op of ``kind`` over these operands, with
    ``default`` as the default dtype.

    Example::

        >>> elementwise_dtypes(((torch.int32, False), (float, True)), Promote.DEFAULT, torch.float32)
        (torch.float32, torch.float32)
    """
    result = _result_dtype(signature, default)
    if kind is Promote.NO_OPMATH:
        return result, result
    if kind is Promote.INT_TO_FLOAT and (is_integer_dtype(result) or result is torch.bool):
        result = default
    elif kind is Promote.BOOL_TO_LONG and result is torch.bool:
        return torch.long, torch.long
    compute = get_computation_dtype(result)
    if kind is Promote.COMPLEX_TO_FLOAT and is_complex_dtype(result):
        result = corresponding_real_dtype(result)
    elif kind is Promote.ALWAYS_BOOL:
        result = torch.bool
    return compute, result
