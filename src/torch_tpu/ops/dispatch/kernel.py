"""The call of a pure lowering (:class:`Compute`): bind a kernel call's arguments, convert them,
run (or record) the op's program, translate its errors, and keep plans for calls that repeat.

A call takes one of two paths. The fast path serves a call whose key (per argument: a tensor's
dtype, whether it is 0-dim and whether it is its whole storage, that storage with axes permuted,
or another view; anything else's type; and the default dtype) has a kept :class:`FastPlan`: it
skips binding and promotion and converts only the arguments the key does not decide. The general
path binds, promotes, vets dtypes and converts every argument; its call then teaches the fast
path a plan for its key (and the C++ core a :class:`NativePlan`, which serves later calls with no
Python frame at all).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import torch

from ...execution.tracing import NEEDS_VALUES
from ...runtime import host_copies, memory, native, padding, platform, precision, random, tensor
from ...runtime.context import context
from ...runtime.dtypes import UnsupportedDtypeError, check_scalar
from ...runtime.flags import flags
from .. import cpu_dtypes
from .. import padding as padding_rules
from ..registry import Lowering, Runs, Types
from .binding import (
    DTYPE,
    GENERATOR,
    HOST_SCALARS,
    INDICES,
    NO_DEFAULT,
    SCALAR,
    SCALAR_LIST,
    STATIC,
    TENSOR,
    TENSOR_LIST,
    Binder,
    holds_floats,
    is_out,
)
from .conversion import (
    NUMBER_CONVERTERS,
    NUMBERS,
    check_generator,
    dtype_arg,
    exact_static,
    fitted_dtype,
    fitted_number,
    for_host,
    host_scalars,
    indices_to_jax,
    number,
    op_index,
    plain_static,
    scalar,
    scalars,
    static_arg,
    to_jax_arg,
    to_jax_args,
    to_program_arg,
    to_program_args,
)
from .errors import check_dtypes, meta_error, mixed_devices, translate
from .plans import NATIVE_VIEW, NO_PLAN, FastPlan, HostRule, NativePlan, native_rules
from .programs import (
    holds_padded,
    is_integral,
    keyed,
    or_default,
    reading_arguments,
    run_padded,
    shadow,
    transposing,
    unpadded,
)
from .promoting import common_dtype, operand_signature, promoted

#: How the general path converts an argument of each kind (each takes the value and the tpu
#: index of the op); a tensor its op's program reads as a view takes ``_IN_PROGRAM``'s
_CONVERT = {
    TENSOR: to_jax_arg,
    TENSOR_LIST: to_jax_args,
    INDICES: indices_to_jax,
    DTYPE: dtype_arg,
    STATIC: static_arg,
    SCALAR: scalar,
    SCALAR_LIST: scalars,
    HOST_SCALARS: host_scalars,
}
_IN_PROGRAM = {TENSOR: to_program_arg, TENSOR_LIST: to_program_args}
#: Kinds whose value the fast path's key does not tell (a list of tensors or numbers, a dtype):
#: an op with such a required argument (``cat``, the ``_foreach_*`` ops) never has a plan. A
#: list of indices is converted at every call: what its items are is the lowering's to see
_BEYOND_KEY = {TENSOR_LIST, SCALAR_LIST, HOST_SCALARS, DTYPE}
#: Errors a program raises that are already PyTorch's: its IndexErrors (bounds, mask shapes), a
#: result dtype tpu does not have (a clear TypeError), a compiled program's trace reaching an
#: op that needs values (the program names it)
_ALREADY_TORCHS = (IndexError, UnsupportedDtypeError, torch.OutOfMemoryError, *NEEDS_VALUES)


def _unjitted(fn: Callable) -> Callable:
    return fn


class TypedProgram(NamedTuple):
    """The program of an op for its operands' promoted types."""

    types: Types | None
    program: Callable
    #: whether the dtype guard must run at every call (not when it depends on the types alone)
    guard_each_call: bool


