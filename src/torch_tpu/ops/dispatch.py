"""Installs the op table on the PrivateUse1 ("tpu") dispatch key.

For each functional lowering this module builds one kernel that binds the schema's arguments,
reads tpu tensors as JAX arrays, computes promoted dtypes, calls the (jitted) lowering and wraps
the results. In-place and ``out=`` overloads are derived from the same lowering by matching
schemas. Ops with no lowering reach a boxed fallback that raises ``NotImplementedError`` (or, when
opted in with ``TORCH_TPU_CPU_FALLBACK=1``, runs them on CPU and counts it).
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import config
from ..execution.tracing import NEEDS_VALUES
from ..runtime import (
    buffer,
    checks,
    memory,
    native,
    overlap,
    padding,
    platform,
    precision,
    random,
    tensor,
    transfer,
)
from ..runtime.buffer import Deferred, Padded
from ..runtime.context import context
from ..runtime.dtypes import (
    JAX_TO_TORCH,
    UnsupportedDtypeError,
    check_scalar,
    sure_fits,
    to_jax,
    type_name,
)
from . import cpu_dtypes, layout
from . import padding as padding_rules
from ._helpers import warn
from .meta import NEEDS_VALUES_MESSAGES, to_meta
from .promotion import elementwise_dtypes
from .registry import LOWERINGS, Layout, Lowering, OutDtype, Promote, Runs, Types, qualified_name

aten = torch.ops.aten

#: ATen overloads that ran on CPU through the opt-in fallback, with counts.
cpu_fallback_counts: collections.Counter = collections.Counter()
#: Overloads the dispatcher derived (in-place / out=) -> the functional lowering they use.
DERIVED: dict[torch._ops.OpOverload, torch._ops.OpOverload] = {}

#: When a set, every kernel call adds its ATen overload (tests check every lowering is reached).
recorded_ops: set | None = None


#: The ``native`` lowerings whose PrivateUse1 kernel is the C++ runtime core's (the views),
#: filled by :func:`install`; their Python kernels serve where the core lacks them.
SERVED_BY_THE_CORE: set = set()


def record_ops(enabled: bool = True) -> set:
    """Start recording which ATen overloads reach a tpu kernel; returns the live set."""
    global recorded_ops
    recorded_ops = set() if enabled else None
    return recorded_ops if recorded_ops is not None else set()


_TENSOR, _TENSOR_LIST, _INDICES, _SCALAR, _SCALAR_LIST, _STATIC, _DTYPE, _GENERATOR, _HOST_SCALARS = range(9)
_NO_DEFAULT = object()


def _kind(arg: torch._C.Argument) -> int:
    text = str(arg.real_type)  # .type spells ScalarType as "int"
    if text == "Tensor" and arg.name == "scalars":  # _foreach_*.Tensor's, one number per tensor
        return _HOST_SCALARS
    if text in ("Tensor", "Optional[Tensor]"):
        return _TENSOR
    if text == "List[Tensor]":
        return _TENSOR_LIST
    if text == "List[Optional[Tensor]]":  # the indices of index / index_put
        return _INDICES
    if text in ("number", "Optional[number]"):
        return _SCALAR
    if text == "List[number]":  # the per-tensor scalars of _foreach ops
        return _SCALAR_LIST
    if text in ("ScalarType", "Optional[ScalarType]"):
        return _DTYPE
    if text == "Optional[Generator]":
        return _GENERATOR
    return _STATIC


def _is_written(arg: torch._C.Argument) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def _is_out(arg: torch._C.Argument) -> bool:
    return arg.kwarg_only and _is_written(arg)


def _device_mismatch(t: torch.Tensor, index: int = 0) -> RuntimeError:
    return platform.mixed_devices(f"tpu:{index}", t.device)


def _mixed_devices(args: tuple, kwargs: dict) -> RuntimeError | None:
    """The device error for a call whose tensors JAX found on two devices (None if they are not:
    then the error was not the caller's)."""
    devices = []
    for x in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(x, torch.Tensor) and not x.is_cpu and x.device not in devices:
            devices.append(x.device)
    return platform.mixed_devices(*devices[:2]) if len(devices) > 1 else None


def _op_index(values: list, positions: list[int]) -> int:
    """The tpu index an op runs on: its first tpu tensor's (another device's tensors are then
    refused by JAX), else the factory's (``context.index``)."""
    for i in positions:
        x = values[i]
        for t in x if type(x) in (list, tuple) else (x,):
            if isinstance(t, torch.Tensor) and not t.is_cpu:
                return max(t.get_device(), 0)
    return context.index


_COMPLEX = (torch.complex64, torch.complex128)


def _to_jax_arg(x: Any, index: int = 0) -> Any:
    """A tensor argument of an op on ``tpu:index`` as an array."""
    value = tensor.whole_value(x)  # (the common case in one call)
    if value is not None:
        return value
    if not isinstance(x, torch.Tensor):  # None, or a number PyTorch unwrapped from a wrapped number
        return None if x is None else _number(x, index)  # a runtime value: ``x + step`` compiles once
    if x.is_cpu:
        if x.dim() == 0:  # a CPU scalar tensor may join a device op, as on CUDA (read on the host:
            return x.item()  # some ops take only such a number, ``randint_like``'s ``high``)
        raise _device_mismatch(x, index)
    if x.is_meta:  # (is_cpu/is_meta are cheap flags; reading .device builds an object)
        raise _device_mismatch(x, index)
    if x.dtype in _COMPLEX:  # only complex views carry lazy conjugate/negative bits
        return tensor.read_resolved(x)
    return tensor.read(x)


def _to_program_arg(x: Any, index: int = 0) -> Any:
    """:func:`_to_jax_arg`, a view perhaps left for the op's program to read
    (``tensor.read_in_program``)."""
    value = tensor.whole_value(x)
    if value is not None:
        return value
    if isinstance(x, torch.Tensor) and not (x.is_cpu or x.is_meta) and x.dtype not in _COMPLEX:
        return tensor.read_in_program(x)
    return _to_jax_arg(x, index)


def _to_program_args(xs: list, index: int = 0) -> list:
    return [_to_program_arg(x, index) for x in xs]


def _host_scalars(x: Any, index: int = 0) -> list:
    """The ``scalars`` tensor of a ``_foreach_*.Tensor`` op, read on the host as CUDA does: it
    must be a CPU tensor; a device one is refused with CUDA's error."""
    if isinstance(x, torch.Tensor) and not x.is_cpu:
        raise RuntimeError(f"Expected scalars to be on CPU, got {x.device} instead.")
    return _scalars(x.tolist() if x.dim() else [x.item()], index)


def _index_to_jax(x: Any, index: int = 0) -> Any:
    """Index tensors may live on the host, as on CUDA (``x[torch.tensor([0, 2])]``)."""
    if isinstance(x, torch.Tensor) and x.is_cpu:
        return transfer.to_device(x, index)
    return _to_jax_arg(x, index)


def _indices_to_jax(xs: list, index: int = 0) -> list:
    """``Tensor?[] indices`` (``index``, ``index_put``): each index as :func:`_index_to_jax`
    makes it, None kept."""
    return [_index_to_jax(x, index) for x in xs]


#: A Python number as the program's input: its cached device scalar (the same function, so that
#: a number's conversion, the core's too, is one Python frame)
_number = transfer.device_scalar


class _FittedNumber:
    """:func:`_number` for a Scalar argument CPU converts into ``dtype`` with its overflow check
    (``Lowering.fitted``), for a kept plan: PyTorch's error for a number ``dtype`` cannot hold,
    which sends the call to the general path (it refuses in CPU's order: the op's check, the
    numbers' kinds, then this)."""

    __slots__ = ("dtype", "int_low", "int_high", "float_low", "float_high")

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.int_low, self.int_high, self.float_low, self.float_high = sure_fits(dtype)

    def __call__(self, x: bool | int | float | complex, index: int = 0) -> Any:
        kind = type(x)  # (a number within the sure bounds, the common case, is tested here)
        if kind is float:
            fits = self.float_low <= x <= self.float_high
        elif kind is int:
            fits = self.int_low <= x <= self.int_high
        else:
            fits = kind is bool
        if not fits:
            check_scalar(x, self.dtype, 2)  # (2 elements: not a fill of one, which skips half's test)
        return transfer.device_scalar(x, index)


_HALF_PRECISION = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
_FLOAT32 = np.dtype(jnp.float32)


def fitted_dtype(result: np.dtype, in_opmath: bool) -> np.dtype:
    """The dtype CPU converts a fitted Scalar argument into (``Lowering.fitted``) for an op whose
    result is ``result``: its ``scalar_t``, or with ``in_opmath`` float32 for a half-precision one."""
    return _FLOAT32 if in_opmath and result in _HALF_PRECISION else result


@functools.cache
def _fitted_number(result: np.dtype, in_opmath: bool) -> _FittedNumber:
    """The :class:`_FittedNumber` of an argument of an op whose result is ``result``."""
    return _FittedNumber(fitted_dtype(result, in_opmath))


def _scalar(x: Any, index: int = 0) -> Any:
    """A ``Scalar`` argument: a tensor's value, or a Python number as a device scalar."""
    if isinstance(x, torch.Tensor):
        return _to_jax_arg(x, index)
    if x is None or isinstance(x, jax.Array):
        return x
    return _number(x, index)


def _scalars(xs: Any, index: int = 0) -> Any:
    return [_scalar(x, index) for x in xs]


_NUMBERS = (bool, int, float, complex)
#: A fast-path key no plan can serve (its list or dtype arguments are beyond the key): whether
#: one can is decided by the key alone, so it is asked once
_NO_PLAN = (None, None, None, ())
_NUMBER_CONVERTERS = (_to_jax_arg, _to_program_arg, _scalar)


def _static(x: Any) -> Any:
    return tuple(x) if isinstance(x, list) else x


def _static_arg(x: Any, index: int = 0) -> Any:
    return _static(x)


class ExactStatic:
    """A float static argument that JAX's jit cache would merge with another, as it keys static
    arguments by ``==`` and hash: -0.0 (equal to 0.0, so the program traced for one would serve
    the other and lose the sign) and NaN (unequal to itself: a new program at every call). It is
    keyed by its ``repr``; the lowering's trace sees the float again (:func:`_plain_static`)."""

    __slots__ = ("value",)

    def __init__(self, value: float):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is ExactStatic and repr(other.value) == repr(self.value)

    def __hash__(self) -> int:
        return hash(repr(self.value))

    def __repr__(self) -> str:
        return repr(self.value)


def _exact_static(x: Any, index: int = 0) -> Any:
    """A float-typed static argument as :func:`_static` makes it, a float JAX would merge with
    another made an :class:`ExactStatic` (an item of a list too)."""
    kind = type(x)
    if kind is float:
        return x if x == x and (x or math.copysign(1.0, x) > 0) else ExactStatic(x)
    if kind is list or kind is tuple:
        return tuple(map(_exact_static, x))
    return x


def _plain_static(x: Any) -> Any:
    """What :func:`_exact_static` was given (read in the lowering's trace)."""
    kind = type(x)
    if kind is ExactStatic:
        return x.value
    return tuple(map(_plain_static, x)) if kind is tuple else x


def _holds_floats(arg: torch._C.Argument) -> bool:
    """Whether a static argument of this schema type may be or hold a float."""
    text = str(arg.real_type)
    return "float" in text or "number" in text


#: How the C++ core converts an argument of a planned call (``PlannedKernel``): a static one as
#: :func:`_static` does (one :func:`_exact_static` would change is left to Python), a number as
#: :func:`_number` does (None where it equals its default; a rule's fourth item, a
#: :class:`_FittedNumber`, converts it instead), a view its op's program reads as
#: :func:`_to_program_arg` hands it to a fused graph's node (``tensor.read_in_program``; strict
#: eager reads such views apart: Python does), a list of indices as :func:`_indices_to_jax`
#: makes it where each is None or a whole tpu tensor (others: Python)
_NATIVE_STATIC, _NATIVE_NUMBER, _NATIVE_VIEW, _NATIVE_INDICES = 0, 1, 2, 3


def _native_rules(rules: tuple, args: tuple) -> tuple | None:
    """A fast plan's conversions (``(position, default, converter)``) of a call with ``args`` as
    the C++ core does them, ``(position, how, default)``; None where one is beyond it (a view
    read apart, a list of tensors). (A None stays None: the key tells that it is None.)"""
    native = []
    for i, default, convert in rules:
        if convert is _number:
            native.append((i, _NATIVE_NUMBER, default))
        elif type(convert) is _FittedNumber:  # (the core calls it instead of _number)
            native.append((i, _NATIVE_NUMBER, default, convert))
        elif (convert in (None, _static_arg, _exact_static) or args[i] is None) and default is _NO_DEFAULT:
            native.append((i, _NATIVE_STATIC, None))
        elif convert is _to_program_arg and isinstance(args[i], torch.Tensor):
            native.append((i, _NATIVE_VIEW, None))
        elif convert is _indices_to_jax and default is _NO_DEFAULT:
            native.append((i, _NATIVE_INDICES, None))
        else:
            return None
    return tuple(native)


def _check_generator(g) -> None:
    if g is not None and g.device.type != "tpu":
        raise RuntimeError(f"Expected a 'tpu' device type for generator but found '{g.device.type}'")


# ----------------------------------------------------------------------------- type promotion
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


# ----------------------------------------------------------------------------- kernels
#: Schema defaults spell a ScalarType as its enum ordinal (randperm's ``dtype=4`` is torch.long).
_SCALAR_TYPE_ORDINALS = {
    0: torch.uint8,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.int64,
    5: torch.float16,
    6: torch.float32,
    7: torch.float64,
    9: torch.complex64,
    10: torch.complex128,
    11: torch.bool,
    15: torch.bfloat16,
    27: torch.uint16,
    28: torch.uint32,
    29: torch.uint64,
}


def _default(arg: torch._C.Argument) -> Any:
    if not arg.has_default_value():
        return _NO_DEFAULT
    value = arg.default_value
    if _kind(arg) == _DTYPE and isinstance(value, int):
        return _SCALAR_TYPE_ORDINALS[value]
    return value


class _Binder:
    """Precomputed view of a schema: turns a Python-kernel call into schema-ordered values."""

    def __init__(self, schema: torch._C.FunctionSchema):
        args = [a for a in schema.arguments if not _is_out(a)]
        self.names = [a.name for a in args]
        self.defaults = [_default(a) for a in args]
        self.kinds = [_kind(a) for a in args]
        self.outs = [a.name for a in schema.arguments if _is_out(a)]

    def bind(self, args: tuple, kwargs: dict) -> list:
        values = list(args)
        if not kwargs:  # (the common call: positional arguments, the rest defaulted)
            values += self.defaults[len(args) :]
            return values
        for name, default in zip(self.names[len(args) :], self.defaults[len(args) :]):
            values.append(kwargs[name] if name in kwargs else default)
        return values

    def positional(self, args: tuple, kwargs: dict) -> tuple:
        """The call as one tuple of its arguments up to the last one not at its default (a
        keyword-only one too): what the C++ core hands the fast path (``BoxedPlannedKernel``),
        so that ``x.add(y, alpha=2)`` keeps plans as ``x.add(y)`` does."""
        values = self.bind(args, kwargs)
        used = len(values)
        while used and _is_default(values[used - 1], self.defaults[used - 1]):
            used -= 1
        return tuple(values[:used])


def _is_default(value: Any, default: Any) -> bool:
    """Whether an argument is at its schema default as the dispatcher compares them (IValue
    equality: of the same type)."""
    return value is default or (type(value) is type(default) and value == default)


def _returns_shape(schema: torch._C.FunctionSchema) -> str:
    returns = schema.returns
    if len(returns) == 1:
        return "list" if str(returns[0].type) == "List[Tensor]" else "one"
    return "tuple"


class _Compute(NamedTuple):
    """A pure lowering's call (args, kwargs) -> its JAX outputs, and what serves it."""

    compute: Callable
    binder: _Binder
    #: key -> (program, converted defaults, default dtype, :func:`_native_rules`, whether one
    #: reads a view, the host rule, the op's check, whether the program is recorded while a
    #: graph records: a traced one; an eager one runs) of the calls the C++ core may serve
    #: (:func:`_planned`); None for an op it never serves
    native_plans: dict[int, tuple] | None
    #: the op's tensor positions read as views in its program (``whole_operands``'s bit mask)
    views_in_program: int


def _compute_fn(entry: Lowering) -> _Compute:
    """The call of a pure lowering (:class:`_Compute`)."""
    op = entry.op
    binder = _Binder(op._schema)
    # float/int arguments the lowering asks to receive as device scalars (a learning rate that
    # changes every step must not recompile)
    kinds = [_SCALAR if n in entry.dynamic else k for n, k in zip(binder.names, binder.kinds)]
    static_names = set(entry.static)
    static_pos = tuple(
        i
        for i, (k, n) in enumerate(zip(kinds, binder.names))
        if k in (_STATIC, _DTYPE) or (k == _SCALAR and n in static_names)
    )
    runs = entry.runs
    # keep_unused: an op's result lives on its inputs' device even when it ignores their values
    # (``zeros_like``), as XLA would otherwise place a program with no used inputs on tpu:0
    donate_pos = tuple(binder.names.index(n) for n in entry.donate)
    jit = (
        functools.partial(jax.jit, static_argnums=static_pos, donate_argnums=donate_pos, keep_unused=True)
        if runs is Runs.TRACED
        else (lambda f: f)
    )
    # Scalars left at their schema default (``alpha=1``) reach the lowering as a constant of
    # its program, not as a device scalar input: one input less to convert, pass and record
    defaulted = [
        (i, d)
        for i, (k, d) in enumerate(zip(kinds, binder.defaults))
        if k == _SCALAR and i not in static_pos and type(d) in (int, float) and d != 0
    ]
    if entry.check is not None or entry.runs is not Runs.TRACED:  # (a check sees the values)
        defaulted = []
    # float static arguments reach a jitted lowering as _exact_static makes them
    schema_args = [a for a in op._schema.arguments if not _is_out(a)]
    exact_pos = [i for i in static_pos if _holds_floats(schema_args[i])] if runs is Runs.TRACED else []
    readers = [(i, _or_default(d)) for i, d in defaulted] + [(i, _plain_static) for i in exact_pos]
    lowering = _reading_arguments(entry.fn, readers) if readers else entry.fn
    if entry.random and runs is Runs.TRACED:
        lowering = _keyed(lowering)
    # Tensor arguments that are views (alone or in a list) reach the op's program as their
    # storage's array and geometry, for the program to read (one program a call, one graph node
    # when fused); not where a check or a host computation sees the values (a list still does
    # where the check counts its tensors only), nor for donated buffers
    donated = {binder.names.index(n) for n in entry.donate}
    unchecked = entry.check is None
    read_in_program = {_TENSOR: unchecked, _TENSOR_LIST: unchecked or entry.check_lists_by_length}
    in_program = (
        [i for i, k in enumerate(kinds) if read_in_program.get(k) and i not in donated]
        if runs is Runs.TRACED
        else []
    )
    if in_program:
        lowering = tensor.reading_views(lowering, in_program)
    # (jitted at an op's first call, not here: most of the table never runs in a process)
    by_types: dict[Types | None, Callable] = {}

    def fn_for(types: Types | None) -> Callable:
        # one jitted function per promoted dtype pair: cheaper than a static keyword per call
        typed = by_types.get(types)
        if typed is None:
            typed = by_types[types] = jit(
                lowering if types is None else functools.partial(lowering, types=types)
            )
        return typed

    # (operand signature, default dtype) -> (Types, the function for them, whether the dtype
    # guard must run at every call: not when it depends on the promoted types alone)
    plans: dict[tuple, tuple[Types, Callable, bool]] = {}
    promote_pos = None
    if entry.promote is not None:
        names = entry.promote_args or [n for n, k in zip(binder.names, kinds) if k in (_TENSOR, _SCALAR)]
        unknown = set(names) - set(binder.names)
        if unknown:
            raise ValueError(f"{op}: promote_args {sorted(unknown)} are not schema arguments")
        promote_pos = [binder.names.index(n) for n in names]
    draws_key = entry.random
    check = entry.check
    # (Scalar ones only: a tensor overload's argument of the same name is not converted so)
    fitted_at = {  # position -> whether in opmath
        i: n in entry.fitted_in_opmath
        for i, n in enumerate(binder.names)
        if n in (*entry.fitted, *entry.fitted_in_opmath) and kinds[i] == _SCALAR
    }
    host_rule = entry.host
    # (what the C++ core calls where a planned call's operand has a host copy: operand_has_host_copy)
    core_host_rule = (
        None if host_rule is None else (functools.partial(_shadow, host_rule), buffer.host_copies_by_id)
    )
    traced, on_host = runs is Runs.TRACED, runs is Runs.HOST
    # (a check sees the op's arrays: an op with one reads its inputs unpadded)
    checks_padded = getattr(entry.pad, "check_fills", None) is not None
    # (an eager lowering only where it reads no padded element: traced, a rule's program runs it)
    servable = traced or entry.pad in (padding_rules.UNREAD, padding_rules.BY_LOWERING)
    pad_rule = entry.pad if servable and (entry.check is None or checks_padded) else None
    name = str(op)
    convert_by_kind = {  # (each takes the value and the tpu index of the op)
        _TENSOR: _to_jax_arg,
        _TENSOR_LIST: lambda xs, index: [_to_jax_arg(x, index) for x in xs],
        _INDICES: _indices_to_jax,
        _DTYPE: lambda d, index: None if d is None else to_jax(d),
        _STATIC: _static_arg,
        _SCALAR: _scalar,
        _SCALAR_LIST: _scalars,
        _HOST_SCALARS: _host_scalars,
    }
    program_by_kind = {_TENSOR: _to_program_arg, _TENSOR_LIST: _to_program_args}
    converters = [
        (i, program_by_kind[k] if i in in_program else convert_by_kind[k])
        for i, k in enumerate(kinds)
        if k in convert_by_kind and not (k == _SCALAR and i in static_pos) and i not in exact_pos
    ] + [(i, _exact_static) for i in exact_pos]
    generator_pos = [i for i, k in enumerate(kinds) if k == _GENERATOR]
    tensor_pos = [i for i, k in enumerate(kinds) if k in (_TENSOR, _TENSOR_LIST, _INDICES)]
    dtype_guard = (
        None
        if entry.custom
        else cpu_dtypes.guard(
            op,
            binder.names,
            tensor_pos=[i for i, k in enumerate(kinds) if k == _TENSOR],
            list_pos=[i for i, k in enumerate(kinds) if k == _TENSOR_LIST],
            dtype_pos=[i for i, k in enumerate(kinds) if k == _DTYPE],
            operand_pos=promote_pos,
            common_dtype=None if promote_pos is None else _common_dtype(entry.promote, promote_pos),
        )
    )

    guard_by_types = getattr(dtype_guard, "types_only", False)
    # The fast path: a call with positional arguments only reuses the program and the converted
    # defaults of the first call with the same key (per argument: a tensor's dtype, whether it
    # is 0-dim and whether it is its whole storage, that storage with axes permuted, or another
    # view; anything else's type; and the default dtype), skipping binding and promotion; of its
    # arguments only those the core did not read (views, numbers, static lists) are converted,
    # each as the general path converts it. The call then runs, is recorded or checked as any
    # call (an op whose lowering is Python, Runs.EAGER, runs it: the index ops decide per call
    # whether an index is a mask). Not for ops whose calls differ in more than that: a host
    # computation, a random key or generator, donated buffers
    whole_operands = tensor.whole_operands
    views_in_program = sum(1 << i for i in in_program if kinds[i] == _TENSOR)
    #: key -> (program, converted defaults, default dtype, (position, schema default, converter)
    #: of each argument converted at every call)
    fast_plans: dict[int, tuple[Callable, tuple, torch.dtype, tuple]] = {}
    # (a list of tensors or numbers, a dtype: the key does not tell their dtypes or values; an
    # op with such a required argument, ``cat``, the ``_foreach_*`` ops, never has a plan. A
    # list of indices is converted at every call: what its items are is the lowering's to see)
    beyond_key = {_TENSOR_LIST, _SCALAR_LIST, _HOST_SCALARS, _DTYPE}
    always_beyond_key = any(k in beyond_key and d is _NO_DEFAULT for k, d in zip(kinds, binder.defaults))
    fast = not on_host and not draws_key and not generator_pos and not entry.donate and not always_beyond_key
    default_at, converter_at = dict(defaulted), dict(converters)
    # the plans of calls whose every argument the core reads or converts (_native_rules), which
    # the C++ core serves before this kernel is reached (_planned), calling the op's check first
    # as this function does; not for an op that computes on the host
    native_plans: dict[int, tuple] | None = {} if fast and native.available() else None

    def conversions(args: tuple, operands: tuple, types: Types | None) -> tuple | None:
        """What the fast path converts of a call with the key of ``args`` (computing in
        ``types``): every argument ``whole_operands`` left as it is, as the general path
        converts it; None when the key does not decide all it depends on."""
        rules = []
        for i, (x, operand) in enumerate(zip(args, operands)):
            if operand is not x:
                continue  # (a whole tensor's value)
            if kinds[i] in beyond_key and x is not None:
                return None
            convert = converter_at.get(i)
            if type(x) in _NUMBERS and convert in _NUMBER_CONVERTERS:
                # (what each of them comes to for a number; a fitted one is checked too)
                checked = i in fitted_at and types is not None
                convert = _fitted_number(types.result, fitted_at[i]) if checked else _number
            rules.append((i, default_at.get(i, _NO_DEFAULT), convert))
        return tuple(rules)

    def plan_for(key: tuple, values: list, args: tuple, kwargs: dict) -> tuple[Types, Callable, bool]:
        types = promoted(entry.promote, key[0], key[1])
        if guard_by_types:  # vetted once, before the plan is kept (a refusal is never kept)
            _check_dtypes(dtype_guard, op, binder.names, values, types, args, kwargs)
        plan = plans[key] = (types, fn_for(types), dtype_guard is not None and not guard_by_types)
        return plan

    #: (program, memory orders) -> the program returning its outputs so transposed
    in_order: dict[tuple, Callable] = {}

    def in_memory_order(lowered: Callable, orders: tuple) -> Callable:
        program = in_order.get((lowered, orders))
        if program is None:
            program = in_order[(lowered, orders)] = jit(_transposing(lowered, orders))
        return program

    def compute(args: tuple, kwargs: dict, orders: tuple | None = None):
        """The op's result for these arguments; ``orders`` (``layout.MetaLayout.orders``): its
        outputs transposed into these memory orders by its program."""
        learn = plan = None  # (the fast path's key a plan is to be kept under; the kept plan)
        fitted = ()  # (a fitted argument's number and its dtype, of a call the general path takes)
        call = args if fast and not kwargs else binder.positional(args, kwargs) if fast else None
        if call is not None:
            operands = whole_operands(call, views_in_program)
            if operands is not None and not (platform.attention_needed or platform.others_used):
                plan = fast_plans.get(operands[0])
                if plan is None or plan[2] is not torch.get_default_dtype():
                    plan, learn = None, None if plan is _NO_PLAN else operands[0]
        ctx = context
        padded = pad_rule is not None and padding.live and ctx.trace is None
        index = 0  # (the tpu an op runs on: the general path finds it where others were used)
        ctx.op = name  # (named by a padded value its conversions read unpadded, too)
        if plan is not None:
            if recorded_ops is not None:
                recorded_ops.add(op)
            lowered, extra = plan[0], {}
            values = [*operands[1], *plan[1]]
            ctx.padding_reads = padded
            try:
                for i, default, convert in plan[3]:  # (as the general path's two loops below)
                    value = values[i]
                    if type(value) is type(default) and value == default:
                        values[i] = None
                    elif convert is not None and value is not None:
                        values[i] = convert(value, 0)
            except RuntimeError:  # (a fitted number refused: the general path refuses it in order)
                plan = None
            finally:
                ctx.padding_reads = False
        if plan is None:
            if platform.attention_needed:
                platform.attend()
            if recorded_ops is not None:
                recorded_ops.add(op)
            values = binder.bind(args, kwargs)
            extra = {}
            if promote_pos is not None:
                key = (operand_signature(values, promote_pos), torch.get_default_dtype())
                plan = plans.get(key)
                if plan is None:
                    plan = plan_for(key, values, args, kwargs)
                types, lowered, guard = plan
            else:
                types, lowered, guard = None, by_types.get(None) or fn_for(None), dtype_guard is not None
            if guard and _check_dtypes(dtype_guard, op, binder.names, values, types, args, kwargs):
                learn = None  # (its verdict holds for these values only)
            index = _op_index(values, tensor_pos) if platform.others_used else 0
            generator = None
            for i in generator_pos:
                _check_generator(values[i])
                generator, values[i] = values[i], None
            if draws_key:
                extra["key"] = random.next_key(generator, index)
            for i, default in defaulted:
                value = values[i]
                if type(value) is type(default) and value == default:
                    values[i] = None  # (what ``_or_default`` puts back, in the trace)
            if fitted_at and types is not None:  # (checked once the lowering took their kinds)
                fitted = [(values[i], fitted_dtype(types.result, opmath)) for i, opmath in fitted_at.items()]
            ctx.padding_reads = padded
            try:
                for i, convert in converters:
                    value = values[i]
                    if value is not None:  # (None converts to None)
                        values[i] = convert(value, index)
            finally:
                ctx.padding_reads = False
        ctx.op = name  # named by the errors of checks reported later
        if on_host:  # the graphs computing the inputs run, and their checks report, first
            values = [_for_host(v) for v in values]
        program = lowered if orders is None else in_memory_order(lowered, orders)
        try:
            holds_padded = padded and _holds_padded(values)
            if check is not None:
                check(
                    *(
                        padding_rules.for_check(pad_rule, values, binder.names, index)
                        if holds_padded
                        else values
                    )
                )
            recorder = ctx.recorder
            ran_padded = False
            if holds_padded:
                result = _run_padded(pad_rule, lowered, values, extra, binder.names, index)
                ran_padded = result is not None
                if not ran_padded:  # (the rule does not serve this call: its operands read unpadded)
                    values = [_unpadded(v) for v in values]
            if ran_padded:
                pass
            elif traced and recorder is not None:
                result = recorder.record(program, values, extra, name)
            elif precision.setting() == "highest":  # (the default: no precision context)
                result = program(*values, **extra)
            else:
                result = precision.call(program, *values, **extra)
        except (IndexError, UnsupportedDtypeError, torch.OutOfMemoryError, *NEEDS_VALUES):
            # already the right error: PyTorch's IndexErrors (bounds, mask shapes), or a result
            # dtype tpu does not have, which must keep its clear TypeError; or a compiled
            # program's trace reaching an op that needs values (the program names it)
            raise
        except (TypeError, ValueError) as e:
            if getattr(e, "torchs_own", False):  # (the lowering raised CPU's own: dtypes.torchs_own)
                raise
            if "incompatible devices" in str(e):  # JAX refuses arrays of two devices
                raise _mixed_devices(args, kwargs) or e from None
            raise _translate(op, e, args, kwargs, elementwise=promote_pos is not None) from e
        except (KeyError, ArithmeticError, StopIteration) as e:
            # errors PyTorch never raises, from a lowering meeting arguments it does not expect
            # (a zero count, a dtype it has no entry for): PyTorch's error for them if its meta
            # kernel has one
            translated = _meta_error(op, args, kwargs)
            if translated is None:
                raise
            raise translated from e
        except Exception as e:  # XLA's RESOURCE_EXHAUSTED becomes torch.OutOfMemoryError
            translated = memory.translate(e)
            if translated is e:
                raise
            raise translated from e
        for number, dtype in fitted:
            if type(number) in _NUMBERS:
                check_scalar(number, dtype, 2)
        shadowed = host_rule is not None and not ran_padded and _is_integral(result)
        if shadowed and ctx.trace is None:
            _shadow(host_rule, args, result, kwargs)
        if learn is not None:
            rules = conversions(call, operands[1], types)
            kept = fast_plans[learn] = (
                _NO_PLAN
                if rules is None
                else (lowered, tuple(values[len(call) :]), torch.get_default_dtype(), rules)
            )
            native_rules = None if rules is None or native_plans is None else _native_rules(rules, call)
            if native_rules is not None:  # (the same plan, its conversions as the core does them)
                reads_views = any(rule[1] == _NATIVE_VIEW for rule in native_rules)
                native_plans[learn] = (
                    *kept[:3],
                    native_rules,
                    reads_views,
                    core_host_rule if shadowed else None,
                    check,
                    traced,
                )
        return result

    return _Compute(compute, binder, native_plans, views_in_program)


def _holds_padded(values: list) -> bool:
    """Whether an op's converted arguments include a padded value (a tensor list's included)."""
    for v in values:
        kind = type(v)
        if kind is Padded or (kind is list and any(type(x) is Padded for x in v)):
            return True
    return False


def _unpadded(value: Any) -> Any:
    if type(value) is Padded:
        return value.unpadded()
    if type(value) is list:
        return [_unpadded(v) for v in value]
    return value


def _run_padded(rule, lowered: Callable, values: list, extra: dict, names, index: int) -> Any:
    """The op's padded outputs (``ops.padding.run``) on ``tpu:index``, under the matmul precision
    now; None where the rule does not serve the call or its program fails (the unpadded path then
    runs, and raises the op's own error if the call is wrong)."""
    try:
        return precision.call(padding_rules.run, rule, lowered, values, extra, names, index)
    except Exception:  # noqa: BLE001  (a wrong call's error names padded sizes: raised unpadded)
        return None


#: The most elements a result computed on the host too (``Lowering.host``) may have: numpy's
#: cost per op stays below the op's own
HOST_SHADOW_ELEMENTS = 4096


def _is_integral(result: Any) -> bool:
    """Whether ``result`` is an integer array, which an op with a host rule computes on the host
    too where it is small (positions, lengths: what bounds checks read)."""
    dtype = getattr(result, "dtype", None)
    return dtype is not None and dtype.kind in "iu"


def _shadow(rule: Callable, args: tuple, result: Any, kwargs: dict | None = None) -> None:
    """Keep ``rule``'s result over the host copies of the call's arguments as ``result``'s host
    copy (``buffer.host_copy``), where every tensor among them has one (or is a 0-dim CPU
    tensor); the rule computes in ``result``'s dtype, wrapping as the device does (numpy arrays
    do not warn of overflow; a number outside the dtype raises, and none is kept: PyTorch wraps
    it into the dtype first). Not for a result of more than ``HOST_SHADOW_ELEMENTS``."""
    if result.size > HOST_SHADOW_ELEMENTS:
        return
    dtype = result.dtype
    hosts = []
    for value in args:
        if isinstance(value, torch.Tensor):
            if value.is_cpu:
                host = value.detach().numpy() if value.dim() == 0 else None
            else:
                host = tensor.host_value(value)
            if host is None or host.dtype.kind not in "biu":
                return
            value = host.astype(dtype, copy=False)
        elif type(value) is not int and type(value) is not bool:
            return
        hosts.append(value)
    try:
        host = np.asarray(rule(*hosts, **(kwargs or {})), dtype)
    except (OverflowError, TypeError):  # (a number outside the dtype; a keyword not a number)
        return
    if host.shape == tuple(result.shape):
        host.flags.writeable = False
        buffer.keep_host_copy(result, host, shared=True)


def _transposing(fn: Callable, orders: tuple) -> Callable:
    """``fn`` returning each output that has an order in ``orders`` transposed into it (several
    outputs as a plain tuple: what the layout's wrapping reads)."""

    def run(*args, **kwargs):
        outs = fn(*args, **kwargs)
        if not isinstance(outs, (tuple, list)):
            return outs.transpose(orders[0])
        return tuple(o if o is None or d is None else o.transpose(d) for o, d in zip(outs, orders))

    return run


def _reading_arguments(fn: Callable, readers: list[tuple[int, Callable]]) -> Callable:
    """``fn`` given each positional argument ``i`` as ``read(value)``, for each ``(i, read)`` in
    ``readers`` (a jitted lowering's: it runs when JAX traces, not at every call)."""

    def run(*values, **kwargs):
        values = list(values)
        for i, read in readers:
            values[i] = read(values[i])
        return fn(*values, **kwargs)

    return functools.wraps(fn)(run)


def _or_default(default: Any) -> Callable:
    """A reader giving ``default`` for an argument passed as None (a scalar left at its schema
    default: a constant of the program)."""
    return lambda value: default if value is None else value


def _keyed(fn: Callable) -> Callable:
    """A random lowering given :func:`random.next_key`'s draw, whose key its program makes."""

    def run(*values, key, **kwargs):
        return fn(*values, key=random.key_of(key), **kwargs)

    return functools.wraps(fn)(run)


def _common_dtype(kind, promote_pos) -> Callable:
    """The dtype CPU's TensorIterator runs an elementwise op in: the promotion of its operands
    (``DEFAULT``'s result dtype; half types not widened, integers not made float)."""
    if kind is Promote.DEFAULT:
        return lambda values, types: types.result
    return lambda values, types: promoted_types(Promote.DEFAULT, [values[i] for i in promote_pos]).result


def _for_host(value: Any) -> Any:
    """A lowering input as concrete arrays whose checks have passed (a host read)."""
    if isinstance(value, (list, tuple)):
        return type(value)(_for_host(v) for v in value)
    if isinstance(value, (jax.Array, Deferred)):
        return checks.before_host_read(value)
    return value


def _check_dtypes(dtype_guard, op, names, values, types, args: tuple, kwargs: dict) -> bool:
    """Run ``dtype_guard``; returns whether its verdict hung on more than dtypes."""
    try:
        return dtype_guard(values, types)
    except NotImplementedError as refusal:  # after PyTorch's own argument checks, as on CPU
        raise _refusal_meta_error(op, names, args, kwargs, refusal) or refusal from None


def _refusal_meta_error(op, names, args: tuple, kwargs: dict, refusal) -> Exception | None:
    """PyTorch's argument checks for a call CPU's kernel refuses: the meta replay with the
    refused tensors as a dtype the kernel takes. Which ones is a guess (only the refused
    argument, or every tensor of its dtype: an index or a second operand of that dtype), so a
    check must fire both ways, as a shape check does (not one about the stand-ins' dtypes)."""
    if getattr(refusal, "stand_in", None) is None:
        return _meta_error(op, args, kwargs)
    positions, dtype, stand_in = refusal.stand_in
    errors = [
        _meta_error(op, *_stand_ins(names, args, kwargs, swapped, dtype, stand_in))
        for swapped in (positions, range(len(names)))
    ]
    return errors[0] if all(errors) else None


def _stand_ins(names, args: tuple, kwargs: dict, positions, dtype, stand_in) -> tuple[tuple, dict]:
    """The call with the tensors of ``dtype`` at these argument positions as meta tensors of
    dtype ``stand_in``."""

    def swap(x):
        if isinstance(x, torch.Tensor) and x.dtype == dtype:
            return torch.empty_strided(x.shape, x.stride(), dtype=stand_in, device="meta")
        return x

    def at(position, value):
        return torch.utils._pytree.tree_map(swap, value) if position in positions else value

    args = tuple(at(i, a) for i, a in enumerate(args))
    kwargs = {k: at(names.index(k) if k in names else -1, v) for k, v in kwargs.items()}
    return args, kwargs


def _meta_error(op, args: tuple, kwargs: dict) -> Exception | None:
    """The exception PyTorch itself raises for these arguments, found by replaying the call on
    meta tensors, whose kernels carry PyTorch's shape and dtype checks (None: meta accepts them,
    or has no kernel for the op)."""
    meta_args, meta_kwargs = to_meta((args, kwargs), tpu_only=True)
    try:
        op(*meta_args, **meta_kwargs)
    except NotImplementedError:  # no meta kernel (data-dependent ops)
        return None
    except (RuntimeError, IndexError, ValueError, TypeError) as torch_error:
        if any(text in str(torch_error) for text in NEEDS_VALUES_MESSAGES):
            return None  # meta cannot run it, no check of PyTorch's
        return torch_error
    except Exception:  # noqa: BLE001  (no usable meta kernel)
        return None
    return None


#: How the meta kernels of elementwise ops (Python references) word operands that do not
#: broadcast; CPU's TensorIterator says it as ``at::infer_size`` does (other ops' meta kernels
#: word it as CPU's do, or broadcast only some dims: theirs is kept)
_PRIMS_BROADCAST_ERROR = "Attempting to broadcast a dimension of length"


def _broadcast_error(op, args: tuple, kwargs: dict) -> RuntimeError | None:
    """CPU's error for an elementwise op whose tensors do not broadcast: TensorIterator folds
    their shapes in argument order (``out=`` tensors, resized to the result, left out) with
    ``at::infer_size``, whose error names the shape so far ("tensor a") and the next one
    ("tensor b"); None if they broadcast (the meta kernel refused something else)."""
    outs = {a.name for a in op._schema.arguments if _is_out(a)}
    values = [*args, *(v for k, v in kwargs.items() if k not in outs)]
    shape = None
    try:
        for t in values:
            if isinstance(t, torch.Tensor):
                shape = t.shape if not shape else torch._C._infer_size(shape, t.shape)
    except RuntimeError as error:
        return error
    return None


def _translate(op, error: Exception, args: tuple, kwargs: dict, elementwise: bool = False) -> Exception:
    """PyTorch's exception for these arguments (``_meta_error``; for an ``elementwise`` op's
    operands that do not broadcast, TensorIterator's), else one naming the op."""
    translated = _meta_error(op, args, kwargs)
    if elementwise and str(translated).startswith(_PRIMS_BROADCAST_ERROR):
        translated = _broadcast_error(op, args, kwargs) or translated
    return translated or RuntimeError(f"{op} on tpu: {error}")


def _block(outputs) -> None:
    if context.trace is None:  # a compiled program's trace has nothing to wait for
        jax.block_until_ready(outputs)


def _wrap_output(value):
    """A lowering's output as tensors: an array, a list of arrays (``Tensor[]``), or None for an
    output the op's ``output_mask`` left out (an undefined tensor in ATen)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [tensor.wrap(v) for v in value]
    return tensor.wrap(value)


def _functional_kernel(entry: Lowering, compute: Callable) -> Callable:
    shape = _returns_shape(entry.op._schema)
    wrap = tensor.wrap

    if entry.layout is Layout.META and entry.runs is Runs.TRACED:

        def kernel(*args, **kwargs):  # (its program returns the outputs in their memory order)
            laid = layout.meta_layout(entry.op, args, kwargs)
            outs = compute(args, kwargs, laid.orders)
            if context.launch_blocking:
                _block(outs)
            wrapped = layout.wrap_in_order(outs, laid)
            return wrapped[0] if shape == "one" else tuple(wrapped)
    elif entry.layout is not None:

        def kernel(*args, **kwargs):
            outs = compute(args, kwargs)
            if context.launch_blocking:
                _block(outs)
            wrapped = layout.wrap(entry.op, entry.layout, outs, args, kwargs)
            return wrapped[0] if shape == "one" else tuple(wrapped)
    elif shape == "one":
        elementwise = entry.promote is not None  # laid out like its inputs, as TensorIterator does

        def kernel(*args, **kwargs):
            out = compute(args, kwargs)
            if context.launch_blocking:
                _block(out)
            return tensor.wrap_elementwise(out, args) if elementwise else wrap(out)
    elif shape == "list":

        def kernel(*args, **kwargs):
            outs = compute(args, kwargs)
            if context.launch_blocking:
                _block(outs)
            return [wrap(o) for o in outs]
    else:

        def kernel(*args, **kwargs):
            outs = compute(args, kwargs)
            if context.launch_blocking:
                _block(outs)
            return tuple(_wrap_output(o) for o in outs)

    if entry.shortcut is None:
        return kernel
    shortcut, general = entry.shortcut, kernel

    def kernel(*args, **kwargs):
        result = shortcut(*args, **kwargs)
        return general(*args, **kwargs) if result is None else result

    return kernel


def _fit(dst: torch.Tensor | list, value, resize: bool) -> None:
    """Check that a lowering's output can go into an in-place target or an ``out=`` tensor,
    PyTorch-style, resizing an ``out=`` to it (a ``Tensor[]`` target takes a list of outputs,
    one each)."""
    if isinstance(dst, (list, tuple)):
        _check_count(dst, value)
        for d, v in zip(dst, value):
            _fit(d, v, resize)
        return
    if not tensor.is_tpu(dst):
        raise _device_mismatch(dst)
    if platform.others_used and buffer.index_of(value) != dst.get_device():
        raise platform.mixed_devices(f"tpu:{buffer.index_of(value)}", dst.device)
    result = JAX_TO_TORCH[value.dtype]
    if not torch.can_cast(result, dst.dtype):
        raise RuntimeError(
            f"result type {type_name(result)} can't be cast to the desired output type {type_name(dst.dtype)}"
        )
    if tuple(dst.shape) != value.shape:
        if not resize:
            raise RuntimeError(
                f"output with shape {list(dst.shape)} doesn't match the broadcast shape {list(value.shape)}"
            )
        if dst.numel():
            warn(
                f"An output with one or more elements was resized since it had shape "
                f"{list(dst.shape)}, which does not match the required output shape "
                f"{list(value.shape)}."
            )
        dst.resize_(value.shape)


def _check_count(dst: list, value: list) -> None:
    if len(dst) != len(value):
        raise RuntimeError(f"expected {len(value)} output tensors, got {len(dst)}")


def _store(dst: torch.Tensor | list, value, resize: bool) -> None:
    """``_fit`` then ``_write``, element by element for a ``Tensor[]`` target (a later element's
    error leaves the earlier ones written, as on CPU)."""
    if isinstance(dst, (list, tuple)):
        _check_count(dst, value)
        for d, v in zip(dst, value):
            _store(d, v, resize)
        return
    # a tpu tensor that is its whole storage, of the value's shape and dtype, fits it: stored
    # at once (on one device: the value's device is not compared)
    if not platform.others_used and tensor.write_whole(dst, value):
        return
    _fit(dst, value, resize)
    tensor.write(dst, value)


def _write(dst: torch.Tensor | list, value) -> None:
    if isinstance(dst, (list, tuple)):
        for d, v in zip(dst, value):
            _write(d, v)
    else:
        tensor.write(dst, value)


def _out_dtype_checker(rule: OutDtype | None, schema: torch._C.FunctionSchema) -> Callable | None:
    """``check(outputs, args, kwargs)`` raising CPU's error for an ``out=`` of another dtype than
    ``rule`` demands (None: no rule, or not an ``out=`` overload)."""
    if rule is None or not any(map(_is_out, schema.arguments)):
        return None
    binder = _Binder(schema)

    def check(outputs: list, args: tuple, kwargs: dict) -> None:
        expected = rule.expected(*binder.bind(args, kwargs))
        for out in outputs:
            if isinstance(out, torch.Tensor) and out.dtype != expected:
                raise RuntimeError(rule.message(expected, out.dtype))

    return check


def _own_defaults(functional: torch._C.FunctionSchema, schema: torch._C.FunctionSchema) -> list[tuple]:
    """``(position, name, default)`` of the arguments PyTorch leaves out where they equal *this*
    schema's defaults, which the functional schema may lack (bernoulli_.float's p=0.5 vs
    bernoulli.p's required p): the derived kernel supplies them."""
    functional_defaults = {a.name: _default(a) for a in functional.arguments}
    return [
        (i, a.name, _default(a))
        for i, a in enumerate(schema.arguments)
        if a.has_default_value()
        and not _is_out(a)
        and functional_defaults.get(a.name, _NO_DEFAULT) != _default(a)
    ]


def _writes_first_only(functional: torch._C.FunctionSchema, schema: torch._C.FunctionSchema) -> bool:
    """Whether a derived overload is an in-place one that writes its first argument alone and
    returns it, its other arguments the functional op's (``add_``, ``mul_.Scalar``): the kind
    the C++ core may serve (``PlannedKernel``'s returns 3)."""
    written = [i for i, a in enumerate(schema.arguments) if _is_written(a)]
    return (
        written == [0]
        and not any(map(_is_out, schema.arguments))
        and len(schema.returns) == 1
        and not _own_defaults(functional, schema)
    )


def _mutating_kernel(
    compute: Callable,
    functional: torch._C.FunctionSchema,
    schema: torch._C.FunctionSchema,
    resize: bool,
    out_dtype: OutDtype | None = None,
    learned: tuple[dict, dict, int, _Binder] | None = None,
) -> Callable:
    """The kernel of a derived in-place or ``out=`` overload: compute the functional op, then
    store its outputs, in order, into the arguments the schema marks as written (``self`` for
    ``add_``; the five state lists for ``_fused_adam_``; the ``out`` tensors for ``add.out``).
    ``learned`` (an overload :func:`_writes_first_only`): the functional op's native plans, the
    overload's, the op's ``views_in_program`` and its binder; a call whose output became its
    first argument's whole value hands the functional plan of its key (that of its
    ``_Binder.positional`` form) to the overload's (:func:`_planned_in_place`)."""
    names = [a.name for a in schema.arguments]
    targets = [(names.index(a.name), a.name) for a in schema.arguments if _is_written(a)]
    outs = {a.name for a in schema.arguments if _is_out(a)}
    check_overlap = overlap.writes_checker(schema)
    check_resized = overlap.writes_checker(schema, resized=True) if resize else None
    check_dtypes = _out_dtype_checker(out_dtype, schema)
    single = len(targets) == 1
    returns = len(schema.returns)
    own_defaults = _own_defaults(functional, schema)
    functional_plans, own_plans, views_in_program, binder = learned or (None, None, 0, None)

    def kernel(*args, **kwargs):
        written = [args[i] if i < len(args) else kwargs[name] for i, name in targets]
        check_overlap(written, args, kwargs)
        if check_dtypes is not None:
            check_dtypes(written, args, kwargs)
        if outs:
            kwargs = {k: v for k, v in kwargs.items() if k not in outs}
        for i, name, default in own_defaults:
            if i >= len(args) and name not in kwargs:
                kwargs = {**kwargs, name: default}
        values = compute(args, kwargs)
        stores = list(zip(written, (values,) if single else values))
        if check_resized is None:
            for dst, value in stores:  # one target after another, as CPU writes a list's
                _store(dst, value, resize)
            if own_plans is not None and tensor.whole_value(stores[0][0]) is values:
                call = binder.positional(args, kwargs) if kwargs else args
                operands = tensor.whole_operands(call, views_in_program)
                plan = None if operands is None else functional_plans.get(operands[0])
                if plan is not None:
                    own_plans[operands[0]] = plan
        else:  # out= tensors resized onto an input are refused before any is written
            for dst, value in stores:
                _fit(dst, value, resize)
            check_resized(written, args, kwargs)
            for dst, value in stores:
                _write(dst, value)
        if context.launch_blocking:
            _block(values)
        if not returns:
            return None
        return written[0] if returns == 1 else tuple(written[:returns])

    return kernel


# ----------------------------------------------------------------------------- derivation
def _signature(schema, drop_out: bool) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments if not (drop_out and _is_out(a))]


