"""Dtypes CPU's kernels refuse, refused by tpu alike with CPU's ``NotImplementedError``.

Two tables, both found by running OpInfo samples through torch CPU and recording, per ATen
overload, which dtypes ran and which its kernel refused (``"abs_cpu" not implemented for
'Bool'``):

* ``REFUSED`` (generated: ``python tools/regenerate_cpu_refusals.py`` rewrites
  ``_cpu_refusals.py``): for the ordinary dtypes, the few each overload's kernel lacks (``abs``
  on bool, ``logaddexp`` on integers, ``kthvalue`` on bool, ...), keyed by the argument whose
  dtype CPU dispatches on (``*``: the promoted compute dtype of an elementwise op; ``dtype``:
  the ``dtype=`` a kernel runs in), with the argument values the refusal hangs on
  (``self[reduce=mean]``: scatter_reduce's mean of bool). ``BEYOND_PROBE`` adds the few whose
  conditions the probe cannot spell (transposed or dilated integer convolutions).
* ``OPS``/``FACTORIES``: uint16/uint32/uint64, PyTorch's "barebones" unsigned dtypes, which CPU's
  kernels support only in a few ops (creation, copies, views, ``==``/``!=``, bitwise and/or/xor,
  ``*``, sorting, ...): the lists name the overloads that run them; the rest refuse them.

Only overloads with something to refuse get a check (``guard``), so the others pay nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import torch

from ..runtime.dtypes import FLOAT8, to_jax, to_torch, type_name
from ._cpu_refusals import REFUSED

#: Refusals of CPU's kernels that CUDA's kernels do not share and that code written for
#: accelerators relies on: tpu runs these dtypes as CUDA does (overload: dtypes, who relies on it).
CUDA_RUNS: dict[str, tuple[str, str]] = {
    "histc.default": (
        "uint8 int8 int16 int32 int64",
        "Transformers' MoE layers (Mixtral, Qwen3-MoE, DeepSeek-V3) count tokens per expert with "
        "an int32 histc on every device but CPU and MPS",
    ),
}

#: Refusals hanging on arguments the probe's features do not tell apart (overload: argument,
#: dtypes, where): CPU's slow kernels for transposed and for dilated convolutions lack the small
#: integer dtypes its plain one runs (an empty input skips them).
BEYOND_PROBE: dict[str, tuple[str, str, Callable[[dict], bool]]] = {
    "convolution.default": (
        "input",
        "uint8 int8 int16 int32",
        lambda a: (a["transposed"] or any(d != 1 for d in a["dilation"])) and a["input"].numel() > 0,
    ),
}

UNSIGNED = frozenset({torch.uint16, torch.uint32, torch.uint64})

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


#: Overloads whose CPU kernels take float8 tensors (PyTorch's float8 dtypes are barebones on CPU
#: too: creation, copies, views, comparisons, selection), each checked against CPU by
#: tests/test_float8.py. ``_scaled_mm`` is the float8 matmul; ``_scaled_grouped_mm`` the grouped
#: one, which only CUDA runs (tpu follows its meta kernel's checks).
FLOAT8_OPS = frozenset(
    {
        # elementwise, in the float8 dtype
        "abs.default",
        "eq.Scalar",
        "eq.Tensor",
        "isclose.default",
        "isnan.default",
        "ne.Scalar",
        "ne.Tensor",
        "where.self",
        # the others
        "_local_scalar_dense.default",
        "_scaled_grouped_mm.default",
        "_scaled_mm.default",
        "_to_copy.default",
        "cat.default",
        "clone.default",
        "constant_pad_nd.default",
        "copy_.default",
        "equal.default",
        "fill.Scalar",
        "fill_.Scalar",
        "flip.default",
        "full_like.default",
        "index.Tensor",
        "index_put.default",
        "index_put_.default",
        "index_select.default",
        "masked_select.default",
        "narrow_copy.default",
        "new_full.default",
        "new_ones.default",
        "new_zeros.default",
        "ones_like.default",
        "repeat.default",
        "roll.default",
        "select_scatter.default",
        "slice_scatter.default",
        "stack.default",
        "zero_.default",
        "zeros_like.default",
        # products in float32 rounded to float8 (saturating, as c10)
        "addmm.default",
        "mm.default",
        "mul.Tensor",
        "mul_.Tensor",
    }
)


def _float8_mul(values, dtype) -> NotImplementedError | None:
    """CPU multiplies float8 tensors but not by a single element (a number, a 0-dim or one-element
    tensor): its kernel sends those to a loop for the half types only."""
    other = values[1]
    if isinstance(other, torch.Tensor) and other.numel() != 1:
        return None
    return NotImplementedError(f"\"mul_cpu_reduced_float\" not implemented for '{type_name(dtype)}'")


def _float8_isclose(values, dtype) -> NotImplementedError | None:
    """CPU compares float8 tensors with zero tolerances only (``assert_close``'s for them): a
    tolerance multiplies ``other`` by a number, which its kernel does not."""
    given = [v for v in values[2:4] if v is not None]
    if all(v == 0 for v in (given + [1e-05, 1e-08][len(given) :])):
        return None
    return NotImplementedError(f"\"mul_cpu_reduced_float\" not implemented for '{type_name(dtype)}'")


FLOAT8_RULES = {"mul.Tensor": _float8_mul, "mul_.Tensor": _float8_mul, "isclose.default": _float8_isclose}
#: ``float8_e8m0fnu`` (MX scales): the float8 overloads but those CPU's kernels lack for it
E8M0_OPS = FLOAT8_OPS - {
    "abs.default",
    "addmm.default",
    "index_put.default",
    "index_put_.default",
    "mm.default",
}
FLOAT8_FACTORIES = frozenset(
    {
        "_scaled_mm.default",  # (its out_dtype)
        "_to_copy.default",
        "empty.memory_format",
        "empty_strided.default",
        "eye.default",
        "eye.m",
        "full.default",
        "full_like.default",
        "new_empty.default",
        "new_full.default",
        "new_ones.default",
        "new_zeros.default",
        "ones.default",
        "ones_like.default",
        "scalar_tensor.default",
        "zeros.default",
        "zeros_like.default",
    }
)


@dataclasses.dataclass(frozen=True)
class Barebones:
    """A family of dtypes CPU's kernels run in a few overloads only: the overloads that take
    them (``ops``; elementwise ones by the dtype they compute in) and those whose ``dtype=``
    may be one (``factories``); the rest refuse them with CPU's error."""

    dtypes: frozenset
    ops: frozenset
    factories: frozenset
    #: overloads of ``ops`` CPU runs only for some calls: ``rule(values, dtype)`` gives CPU's
    #: error for the others (None: the call runs)
    rules: Mapping[str, Callable] = dataclasses.field(default_factory=dict)

    @functools.cached_property
    def jax_dtypes(self) -> frozenset:
        return frozenset(to_jax(d) for d in self.dtypes)


def _refusal(op: torch._ops.OpOverload, dtype, positions) -> NotImplementedError:
    """CPU's error, carrying what the dispatcher needs to replay the call on meta tensors, those
    at ``positions`` as a dtype the kernel takes, for the argument checks CPU makes before its
    kernel (a meta decomposition's own errors for the refused dtype are not CPU's)."""
    name = op._schema.name.removeprefix("aten::")
    error = NotImplementedError(f"\"{name}\" not implemented for '{type_name(dtype)}'")
    refused = [
        d for spelled in REFUSED.get(str(op).removeprefix("aten."), {}).values() for d in spelled.split()
    ]
    stand_in = next(d for d in (torch.float32, torch.int64, torch.complex64) if str(d)[6:] not in refused)
    torch_dtype = dtype if isinstance(dtype, torch.dtype) else to_torch(dtype)
    error.stand_in = (frozenset(positions), torch_dtype, stand_in)
    return error


def _dtypes(spelled: str) -> frozenset:
    return frozenset(getattr(torch, d) for d in spelled.split())


def guard(
    op: torch._ops.OpOverload,
    names,
    tensor_pos,
    list_pos,
    dtype_pos,
    operand_pos=None,
    common_dtype: Callable | None = None,
) -> Callable | None:
    """A check ``(values, types)`` of one call raising CPU's NotImplementedError where CPU's
    kernel for this op lacks the dtype it would run on; None when the op needs none. The check
    returns whether its verdict hung on more than the dtypes of the call's tensors and dtype
    arguments and the promoted types (a condition on a value, as clamp's bounds): when it did
    not, every call of those dtypes passes too.
    ``common_dtype(values, types)``: for elementwise ops, the dtype CPU's TensorIterator
    dispatches on (the promotion of the operands at ``operand_pos``, before any integer-to-float
    step)."""
    checks = [table_guard(op, names, operand_pos, common_dtype)]
    for family in BAREBONES:
        checks.append(
            _barebones_guard(
                family, op, tensor_pos, list_pos, dtype_pos, operand_pos if common_dtype else None
            )
        )
    checks = [c for c in checks if c is not None]
    if len(checks) < 2:
        return checks[0] if checks else None

    def every(values, types):
        consulted = False
        for check in checks:
            consulted = check(values, types) or consulted
        return consulted

    every.types_only = all(getattr(c, "types_only", False) for c in checks)
    return every


def _ALWAYS(values) -> bool:
    return True


def table_guard(op, names, operand_pos=None, common_dtype=None) -> Callable | None:
    """The check of ``REFUSED`` and ``BEYOND_PROBE`` alone (runtime kernels': ``guard``)."""
    name = str(op).removeprefix("aten.")
    if name not in REFUSED and name not in BEYOND_PROBE:
        return None
    runs = _dtypes(CUDA_RUNS[name][0]) if name in CUDA_RUNS else frozenset()

    def applies_where(condition: str) -> Callable:
        # "reduce=mean,...": refused where those arguments have those features (``_features``)
        if not condition:
            return _ALWAYS
        features = [(names.index(n), v) for n, _, v in (f.partition("=") for f in condition.split(",") if f)]
        return lambda values: all(v in _features(values[j]) for j, v in features)

    def by_name(when: Callable) -> Callable:
        return lambda values: when(dict(zip(names, values)))

    spelled = [
        (*key.removesuffix("]").partition("[")[::2], dtypes) for key, dtypes in REFUSED.get(name, {}).items()
    ]
    entries = [(arg, dtypes, applies_where(condition)) for arg, condition, dtypes in spelled]
    if name in BEYOND_PROBE:
        arg, dtypes, when = BEYOND_PROBE[name]
        entries.append((arg, dtypes, by_name(when)))
    # (argument position or None for "*", dtypes, as JAX dtypes, where they are refused)
    entries = [
        (None if arg == "*" else names.index(arg), ds, frozenset(to_jax(d) for d in ds), applies)
        for arg, spelled_dtypes, applies in entries
        if (ds := _dtypes(spelled_dtypes) - runs)
    ]

    def check(values, types) -> bool:  # (the dtype first: the conditions cost more, and rarely matter)
        consulted = False  # whether a condition on more than dtypes let this call pass
        for i, dtypes, jax_dtypes, applies in entries:
            if i is None:
                common = common_dtype(values, types)
                if common in jax_dtypes:
                    if applies(values):
                        raise _refusal(op, common, operand_pos)
                    consulted = True
                continue
            value = values[i]
            for t in value if isinstance(value, (list, tuple)) else (value,):
                # a tensor's dtype, or the ``dtype=`` the kernel runs in (cumsum's)
                dtype = t.dtype if isinstance(t, torch.Tensor) else t
                if dtype in dtypes:
                    if applies(values):
                        raise _refusal(op, dtype, (i,))
                    consulted = True
        return consulted

    # its verdict holds for every call with these types (the dispatcher then checks once per
    # plan) when no entry hangs on a value and each reads an operand whose dtype is in the key
    check.types_only = name not in BEYOND_PROBE and all(
        applies is _ALWAYS and (i is None or (operand_pos is not None and i in operand_pos))
        for i, _, _, applies in entries
    )
    return check


def _barebones_guard(family: Barebones, op, tensor_pos, list_pos, dtype_pos, operand_pos) -> Callable | None:
    name = str(op).removeprefix("aten.")
    dtype_pos = () if name in family.factories else tuple(dtype_pos)
    if operand_pos is not None:
        rule = family.rules.get(name)
        if name in family.ops and rule is None:
            return None

        def check_promoted(values, types):
            if types.compute not in family.jax_dtypes:
                return False
            error = _refusal(op, types.compute, operand_pos) if rule is None else rule(values, types.compute)
            if error is not None:
                raise error
            return True

        check_promoted.types_only = rule is None  # (its verdict holds for every call with these types)
        return check_promoted
    tensor_pos = () if name in family.ops else tuple(tensor_pos)
    list_pos = () if name in family.ops else tuple(list_pos)
    if not (tensor_pos or list_pos or dtype_pos):
        return None
    dtypes = family.dtypes

    def check(values, types):
        for i in dtype_pos:
            if values[i] in dtypes:
                raise _refusal(op, values[i], (i,))
        for i in tensor_pos:
            if isinstance(values[i], torch.Tensor) and values[i].dtype in dtypes:
                raise _refusal(op, values[i].dtype, (i,))
        for i in list_pos:
            for t in values[i] or ():
                if isinstance(t, torch.Tensor) and t.dtype in dtypes:
                    raise _refusal(op, t.dtype, (i,))

    return check


BAREBONES = (
    Barebones(UNSIGNED, OPS, FACTORIES),
    Barebones(FLOAT8 - {torch.float8_e8m0fnu}, FLOAT8_OPS, FLOAT8_FACTORIES, FLOAT8_RULES),
    Barebones(frozenset({torch.float8_e8m0fnu}), E8M0_OPS, FLOAT8_FACTORIES, FLOAT8_RULES),
)


# ----------------------------------------------------------------------------- features
def _features(value) -> set[str]:
    """What a refusal may hang on besides a dtype: a bool's or string's value, whether an
    optional argument is given (clamp refuses bool with both bounds, runs it with one), whether
    a tensor has elements (kernels return on empty ones before any dtype check) and more than
    one (kthvalue copies a single one)."""
    if isinstance(value, (bool, str)):
        return {str(value)}
    if value is None:
        return {"None"}
    numel = value.numel() if isinstance(value, torch.Tensor) else 1
    return {"given"} | ({"filled"} if numel else set()) | ({"many"} if numel > 1 else set())