class Bound:
    """A call the general path has bound and converted."""

    __slots__ = ("values", "program", "extra", "types", "index", "fitted", "verdict_per_call")

    def __init__(self, values, program, extra, types, index, fitted, verdict_per_call):
        self.values = values  # the lowering's arguments, converted
        self.program = program
        self.extra = extra  # the lowering's keywords (a random op's ``key``)
        self.types = types  # the promoted types, of an elementwise op
        self.index = index  # the tpu the op runs on
        #: (number, dtype) of each fitted Scalar argument, checked once the program ran
        self.fitted = fitted
        #: whether the dtype guard's verdict held for these values only (no plan is kept)
        self.verdict_per_call = verdict_per_call


class Compute:
    """A pure lowering's call ``call(args, kwargs, orders=None)`` -> its JAX outputs, and the
    plans that serve it; one per functional op, shared by its in-place and ``out=`` variants."""

    def __init__(self, entry: Lowering):
        self.entry, self.op, self.name = entry, entry.op, str(entry.op)
        self.binder = Binder(entry.op._schema)
        self.traced, self.on_host = entry.runs is Runs.TRACED, entry.runs is Runs.HOST
        self.check, self.draws_key = entry.check, entry.random
        self.kinds = self._argument_kinds()
        self.static_pos = self._static_positions()
        self.jit = self._jitter()
        self.defaulted = self._defaulted()
        self.exact_pos = self._exact_positions()
        self.in_program = self._read_in_program()
        self.lowering = self._lowering()
        #: promoted types -> the jitted lowering (jitted at an op's first call, not here: most
        #: of the table never runs in a process); (operand signature, default dtype) -> TypedProgram
        self.by_types: dict[Types | None, Callable] = {}
        self.typed: dict[tuple, TypedProgram] = {}
        self.promote_pos = self._promote_positions()
        self.fitted_at = self._fitted_positions()
        self.host_rule = entry.host
        self.core_host_rule = (
            None
            if entry.host is None
            else HostRule(functools.partial(shadow, entry.host), host_copies.host_copies_by_id)
        )
        self.pad_rule = self._pad_rule()
        self.converters = self._converters()
        self.generator_pos = [i for i, k in enumerate(self.kinds) if k == GENERATOR]
        self.tensor_pos = [i for i, k in enumerate(self.kinds) if k in (TENSOR, TENSOR_LIST, INDICES)]
        self.dtype_guard = self._dtype_guard()
        self.guard_by_types = getattr(self.dtype_guard, "types_only", False)
        #: the op's tensor positions read as views in its program (``whole_operands``'s bit mask)
        self.views_in_program = sum(1 << i for i in self.in_program if self.kinds[i] == TENSOR)
        self.fast = self._plannable()
        self.fast_plans: dict[int, FastPlan] = {}
        self.default_at, self.converter_at = dict(self.defaulted), dict(self.converters)
        #: key -> the NativePlan of the calls the C++ core may serve; None for an op it never serves
        self.native_plans: dict[int, NativePlan] | None = {} if self.fast and native.available() else None
        #: (program, memory orders) -> the program returning its outputs so transposed
        self.in_order: dict[tuple, Callable] = {}

    # ------------------------------------------------------------------------- the call
    def call(self, args: tuple, kwargs: dict, orders: tuple | None = None):
        """The op's result for these arguments; ``orders`` (``layout.MetaLayout.orders``): its
        outputs transposed into these memory orders by its program."""
        learn = plan = operands = call = None  # (learn: the key a plan is to be kept under)
        if self.fast:
            call = self.binder.positional(args, kwargs) if kwargs else args
            operands = tensor.whole_operands(call, self.views_in_program)
            if operands is not None and not (flags.attention_needed or flags.others_used):
                plan = self.fast_plans.get(operands[0])
                if plan is None or plan.default_dtype is not torch.get_default_dtype():
                    plan, learn = None, None if plan is NO_PLAN else operands[0]
        ctx = context
        padded = self.pad_rule is not None and padding.live and ctx.trace is None
        ctx.op = self.name  # (named by a padded value its conversions read unpadded, too)
        values = None if plan is None else self._planned_values(plan, operands[1], padded)
        if values is None:
            bound = self._bind(args, kwargs, padded)
            program, values, extra, index = bound.program, bound.values, bound.extra, bound.index
            if bound.verdict_per_call:
                learn = None
        else:
            bound, program, extra, index = None, plan.program, {}, 0
        ctx.op = self.name  # named by the errors of checks reported later
        result, ran_padded = self._run(program, values, extra, index, orders, padded, args, kwargs)
        if bound is not None:
            for value, dtype in bound.fitted:
                if type(value) in NUMBERS:
                    check_scalar(value, dtype, 2)
        shadowed = self.host_rule is not None and not ran_padded and is_integral(result)
        if shadowed and ctx.trace is None:
            shadow(self.host_rule, args, result, kwargs)
        if learn is not None:
            self._learn(learn, call, operands[1], bound.types, program, values, shadowed)
        return result

    def _planned_values(self, plan: FastPlan, operands: tuple, padded: bool) -> list | None:
        """The fast path: the call's arguments as ``plan`` converts them; None where a fitted
        number is refused (the general path refuses it in CPU's order)."""
        recorded = flags.recorded_ops
        if recorded is not None:
            recorded.add(self.op)
        values = [*operands, *plan.defaults]
        ctx = context
        ctx.padding_reads = padded
        try:
            for i, default, convert in plan.rules:  # (as the general path's _drop_defaults, _convert)
                value = values[i]
                if type(value) is type(default) and value == default:
                    values[i] = None
                elif convert is not None and value is not None:
                    values[i] = convert(value, 0)
        except RuntimeError:
            return None
        finally:
            ctx.padding_reads = False
        return values

    def _bind(self, args: tuple, kwargs: dict, padded: bool) -> Bound:
        """The general path: the call bound to the schema, its dtypes vetted, its arguments
        converted for the op's program."""
        if flags.attention_needed:
            platform.attend()
        recorded = flags.recorded_ops
        if recorded is not None:
            recorded.add(self.op)
        values = self.binder.bind(args, kwargs)
        typed = self._typed(values, args, kwargs)
        names = self.binder.names
        per_call = typed.guard_each_call and check_dtypes(
            self.dtype_guard, self.op, names, values, typed.types, args, kwargs
        )
        index = op_index(values, self.tensor_pos) if flags.others_used else 0
        extra = self._random_key(values, index) if self.draws_key or self.generator_pos else {}
        if self.defaulted:
            self._drop_defaults(values)
        fitted = ()
        if self.fitted_at and typed.types is not None:  # (checked once the lowering took their kinds)
            result = typed.types.result
            fitted = [(values[i], fitted_dtype(result, opmath)) for i, opmath in self.fitted_at.items()]
        self._convert(values, index, padded)
        return Bound(values, typed.program, extra, typed.types, index, fitted, per_call)

    def _typed(self, values: list, args: tuple, kwargs: dict) -> TypedProgram:
        """The program for the call's promoted types (one jitted function per promoted dtype
        pair: cheaper than a static keyword per call)."""
        if self.promote_pos is None:
            program = self.by_types.get(None) or self._program_for(None)
            return TypedProgram(None, program, self.dtype_guard is not None)
        key = (operand_signature(values, self.promote_pos), torch.get_default_dtype())
        typed = self.typed.get(key)
        if typed is None:
            types = promoted(self.entry.promote, key[0], key[1])
            if self.guard_by_types:  # vetted once, before it is kept (a refusal is never kept)
                check_dtypes(self.dtype_guard, self.op, self.binder.names, values, types, args, kwargs)
            guard = self.dtype_guard is not None and not self.guard_by_types
            typed = self.typed[key] = TypedProgram(types, self._program_for(types), guard)
        return typed

    def _program_for(self, types: Types | None) -> Callable:
        program = self.by_types.get(types)
        if program is None:
            lowering = self.lowering if types is None else functools.partial(self.lowering, types=types)
            program = self.by_types[types] = self.jit(lowering)
        return program

    def _random_key(self, values: list, index: int) -> dict:
        """The lowering's keywords: a random op's key, drawn from its generator (taken out of
        ``values``) or the device's."""
        generator = None
        for i in self.generator_pos:
            check_generator(values[i])
            generator, values[i] = values[i], None
        return {"key": random.next_key(generator, index)} if self.draws_key else {}

    def _drop_defaults(self, values: list) -> None:
        """Scalars at their schema default as None (``or_default`` puts them back, in the trace)."""
        for i, default in self.defaulted:
            value = values[i]
            if type(value) is type(default) and value == default:
                values[i] = None

    def _convert(self, values: list, index: int, padded: bool) -> None:
        ctx = context
        ctx.padding_reads = padded
        try:
            for i, convert in self.converters:
                value = values[i]
                if value is not None:  # (None converts to None)
                    values[i] = convert(value, index)
        finally:
            ctx.padding_reads = False

    def _run(self, program, values, extra, index, orders, padded, args, kwargs) -> tuple[Any, bool]:
        """The op's outputs, and whether its padding rule computed them; a failure as PyTorch's
        exception."""
        if self.on_host:  # the graphs computing the inputs run, and their checks report, first
            values = [for_host(v) for v in values]
        try:
            return self._execute(program, values, extra, index, orders, padded)
        except _ALREADY_TORCHS:
            raise
        except (TypeError, ValueError) as e:
            if getattr(e, "torchs_own", False):  # (the lowering raised CPU's own: dtypes.torchs_own)
                raise
            if "incompatible devices" in str(e):  # JAX refuses arrays of two devices
                raise mixed_devices(args, kwargs) or e from None
            raise translate(self.op, e, args, kwargs, elementwise=self.promote_pos is not None) from e
        except (KeyError, ArithmeticError, StopIteration) as e:
            # errors PyTorch never raises, from a lowering meeting arguments it does not expect
            # (a zero count, a dtype it has no entry for): PyTorch's error for them if its meta
            # kernel has one
            translated = meta_error(self.op, args, kwargs)
            if translated is None:
                raise
            raise translated from e
        except Exception as e:  # XLA's RESOURCE_EXHAUSTED becomes torch.OutOfMemoryError
            translated = memory.translate(e)
            if translated is e:
                raise
            raise translated from e

    def _execute(self, program, values, extra, index, orders, padded) -> tuple[Any, bool]:
        holds = padded and holds_padded(values)
        names = self.binder.names
        if self.check is not None:
            self.check(*(padding_rules.for_check(self.pad_rule, values, names, index) if holds else values))
        if holds:
            result = run_padded(self.pad_rule, program, values, extra, names, index)
            if result is not None:
                return result, True
            values = [unpadded(v) for v in values]  # (the rule does not serve this call)
        if orders is not None:
            program = self._in_memory_order(program, orders)
        recorder = context.recorder
        if self.traced and recorder is not None:
            return recorder.record(program, values, extra, self.name), False
        if precision.setting() == "highest":  # (the default: no precision context)
            return program(*values, **extra), False
        return precision.call(program, *values, **extra), False

    def _in_memory_order(self, program: Callable, orders: tuple) -> Callable:
        transposed = self.in_order.get((program, orders))
        if transposed is None:
            transposed = self.in_order[(program, orders)] = self.jit(transposing(program, orders))
        return transposed

    # ------------------------------------------------------------------------- plans
    def _learn(self, key, call: tuple, operands: tuple, types, program, values: list, shadowed: bool) -> None:
        """Keep the plan of a general call for its key, and the C++ core's where it can serve it."""
        rules = self._conversions(call, operands, types)
        if rules is None:
            self.fast_plans[key] = NO_PLAN
            return
        kept = self.fast_plans[key] = FastPlan(
            program, tuple(values[len(call) :]), torch.get_default_dtype(), rules
        )
        native = None if self.native_plans is None else native_rules(rules, call)
        if native is not None:  # (the same plan, its conversions as the core does them)
            self.native_plans[key] = NativePlan(
                kept.program,
                kept.defaults,
                kept.default_dtype,
                rules=native,
                reads_views=any(rule.how == NATIVE_VIEW for rule in native),
                host_rule=self.core_host_rule if shadowed else None,
                check=self.check,
                traced=self.traced,
            )

    def _conversions(self, args: tuple, operands: tuple, types: Types | None) -> tuple | None:
        """What the fast path converts of a call with the key of ``args`` (computing in
        ``types``): every argument ``whole_operands`` left as it is, as the general path
        converts it; None when the key does not decide all it depends on."""
        rules = []
        for i, (x, operand) in enumerate(zip(args, operands)):
            if operand is not x:
                continue  # (a whole tensor's value)
            if self.kinds[i] in _BEYOND_KEY and x is not None:
                return None
            convert = self.converter_at.get(i)
            if type(x) in NUMBERS and convert in NUMBER_CONVERTERS:
                # (what each of them comes to for a number; a fitted one is checked too)
                checked = i in self.fitted_at and types is not None
                convert = fitted_number(types.result, self.fitted_at[i]) if checked else number
            rules.append((i, self.default_at.get(i, NO_DEFAULT), convert))
        return tuple(rules)

    # ------------------------------------------------------------------------- set-up steps
    def _argument_kinds(self) -> list[int]:
        """The schema's kinds, with the float/int arguments the lowering asks to receive as
        device scalars (``Lowering.dynamic``: a learning rate that changes every step must not
        recompile) as SCALAR."""
        dynamic = self.entry.dynamic
        return [SCALAR if n in dynamic else k for n, k in zip(self.binder.names, self.binder.kinds)]

    def _static_positions(self) -> tuple[int, ...]:
        static_names = set(self.entry.static)
        return tuple(
            i
            for i, (k, n) in enumerate(zip(self.kinds, self.binder.names))
            if k in (STATIC, DTYPE) or (k == SCALAR and n in static_names)
        )

    def _jitter(self) -> Callable:
        """How the lowering becomes its program: jitted where traced. keep_unused: an op's result
        lives on its inputs' device even when it ignores their values (``zeros_like``), as XLA
        would otherwise place a program with no used inputs on tpu:0."""
        if not self.traced:
            return _unjitted
        donate_pos = tuple(self.binder.names.index(n) for n in self.entry.donate)
        return functools.partial(
            jax.jit, static_argnums=self.static_pos, donate_argnums=donate_pos, keep_unused=True
        )

    def _defaulted(self) -> list[tuple[int, Any]]:
        """Scalars that reach the lowering as a constant of its program where left at their
        schema default (``alpha=1``), not as a device scalar input: one input less to convert,
        pass and record (not where a check sees the values)."""
        if self.check is not None or not self.traced:
            return []
        return [
            (i, d)
            for i, (k, d) in enumerate(zip(self.kinds, self.binder.defaults))
            if k == SCALAR and i not in self.static_pos and type(d) in (int, float) and d != 0
        ]

    def _exact_positions(self) -> list[int]:
        """Float static arguments, which reach a jitted lowering as ``exact_static`` makes them."""
        if not self.traced:
            return []
        schema_args = [a for a in self.op._schema.arguments if not is_out(a)]
        return [i for i in self.static_pos if holds_floats(schema_args[i])]

    def _read_in_program(self) -> list[int]:
        """Tensor arguments that are views (alone or in a list) reach the op's program as their
        storage's array and geometry, for the program to read (one program a call, one graph
        node when fused); not where a check or a host computation sees the values (a list still
        does where the check counts its tensors only), nor for donated buffers."""
        if not self.traced:
            return []
        donated = {self.binder.names.index(n) for n in self.entry.donate}
        unchecked = self.check is None
        read = {TENSOR: unchecked, TENSOR_LIST: unchecked or self.entry.check_lists_by_length}
        return [i for i, k in enumerate(self.kinds) if read.get(k) and i not in donated]

    def _lowering(self) -> Callable:
        readers = [(i, or_default(d)) for i, d in self.defaulted] + [
            (i, plain_static) for i in self.exact_pos
        ]
        lowering = reading_arguments(self.entry.fn, readers) if readers else self.entry.fn
        if self.draws_key and self.traced:
            lowering = keyed(lowering)
        if self.in_program:
            lowering = tensor.reading_views(lowering, self.in_program)
        return lowering

    def _promote_positions(self) -> list[int] | None:
        entry, names = self.entry, self.binder.names
        if entry.promote is None:
            return None
        promoted_names = entry.promote_args or [n for n, k in zip(names, self.kinds) if k in (TENSOR, SCALAR)]
        unknown = set(promoted_names) - set(names)
        if unknown:
            raise ValueError(f"{self.op}: promote_args {sorted(unknown)} are not schema arguments")
        return [names.index(n) for n in promoted_names]

    def _fitted_positions(self) -> dict[int, bool]:
        """Position -> whether in opmath, of the fitted Scalar arguments (a tensor overload's
        argument of the same name is not converted so)."""
        entry = self.entry
        return {
            i: n in entry.fitted_in_opmath
            for i, n in enumerate(self.binder.names)
            if n in (*entry.fitted, *entry.fitted_in_opmath) and self.kinds[i] == SCALAR
        }

    def _pad_rule(self):
        """The op's padding rule where it serves: a traced lowering's, or an eager one's that
        reads no padded element; a check sees the op's arrays, so an op with one reads its
        inputs unpadded unless its rule fills for checks."""
        entry = self.entry
        checks_padded = getattr(entry.pad, "check_fills", None) is not None
        servable = self.traced or entry.pad in (padding_rules.UNREAD, padding_rules.BY_LOWERING)
        return entry.pad if servable and (entry.check is None or checks_padded) else None

    def _converters(self) -> list[tuple[int, Callable]]:
        converters = [
            (i, _IN_PROGRAM[k] if i in self.in_program else _CONVERT[k])
            for i, k in enumerate(self.kinds)
            if k in _CONVERT and not (k == SCALAR and i in self.static_pos) and i not in self.exact_pos
        ]
        return converters + [(i, exact_static) for i in self.exact_pos]

    def _dtype_guard(self) -> Callable | None:
        entry, kinds = self.entry, self.kinds
        if entry.custom:
            return None
        promote_pos = self.promote_pos
        return cpu_dtypes.guard(
            self.op,
            self.binder.names,
            tensor_pos=[i for i, k in enumerate(kinds) if k == TENSOR],
            list_pos=[i for i, k in enumerate(kinds) if k == TENSOR_LIST],
            dtype_pos=[i for i, k in enumerate(kinds) if k == DTYPE],
            operand_pos=promote_pos,
            common_dtype=None if promote_pos is None else common_dtype(entry.promote, promote_pos),
        )

    def _plannable(self) -> bool:
        """Whether calls may reuse kept plans: not for ops whose calls differ in more than the
        key tells (a host computation, a random key or generator, donated buffers, a required
        argument beyond the key)."""
        kinds, defaults = self.kinds, self.binder.defaults
        always_beyond_key = any(k in _BEYOND_KEY and d is NO_DEFAULT for k, d in zip(kinds, defaults))
        entry = self.entry
        return not (self.on_host or self.draws_key or self.generator_pos or entry.donate or always_beyond_key)