def _derived_variants(op: torch._ops.OpOverload):
    """In-place and out= overloads whose schema matches the functional ``op`` and whose written
    arguments line up one to one with its outputs; yields (overload, resizes its outputs)."""
    base = op._schema.name.split("::")[1]
    want = _signature(op._schema, drop_out=False)
    outputs = len(op._schema.returns)

    def written(other):
        return [a for a in other._schema.arguments if _is_written(a)]

    packet = getattr(aten, base)
    for name in packet.overloads():
        other = getattr(packet, name)
        targets = written(other)
        if (
            other is not op
            and targets
            and all(map(_is_out, targets))
            and len(targets) == outputs
            and _signature(other._schema, drop_out=True) == want
        ):
            yield other, True
    inplace = getattr(aten, base + "_", None)
    if inplace is not None:
        for name in inplace.overloads():
            other = getattr(inplace, name)
            if _signature(other._schema, drop_out=False) == want and len(written(other)) == outputs:
                yield other, False


def _recording(op: torch._ops.OpOverload, kernel: Callable) -> Callable:
    """A runtime kernel, refusing the dtypes CPU's kernel refuses (its table entries; unsigned
    dtypes reach the views and copies among these kernels as they reach CPU's)."""
    binder = _Binder(op._schema)
    dtype_guard = cpu_dtypes.table_guard(op, binder.names)

    def recorded(*args, **kwargs):
        if platform.attention_needed:
            platform.attend()
        if recorded_ops is not None:
            recorded_ops.add(op)
        if dtype_guard is not None:
            _check_dtypes(dtype_guard, op, binder.names, binder.bind(args, kwargs), None, args, kwargs)
        if precision.setting() == "highest":  # (the default: no precision context)
            return kernel(*args, **kwargs)
        return precision.call(kernel, *args, **kwargs)  # (for the programs it runs: ``apply``)

    return recorded


