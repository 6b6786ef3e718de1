"""Dtypes CPU's kernels refuse, refused by tpu alike with CPU's ``NotImplementedError``.

Two tables, both found by running OpInfo samples through torch CPU and recording, per ATen
overload, which dtypes ran and which its kernel refused (``"abs_cpu" not implemented for
'Bool'``):

* ``REFUSED`` (generated: ``python -m torch_tpu.ops --regenerate-cpu-dtypes`` rewrites
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

import collections
import itertools
import pathlib
import re
import warnings
from collections.abc import Callable

import torch

from ..runtime.dtypes import _SCALAR_TYPE_NAMES, TORCH_TO_JAX, to_jax, to_torch, type_name
from ._cpu_refusals import REFUSED
from .registry import Promote

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
    checks = [
        table_guard(op, names, operand_pos, common_dtype),
        _unsigned_guard(op, tensor_pos, list_pos, dtype_pos, operand_pos if common_dtype else None),
    ]
    checks = [c for c in checks if c is not None]
    if len(checks) < 2:
        return checks[0] if checks else None
    first, second = checks

    def both(values, types):
        consulted = first(values, types)
        return second(values, types) or consulted

    both.types_only = getattr(first, "types_only", False) and getattr(second, "types_only", False)
    return both


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


def _unsigned_guard(op, tensor_pos, list_pos, dtype_pos, operand_pos) -> Callable | None:
    name = str(op).removeprefix("aten.")
    dtype_pos = () if name in FACTORIES else tuple(dtype_pos)
    if operand_pos is not None:
        if name in OPS:
            return None

        def check_promoted(values, types):
            if types.compute in _UNSIGNED_JAX:
                raise _refusal(op, types.compute, operand_pos)

        check_promoted.types_only = True  # (its verdict holds for every call with these types)
        return check_promoted
    tensor_pos = () if name in OPS else tuple(tensor_pos)
    list_pos = () if name in OPS else tuple(list_pos)
    if not (tensor_pos or list_pos or dtype_pos):
        return None

    def check(values, types):
        for i in dtype_pos:
            if values[i] in UNSIGNED:
                raise _refusal(op, values[i], (i,))
        for i in tensor_pos:
            if isinstance(values[i], torch.Tensor) and values[i].dtype in UNSIGNED:
                raise _refusal(op, values[i].dtype, (i,))
        for i in list_pos:
            for t in values[i] or ():
                if isinstance(t, torch.Tensor) and t.dtype in UNSIGNED:
                    raise _refusal(op, t.dtype, (i,))

    return check


# ----------------------------------------------------------------------------- the probe
#: The dtypes the probe tries: every tpu dtype but the unsigned ones (their own lists above).
PROBED = tuple(d for d in TORCH_TO_JAX if d not in UNSIGNED)
_REFUSAL = re.compile(r"not implemented for '(\w+)'")
_COMPLEX_REFUSAL = re.compile(r"not (implemented for|supported for|intended to support) complex")
_BY_TYPE_NAME = {n: d for d, n in _SCALAR_TYPE_NAMES.items()}


def probe(samples_per_dtype: int = 10) -> dict[str, dict[str, str]]:
    """``REFUSED`` as torch CPU has it now: every OpInfo's samples for each dtype its OpInfo
    does not list as supported (and one for each it does), run on CPU under a dispatch mode
    that records, per tpu-lowered overload and argument, the dtypes its kernel refused and
    those it ran. A dtype that both ran and was refused is refused where other arguments have
    the features (``_features``: a value, given or not, empty or not) every refused call had
    and no call that ran had (scatter_reduce's ``mean``, clamp with both bounds), else left out.
    A call with a ``dtype=`` runs in that dtype, so a refusal of it is keyed by ``dtype``."""
    from torch._prims_common import elementwise_dtypes
    from torch.testing._internal import common_methods_invocations as opinfos
    from torch.utils._python_dispatch import TorchDispatchMode

    from . import dispatch
    from .registry import LOWERINGS

    # (overload, argument) -> dtype -> per call, its bool/string arguments {(position, name, value)}
    refused = collections.defaultdict(lambda: collections.defaultdict(list))
    ran = collections.defaultdict(lambda: collections.defaultdict(list))

    # an empty call teaches only refusals: a lowering need not take every empty input CPU runs
    refusals_only = False

    def record(func, args, kwargs, error):
        entry = LOWERINGS.get(func)
        if entry is None or (error is None and refusals_only):
            return
        binder = dispatch._Binder(func._schema)
        values = dict(zip(binder.names, binder.bind(args, kwargs)))
        tensors = {
            n: [t for t in (v if isinstance(v, (list, tuple)) else (v,)) if isinstance(t, torch.Tensor)]
            for n, v in values.items()
        }
        # first a ``dtype=``, which the kernel runs in (cumsum's refuses bool, cumsum of bool runs)
        found = {n: {values[n]} for n, k in zip(binder.names, binder.kinds) if k == dispatch._DTYPE}
        if entry.promote is not None:
            kinds = (dispatch._TENSOR, dispatch._SCALAR)
            names = entry.promote_args or [n for n, k in zip(binder.names, binder.kinds) if k in kinds]
            promoted = [
                values[n] for n in names if isinstance(values[n], (torch.Tensor, int, float, complex, bool))
            ]
            found["*"] = {elementwise_dtypes(*promoted, type_promotion_kind=Promote.DEFAULT)[1]}
        # else (or where CPU's kernel ignores a number operand, lerp's weight): by argument
        for n, ts in tensors.items():
            found.setdefault(n, set()).update(t.dtype for t in ts)
        conditions = frozenset(
            (i, n, feature)
            for i, (n, v, a) in enumerate(zip(binder.names, values.values(), func._schema.arguments))
            if str(a.real_type) in ("bool", "str", "Tensor") or str(a.real_type).startswith("Optional[")
            for feature in _features(v)
        )
        key = str(func).removeprefix("aten.")
        if error is None:
            for n, dtypes in found.items():
                for dtype in dtypes:
                    ran[key, n][dtype].append(conditions)
            return
        dtype = _BY_TYPE_NAME[error]
        arg = next((n for n, dtypes in found.items() if dtype in dtypes), None)
        if arg is not None:
            refused[key, arg][dtype].append(conditions)

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            try:
                out = func(*args, **kwargs)
            except NotImplementedError as e:
                match = _REFUSAL.search(str(e))
                if match and match.group(1) in _BY_TYPE_NAME:
                    record(func, args, kwargs, match.group(1))
                elif _COMPLEX_REFUSAL.search(str(e)):  # "ceil is not supported for complex inputs"
                    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
                    dtype = next(t.dtype for t in leaves if isinstance(t, torch.Tensor) and t.is_complex())
                    record(func, args, kwargs, type_name(dtype))
                raise
            record(func, args, kwargs, None)
            return out

    def run(fn, *args, **kwargs):
        with warnings.catch_warnings(), Recorder():
            warnings.simplefilter("ignore")
            try:
                fn(*args, **kwargs)
            except Exception:  # noqa: BLE001, S110  (recorded by the mode, or not a refusal)
                pass

    foreach_dbs = ("unary", "binary", "pointwise", "reduce", "other")  # (the _foreach_* ops')
    infos = [*opinfos.op_db, *(i for db in foreach_dbs for i in getattr(opinfos, f"foreach_{db}_op_db"))]
    for info in infos:
        supported = set(info.supported_dtypes("cpu"))
        for dtype in PROBED:
            # supported dtypes: a sample, for what runs (a refusal that depends on another
            # argument, scatter_reduce's reduction, must not refuse them all)
            count = 1 if dtype in supported else samples_per_dtype
            try:
                samples = list(itertools.islice(info.sample_inputs("cpu", dtype), count))
            except Exception:  # noqa: BLE001  (OpInfos that cannot make samples of this dtype)
                continue
            for s in samples:
                run(info.op, s.input, *s.args, **s.kwargs)
    # every overload taking only tensors and numbers, or lists of them (those it needs, then
    # every leading one it takes), called with (2, 2) tensors of each dtype and numbers of the
    # tensors' kind and 1, a list holding one: the overloads OpInfo reaches through another name
    # (``<<``, ``Scalar`` variants, clamp, the foreach ``Scalar`` ones); and with empty tensors,
    # which tell a refusal of any call (clamp of bool with two bounds) from one of calls with
    # elements
    simple = {dispatch._TENSOR, dispatch._SCALAR, dispatch._TENSOR_LIST, dispatch._SCALAR_LIST}

    def argument(kind, tensor, number):
        one = tensor.clone() if kind in (dispatch._TENSOR, dispatch._TENSOR_LIST) else number
        return [one] if kind in (dispatch._TENSOR_LIST, dispatch._SCALAR_LIST) else one

    for op in LOWERINGS:
        needed = [dispatch._kind(a) for a in op._schema.arguments if not a.has_default_value()]
        if not needed or not set(needed) <= simple:
            continue
        leading = itertools.takewhile(lambda a: not a.kwarg_only, op._schema.arguments)
        every = list(itertools.takewhile(lambda k: k in simple, map(dispatch._kind, leading)))
        for kinds in {tuple(needed), tuple(every)}:
            for dtype in PROBED:
                base = torch.tensor([[1, 0], [3, 1]]).to(dtype)
                empty = () if str(op).removeprefix("aten.") in _CRASH_WHEN_EMPTY else (base[:0, :0],)
                for number in (base[0, 0].item(), 1):
                    for tensor in (base, *empty):
                        refusals_only = tensor is not base
                        run(op, *[argument(k, tensor, number) for k in kinds])
                refusals_only = False
    table = collections.defaultdict(dict)
    for (key, arg), by_dtype in sorted(refused.items()):
        by_condition = collections.defaultdict(set)
        for dtype, calls in by_dtype.items():
            condition = _condition(calls, ran[key, arg].get(dtype, ()))
            if condition is not None:
                spelled = ",".join(f"{name}={value}" for _, name, value in condition)
                by_condition[f"{arg}[{spelled}]" if spelled else arg].add(dtype)
        for spelled, dtypes in by_condition.items():
            table[key][spelled] = " ".join(str(d).removeprefix("torch.") for d in PROBED if d in dtypes)
    return dict(table)


#: Overloads (named as the table names them) whose CPU kernel kills the process on empty inputs
#: of some dtypes (a division by zero: SIGFPE), left out of the probe's empty calls.
_CRASH_WHEN_EMPTY = {"_weight_norm_interface.default"}


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


def _condition(refused_calls, ran_calls) -> tuple | None:
    """The fewest (none, one, two) features every refused call has and no call that ran has
    all of: ``((position, name, value), ...)`` in schema order; None when there are none."""
    shared = sorted(frozenset.intersection(*refused_calls))
    for size in range(3):
        for features in itertools.combinations(shared, size):
            if not any(set(features) <= ran for ran in ran_calls):
                return features
    return None


def regenerate() -> None:
    """Rewrite ``_cpu_refusals.py`` from ``probe()``."""

    def entry(key, by_arg):  # one line, or one per argument where too long (ruff's format)
        inner = ", ".join(f'"{a}": "{d}"' for a, d in by_arg.items())
        line = f'    "{key}": {{{inner}}},'
        if len(line) <= 110:
            return [line]
        return [f'    "{key}": {{', *(f'        "{a}": "{d}",' for a, d in by_arg.items()), "    },"]

    lines = [
        f'"""Generated by ``python -m torch_tpu.ops --regenerate-cpu-dtypes`` (torch {torch.__version__}):',
        "per tpu-lowered ATen overload, the dtypes CPU's kernel refuses, by argument (``*``: the",
        "common dtype of an elementwise op's operands; ``[name=feature,...]``: only where those",
        'arguments have those ``cpu_dtypes._features``). Do not edit: rerun the probe."""',
        "",
        "REFUSED = {",
    ]
    for key, by_arg in sorted(probe().items()):
        lines += entry(key, by_arg)
    lines.append("}")
    path = pathlib.Path(__file__).with_name("_cpu_refusals.py")
    path.write_text("\n".join(lines) + "\n")
