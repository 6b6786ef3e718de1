"""uint16/uint32/uint64: PyTorch's "barebones" unsigned dtypes, which CPU's kernels support only
in a few ops (creation, copies, views, ``==``/``!=``, bitwise and/or/xor, ``*``, sorting, ...).

tpu runs exactly those, and refuses the rest with CPU's ``NotImplementedError`` instead of
answering where CPU cannot. The lists were found by running OpInfo samples converted to these
dtypes through torch CPU (2.13) and recording which ATen overloads ran and which refused.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..runtime.dtypes import to_jax, type_name

UNSIGNED = frozenset({torch.uint16, torch.uint32, torch.uint64})
_UNSIGNED_JAX = frozenset(to_jax(d) for d in UNSIGNED)

#: Overloads whose CPU kernels take uint16/32/64 tensors: elementwise ops (whose check is on the
#: dtype they compute in; ops promoting integers to float need no entry) and the others (whose
#: check is on their tensor arguments; sum and cumsum accumulate in int64).
OPS = frozenset(
    {
        # elementwise, computing in the unsigned dtype
        "bitwise_and.Scalar",
        "bitwise_and.Tensor",
        "bitwise_or.Scalar",
        "bitwise_or.Tensor",
        "bitwise_xor.Scalar",
        "bitwise_xor.Tensor",
        "ceil.default",
        "eq.Scalar",
        "eq.Tensor",
        "flip.default",  # CPU flips other dims than the last one only: tpu flips all
        "floor.default",
        "isinf.default",
        "isnan.default",
        "isneginf.default",
        "isposinf.default",
        "mul.Scalar",
        "mul.Tensor",
        "nan_to_num.default",
        "ne.Scalar",
        "ne.Tensor",
        "round.default",
        "signbit.default",
        "trunc.default",
        "where.self",
        # the others
        "_chunk_cat.default",
        "_local_scalar_dense.default",
        "_to_copy.default",
        "_unique2.default",
        "all.default",
        "all.dim",
        "any.default",
        "any.dim",
        "as_strided_scatter.default",
        "block_diag.default",
        "cat.default",
        "constant_pad_nd.default",
        "copy_.default",
        "cumprod.default",
        "cumsum.default",
        "diag_embed.default",
        "diagonal_scatter.default",
        "embedding.default",
        "equal.default",
        "fill.Scalar",
        "fill_.Scalar",
        "full_like.default",
        "index.Tensor",
        "index_select.default",
        "ldexp.Tensor",
        "linspace.Scalar_Tensor",
        "linspace.Tensor_Scalar",
        "linspace.Tensor_Tensor",
        "logspace.Scalar_Tensor",
        "logspace.Tensor_Scalar",
        "logspace.Tensor_Tensor",
        "logsumexp.default",
        "nansum.default",
        "narrow_copy.default",
        "new_full.default",
        "new_ones.default",
        "new_zeros.default",
        "nonzero_static.default",
        "ones_like.default",
        "prod.default",
        "prod.dim_int",
        "randint_like.default",
        "randint_like.low_dtype",
        "repeat.default",
        "roll.default",
        "select_scatter.default",
        "slice_scatter.default",
        "sort.default",
        "sort.stable",
        "stack.default",
        "sum.default",
        "sum.dim_IntList",
        "unfold.default",
        "unique_consecutive.default",
        "zero_.default",
        "zeros_like.default",
    }
)

#: Overloads whose ``dtype=`` may be unsigned (factories and conversions; ``arange``,
#: ``linspace`` and reductions into an unsigned dtype are refused by CPU).
FACTORIES = frozenset(
    {
        "_to_copy.default",
        "empty.memory_format",
        "empty_strided.default",
        "full.default",
        "full_like.default",
        "new_full.default",
        "new_ones.default",
        "new_zeros.default",
        "ones.default",
        "ones_like.default",
        "randint.default",
        "randint.generator",
        "randint.low",
        "randint.low_generator",
        "randint_like.default",
        "randint_like.low_dtype",
        "scalar_tensor.default",
        "zeros.default",
        "zeros_like.default",
    }
)


def _refusal(name: str, dtype) -> NotImplementedError:
    return NotImplementedError(f"\"{name}\" not implemented for '{type_name(dtype)}'")


def guard(op: torch._ops.OpOverload, tensor_pos, list_pos, dtype_pos, promotes: bool) -> Callable | None:
    """A check ``(values, types)`` of one call raising CPU's NotImplementedError where this op
    would run on an unsigned dtype CPU's kernel lacks; None when the op needs none."""
    name = str(op).removeprefix("aten.")
    dtype_pos = () if name in FACTORIES else tuple(dtype_pos)
    if promotes:
        if name in OPS:
            return None

        def check_promoted(values, types):
            if types.compute in _UNSIGNED_JAX:
                raise _refusal(name, types.compute)

        return check_promoted
    tensor_pos = () if name in OPS else tuple(tensor_pos)
    list_pos = () if name in OPS else tuple(list_pos)
    if not (tensor_pos or list_pos or dtype_pos):
        return None

    def check(values, types):
        for i in dtype_pos:
            if values[i] in UNSIGNED:
                raise _refusal(name, values[i])
        for i in tensor_pos:
            if isinstance(values[i], torch.Tensor) and values[i].dtype in UNSIGNED:
                raise _refusal(name, values[i].dtype)
        for i in list_pos:
            for t in values[i] or ():
                if isinstance(t, torch.Tensor) and t.dtype in UNSIGNED:
                    raise _refusal(name, t.dtype)

    return check