def _is_purely_composite(op: torch._ops.OpOverload) -> bool:
    """CompositeImplicitAutograd with no backend kernel: PyTorch decomposes it before any
    backend sees it, and a tpu kernel would take autograd's path away from it."""
    has = functools.partial(torch._C._dispatch_has_kernel_for_dispatch_key, qualified_name(op))
    return has("CompositeImplicitAutograd") and not has("CPU")


def check_installable(op: torch._ops.OpOverload) -> None:
    """Refuse lowerings PyTorch would never call, or would call behind autograd's back."""
    if _is_purely_composite(op):
        raise RuntimeError(
            f"{op} is CompositeImplicitAutograd: lower the ops it decomposes "
            "into instead (a tpu kernel would bypass autograd)"
        )


# ----------------------------------------------------------------------------- fallback
def _cpu(x):
    if isinstance(x, torch.device) and x.type == "tpu":  # factories build on CPU, then move
        return torch.device("cpu")
    return x.cpu() if tensor.is_tpu(x) else x


def fallback(op: torch._ops.OpOverload, *args, **kwargs):
    """An op with no tpu lowering: ``NotImplementedError`` naming it, or with
    ``TORCH_TPU_CPU_FALLBACK=1`` the op run on CPU (counted)."""
    name = qualified_name(op)
    tree = torch.utils._pytree
    if not config.cpu_fallback:
        sparse = any(isinstance(x, torch.Tensor) and x.is_sparse for x in tree.tree_leaves((args, kwargs)))
        raise NotImplementedError(
            f"'{name}' has no tpu lowering{' for sparse tensors' if sparse else ''}. Set "
            "TORCH_TPU_CPU_FALLBACK=1 to run it on CPU instead (slow; counted in "
            "torch_tpu.cpu_fallback_counts())."
        )
    cpu_fallback_counts[name] += 1
    cpu_args, cpu_kwargs = tree.tree_map(_cpu, (args, kwargs))
    result = op(*cpu_args, **cpu_kwargs)
    # copy mutated arguments back
    schema = op._schema
    bound = dict(zip([a.name for a in schema.arguments], args), **kwargs)
    cpu_bound = dict(zip([a.name for a in schema.arguments], cpu_args), **cpu_kwargs)
    for a in schema.arguments:
        if a.alias_info is not None and a.alias_info.is_write and tensor.is_tpu(bound.get(a.name)):
            bound[a.name].copy_(cpu_bound[a.name])
            if len(schema.returns) == 1 and schema.returns[0].alias_info is not None:
                return bound[a.name]
    return tree.tree_map(lambda x: x.to("tpu") if isinstance(x, torch.Tensor) else x, result)


