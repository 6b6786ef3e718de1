"""Regenerate ``src/torch_tpu/ops/_cpu_refusals.py``: the dtypes torch CPU's kernels refuse, per
tpu-lowered ATen overload, found by running PyTorch's OpInfo samples on CPU.

A developer tool, outside the runtime package: rerun it when the pinned torch changes.
``python tools/regenerate_cpu_refusals.py`` rewrites the table in place (a few minutes);
``ops.cpu_dtypes`` reads it at run time.
"""

from __future__ import annotations

import collections
import itertools
import pathlib
import re
import warnings

import torch

import torch_tpu  # noqa: F401  (registers the device)
from torch_tpu.ops import cpu_dtypes
from torch_tpu.ops.cpu_dtypes import UNSIGNED, _features
from torch_tpu.ops.dispatch import binding
from torch_tpu.ops.registry import LOWERINGS, Promote
from torch_tpu.runtime.dtypes import _SCALAR_TYPE_NAMES, TORCH_TO_JAX, type_name

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

    # (overload, argument) -> dtype -> per call, its bool/string arguments {(position, name, value)}
    refused = collections.defaultdict(lambda: collections.defaultdict(list))
    ran = collections.defaultdict(lambda: collections.defaultdict(list))

    # an empty call teaches only refusals: a lowering need not take every empty input CPU runs
    refusals_only = False

    def record(func, args, kwargs, error):
        entry = LOWERINGS.get(func)
        if entry is None or (error is None and refusals_only):
            return
        binder = binding.Binder(func._schema)
        values = dict(zip(binder.names, binder.bind(args, kwargs)))
        tensors = {
            n: [t for t in (v if isinstance(v, (list, tuple)) else (v,)) if isinstance(t, torch.Tensor)]
            for n, v in values.items()
        }
        # first a ``dtype=``, which the kernel runs in (cumsum's refuses bool, cumsum of bool runs)
        found = {n: {values[n]} for n, k in zip(binder.names, binder.kinds) if k == binding.DTYPE}
        if entry.promote is not None:
            kinds = (binding.TENSOR, binding.SCALAR)
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
    simple = {binding.TENSOR, binding.SCALAR, binding.TENSOR_LIST, binding.SCALAR_LIST}

    def argument(kind, tensor, number):
        one = tensor.clone() if kind in (binding.TENSOR, binding.TENSOR_LIST) else number
        return [one] if kind in (binding.TENSOR_LIST, binding.SCALAR_LIST) else one

    for op in LOWERINGS:
        needed = [binding.kind_of(a) for a in op._schema.arguments if not a.has_default_value()]
        if not needed or not set(needed) <= simple:
            continue
        leading = itertools.takewhile(lambda a: not a.kwarg_only, op._schema.arguments)
        every = list(itertools.takewhile(lambda k: k in simple, map(binding.kind_of, leading)))
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
        f'"""Generated by ``python tools/regenerate_cpu_refusals.py`` (torch {torch.__version__}):',
        "per tpu-lowered ATen overload, the dtypes CPU's kernel refuses, by argument (``*``: the",
        "common dtype of an elementwise op's operands; ``[name=feature,...]``: only where those",
        'arguments have those ``cpu_dtypes._features``). Do not edit: rerun the probe."""',
        "",
        "REFUSED = {",
    ]
    for key, by_arg in sorted(probe().items()):
        lines += entry(key, by_arg)
    lines.append("}")
    path = pathlib.Path(cpu_dtypes.__file__).with_name("_cpu_refusals.py")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    torch.tpu.init()  # fills the op table
    regenerate()