# ----------------------------------------------------------------------------- install
_libraries: list = []
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _routed_by_device(op: torch._ops.OpOverload, kernel: Callable, lowered: bool = True) -> Callable:
    """A kernel taking ``device=``: a tpu device this process does not drive is refused rather
    than served by ``tpu:0``; a factory runs for its device (``tpu:i``; plain ``tpu``: the
    current device), a tensor-taking one given none for its tensor's. A ``lowered``
    tensor-taking factory asked for another device (``zeros_like(t, device="cpu")``,
    ``t.new_ones(3, device="cpu")``) runs PyTorch's own composite kernel, which builds the result
    on that device, instead of the tpu lowering (runtime kernels, ``_to_copy``, handle other
    devices themselves)."""
    schema_args = op._schema.arguments
    names = [a.name for a in schema_args]
    if "device" not in names:
        return kernel
    position = names.index("device")
    composite = lowered and torch._C._dispatch_has_kernel_for_dispatch_key(
        qualified_name(op), "CompositeExplicitAutograd"
    )
    takes_tensor = any(_kind(a) in (_TENSOR, _TENSOR_LIST) for a in schema_args)

    def routed(*args, **kwargs):
        device = args[position] if position < len(args) else kwargs.get("device")
        index = None  # (the driven device a "tpu:i" names; None: the current one)
        if device is not None:
            if device.type != "tpu":
                if composite:
                    return op.redispatch(_CPU_KEYS, *args, **kwargs)
            elif device.index is not None:
                index = platform.check_index(device.index)
                platform.use(index)
        if not platform.others_used:
            return kernel(*args, **kwargs)
        if device is not None and device.type == "tpu":
            index = current_device() if index is None else index
        else:  # (a tensor-taking one: its tensor's device)
            index = _first_index(args) if takes_tensor else current_device()
        if index == context.index:
            result = kernel(*args, **kwargs)
        else:
            with platform.placing(index):
                result = kernel(*args, **kwargs)
        if takes_tensor and lowered and result.get_device() != index:  # (computed on its tensor's)
            result = result.to(torch.device("tpu", index))
        return result

    return routed


def _first_index(args: tuple) -> int:
    for x in args:
        if isinstance(x, torch.Tensor) and not x.is_cpu:
            return max(x.get_device(), 0)
    return current_device()


def current_device() -> int:
    """The calling thread's current tpu index (the device guard's)."""
    return torch.accelerator.current_device_index()


def _kernel(entry: Lowering, computed: _Compute) -> Callable:
    from .meta_check import checked  # TORCH_TPU_CHECK_META (a no-op unless switched on)

    kernel = checked(entry.op, _routed_by_device(entry.op, _functional_kernel(entry, computed.compute)))
    return _planned(entry, computed, kernel)


#: ``PlannedKernel``'s ``returns``: one contiguous tensor, one laid out like the op's tensor
#: inputs (an elementwise op's, :func:`tensor.wrap_elementwise`), a tuple (:func:`_wrap_output`)
_RETURNS_ONE, _RETURNS_LIKE_INPUTS, _RETURNS_TUPLE, _RETURNS_WRITES_FIRST = range(4)


def _servable(entry: Lowering, computed: _Compute) -> bool:
    """Whether the C++ core may serve the op's planned calls: it returns one tensor or a tuple
    and does nothing else around its program (no layout rule, shortcut or device argument)."""
    return not (
        computed.native_plans is None
        or entry.layout is not None
        or entry.shortcut is not None
        or _returns_shape(entry.op._schema) == "list"
        or "device" in computed.binder.names
    )


def _planned(entry: Lowering, computed: _Compute, kernel: Callable) -> Callable:
    """``kernel`` behind the C++ core's ``PlannedKernel``, which serves the calls it has a plan
    for (``computed.native_plans``) with no Python frame (:func:`_servable` ops)."""
    op = entry.op
    if not _servable(entry, computed):
        return kernel
    if _returns_shape(op._schema) == "tuple":
        returns = _RETURNS_TUPLE
    else:
        returns = _RETURNS_ONE if entry.promote is None else _RETURNS_LIKE_INPUTS
    return native._C.PlannedKernel(
        kernel, computed.native_plans, op, str(op), computed.views_in_program, returns
    )


def _planned_in_place(variant: torch._ops.OpOverload, plans: dict, computed: _Compute, kernel: Callable):
    """An in-place overload's ``kernel`` behind a ``PlannedKernel`` serving the calls it has a
    plan for in ``plans`` (learned by ``kernel``: :func:`_mutating_kernel`) with no Python frame:
    the functional program's output becomes the first argument's value
    (``tensor.write_whole``), where that argument is its whole storage and shares it with no
    other argument; any other call, or an output of another shape or dtype, goes to ``kernel``."""
    return native._C.PlannedKernel(
        kernel, plans, variant, str(variant), computed.views_in_program, _RETURNS_WRITES_FIRST
    )


def _register_kernel(lib: torch.library.Library, op: torch._ops.OpOverload, kernel: Callable) -> None:
    """``kernel`` as ``op``'s tpu kernel: a ``PlannedKernel`` straight with the dispatcher where
    the C++ core can convert the op's arguments (no Python kernel holder between them), any other
    kernel through ``lib``."""
    overload = "" if op._overloadname == "default" else op._overloadname
    if native.available() and isinstance(kernel, native._C.PlannedKernel):
        if native._C.serve_boxed(op._opname, overload, kernel):
            return
    lib.impl(op, kernel, "PrivateUse1")


def kernel_of(entry: Lowering, check_meta: bool = True) -> Callable:
    """The tpu kernel of a lowering that is not in the table: a user's op
    (``torch_tpu.pallas.jax_op``), which then runs, records and traces like an ATen op.
    (``check_meta=False`` for an op that reaches it from its meta call: one with no tensors.)"""
    computed = _compute_fn(entry)
    if not check_meta:
        return _routed_by_device(entry.op, _functional_kernel(entry, computed.compute))
    return _kernel(entry, computed)


def install() -> None:
    """Register every lowering (and its derived variants) on PrivateUse1. Strict: errors on
    lowerings of CompositeImplicitAutograd ops (autograd would bypass them) or of non-ATen ops."""
    from . import sparse
    from .meta_check import checked  # TORCH_TPU_CHECK_META (a no-op unless switched on)

    if native.available():  # (what PlannedKernel reads of the state an op's call runs in)
        native._C.configure_plans(
            vars(platform),
            globals(),
            vars(config),
            context,
            tensor.wrap,
            tensor.wrap_elementwise,
            _number,
            _wrap_output,
            tensor.write_whole,
        )
    lib = torch.library.Library("aten", "IMPL")
    _libraries.append(lib)
    explicit = set(LOWERINGS)
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    for op, entry in LOWERINGS.items():
        check_installable(op)
        if entry.native and has_kernel(qualified_name(op), "PrivateUse1"):
            SERVED_BY_THE_CORE.add(op)  # (no core, or one built before it had this kernel: ours)
            continue
        if entry.runtime:
            lib.impl(
                op, checked(op, _routed_by_device(op, _recording(op, entry.fn), lowered=False)), "PrivateUse1"
            )
            continue
        # one compute (and so one set of compiled executables) serves the op and its variants
        computed = _compute_fn(entry)
        compute = computed.compute
        _register_kernel(lib, op, _kernel(entry, computed))
        for variant, resize in _derived_variants(op):
            if variant in explicit or variant in DERIVED:
                continue
            DERIVED[variant] = op
            plannable = not resize and _servable(entry, computed) and _returns_shape(op._schema) == "one"
            plannable = plannable and _writes_first_only(op._schema, variant._schema)
            own_plans: dict = {}
            learned = (computed.native_plans, own_plans, computed.views_in_program, computed.binder)
            learned = learned if plannable else None
            schemas = (op._schema, variant._schema)
            mutating = checked(variant, _mutating_kernel(compute, *schemas, resize, entry.out_dtype, learned))
            if plannable:
                _register_kernel(lib, variant, _planned_in_place(variant, own_plans, computed, mutating))
            else:
                lib.impl(variant, mutating, "PrivateUse1")
    sparse.install(fallback)
