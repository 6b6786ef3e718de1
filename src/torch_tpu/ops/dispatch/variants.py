"""A lowering's kernels: the functional one, which wraps its program's outputs as tensors, and
the in-place and ``out=`` overloads derived from it by matching schemas, which store the
functional outputs into the arguments the schema marks as written."""

from __future__ import annotations

from collections.abc import Callable

import jax
import torch

from ...runtime import buffer, overlap, platform, tensor
from ...runtime.context import context
from ...runtime.dtypes import JAX_TO_TORCH, type_name
from ...runtime.flags import flags
from .. import layout
from .._helpers import warn
from ..registry import Layout, Lowering, OutDtype, Runs
from .binding import NO_DEFAULT, Binder, default_of, is_out, is_written, returns_shape
from .errors import device_mismatch
from .kernel import Compute

aten = torch.ops.aten


def block(outputs) -> None:
    if context.trace is None:  # a compiled program's trace has nothing to wait for
        jax.block_until_ready(outputs)


def wrap_output(value):
    """A lowering's output as tensors: an array, a list of arrays (``Tensor[]``), or None for an
    output the op's ``output_mask`` left out (an undefined tensor in ATen)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [tensor.wrap(v) for v in value]
    return tensor.wrap(value)


def functional_kernel(entry: Lowering, compute: Callable) -> Callable:
    """The kernel of a functional overload: ``compute`` (``Compute.call``), its outputs wrapped
    as the tensors the op returns (one kernel per way of wrapping: no branch per call)."""
    shape = returns_shape(entry.op._schema)
    wrap = tensor.wrap
    if entry.layout is Layout.META and entry.runs is Runs.TRACED:

        def kernel(*args, **kwargs):  # (its program returns the outputs in their memory order)
            laid = layout.meta_layout(entry.op, args, kwargs)
            outs = compute(args, kwargs, laid.orders)
            if context.launch_blocking:
                block(outs)
            wrapped = layout.wrap_in_order(outs, laid)
            return wrapped[0] if shape == "one" else tuple(wrapped)
    elif entry.layout is not None:

        def kernel(*args, **kwargs):
            outs = compute(args, kwargs)
            if context.launch_blocking:
                block(outs)
            wrapped = layout.wrap(entry.op, entry.layout, outs, args, kwargs)
            return wrapped[0] if shape == "one" else tuple(wrapped)
    elif shape == "one":
        elementwise = entry.promote is not None  # laid out like its inputs, as TensorIterator does

        def kernel(*args, **kwargs):
            out = compute(args, kwargs)
            if context.launch_blocking:
                block(out)
            return tensor.wrap_elementwise(out, args) if elementwise else wrap(out)
    else:

        def kernel(*args, **kwargs):
            outs = compute(args, kwargs)
            if context.launch_blocking:
                block(outs)
            return [wrap(o) for o in outs] if shape == "list" else tuple(wrap_output(o) for o in outs)

    return kernel if entry.shortcut is None else _with_shortcut(entry.shortcut, kernel)


def _with_shortcut(shortcut: Callable, general: Callable) -> Callable:
    """``general`` behind a lowering's shortcut, which answers the calls it can (None: it cannot)."""

    def kernel(*args, **kwargs):
        result = shortcut(*args, **kwargs)
        return general(*args, **kwargs) if result is None else result

    return kernel


# ----------------------------------------------------------------------------- storing outputs
def fit(dst: torch.Tensor | list, value, resize: bool) -> None:
    """Check that a lowering's output can go into an in-place target or an ``out=`` tensor,
    PyTorch-style, resizing an ``out=`` to it (a ``Tensor[]`` target takes a list of outputs,
    one each)."""
    if isinstance(dst, (list, tuple)):
        _check_count(dst, value)
        for d, v in zip(dst, value):
            fit(d, v, resize)
        return
    if not tensor.is_tpu(dst):
        raise device_mismatch(dst)
    if flags.others_used and buffer.index_of(value) != dst.get_device():
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


def store(dst: torch.Tensor | list, value, resize: bool) -> None:
    """``fit`` then ``write``, element by element for a ``Tensor[]`` target (a later element's
    error leaves the earlier ones written, as on CPU)."""
    if isinstance(dst, (list, tuple)):
        _check_count(dst, value)
        for d, v in zip(dst, value):
            store(d, v, resize)
        return
    # a tpu tensor that is its whole storage, of the value's shape and dtype, fits it: stored
    # at once (on one device: the value's device is not compared)
    if not flags.others_used and tensor.write_whole(dst, value):
        return
    fit(dst, value, resize)
    tensor.write(dst, value)


def write(dst: torch.Tensor | list, value) -> None:
    if isinstance(dst, (list, tuple)):
        for d, v in zip(dst, value):
            write(d, v)
    else:
        tensor.write(dst, value)


def _out_dtype_checker(rule: OutDtype | None, schema: torch._C.FunctionSchema) -> Callable | None:
    """``check(outputs, args, kwargs)`` raising CPU's error for an ``out=`` of another dtype than
    ``rule`` demands (None: no rule, or not an ``out=`` overload)."""
    if rule is None or not any(map(is_out, schema.arguments)):
        return None
    binder = Binder(schema)

    def check(outputs: list, args: tuple, kwargs: dict) -> None:
        expected = rule.expected(*binder.bind(args, kwargs))
        for out in outputs:
            if isinstance(out, torch.Tensor) and out.dtype != expected:
                raise RuntimeError(rule.message(expected, out.dtype))

    return check


# ----------------------------------------------------------------------------- derived overloads
def own_defaults(functional: torch._C.FunctionSchema, schema: torch._C.FunctionSchema) -> list[tuple]:
    """``(position, name, default)`` of the arguments PyTorch leaves out where they equal *this*
    schema's defaults, which the functional schema may lack (bernoulli_.float's p=0.5 vs
    bernoulli.p's required p): the derived kernel supplies them."""
    functional_defaults = {a.name: default_of(a) for a in functional.arguments}
    return [
        (i, a.name, default_of(a))
        for i, a in enumerate(schema.arguments)
        if a.has_default_value()
        and not is_out(a)
        and functional_defaults.get(a.name, NO_DEFAULT) != default_of(a)
    ]


def writes_first_only(functional: torch._C.FunctionSchema, schema: torch._C.FunctionSchema) -> bool:
    """Whether a derived overload is an in-place one that writes its first argument alone and
    returns it, its other arguments the functional op's (``add_``, ``mul_.Scalar``): the kind
    the C++ core may serve (``PlannedKernel``'s kWritesFirst)."""
    written = [i for i, a in enumerate(schema.arguments) if is_written(a)]
    return (
        written == [0]
        and not any(map(is_out, schema.arguments))
        and len(schema.returns) == 1
        and not own_defaults(functional, schema)
    )


def _signature(schema, drop_out: bool) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments if not (drop_out and is_out(a))]


def derived_variants(op: torch._ops.OpOverload):
    """In-place and out= overloads whose schema matches the functional ``op`` and whose written
    arguments line up one to one with its outputs; yields (overload, resizes its outputs)."""
    base = op._schema.name.split("::")[1]
    want = _signature(op._schema, drop_out=False)
    outputs = len(op._schema.returns)

    def written(other):
        return [a for a in other._schema.arguments if is_written(a)]

    packet = getattr(aten, base)
    for name in packet.overloads():
        other = getattr(packet, name)
        targets = written(other)
        if (
            other is not op
            and targets
            and all(map(is_out, targets))
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


def mutating_kernel(
    computed: Compute,
    schema: torch._C.FunctionSchema,
    resize: bool,
    out_dtype: OutDtype | None = None,
    own_plans: dict | None = None,
) -> Callable:
    """The kernel of a derived in-place or ``out=`` overload: compute the functional op, then
    store its outputs, in order, into the arguments the schema marks as written (``self`` for
    ``add_``; the five state lists for ``_fused_adam_``; the ``out`` tensors for ``add.out``).
    ``own_plans`` (an overload :func:`writes_first_only` the C++ core serves): see
    :func:`_share_plan`."""
    names = [a.name for a in schema.arguments]
    targets = [(names.index(a.name), a.name) for a in schema.arguments if is_written(a)]
    outs = {a.name for a in schema.arguments if is_out(a)}
    check_overlap = overlap.writes_checker(schema)
    check_resized = overlap.writes_checker(schema, resized=True) if resize else None
    check_dtypes = _out_dtype_checker(out_dtype, schema)
    single, returns, compute = len(targets) == 1, len(schema.returns), computed.call
    defaults = own_defaults(computed.op._schema, schema)

    def kernel(*args, **kwargs):
        written = [args[i] if i < len(args) else kwargs[name] for i, name in targets]
        check_overlap(written, args, kwargs)
        if check_dtypes is not None:
            check_dtypes(written, args, kwargs)
        if outs:
            kwargs = {k: v for k, v in kwargs.items() if k not in outs}
        for i, name, default in defaults:
            if i >= len(args) and name not in kwargs:
                kwargs = {**kwargs, name: default}
        values = compute(args, kwargs)
        stores = list(zip(written, (values,) if single else values))
        if check_resized is None:
            for dst, value in stores:  # one target after another, as CPU writes a list's
                store(dst, value, resize)
            if own_plans is not None and tensor.whole_value(stores[0][0]) is values:
                _share_plan(computed, own_plans, args, kwargs)
        else:  # out= tensors resized onto an input are refused before any is written
            for dst, value in stores:
                fit(dst, value, resize)
            check_resized(written, args, kwargs)
            for dst, value in stores:
                write(dst, value)
        if context.launch_blocking:
            block(values)
        if not returns:
            return None
        return written[0] if returns == 1 else tuple(written[:returns])

    return kernel


def _share_plan(computed: Compute, own_plans: dict, args: tuple, kwargs: dict) -> None:
    """A call whose output became its first argument's whole value hands the functional op's
    native plan of its key (that of its ``Binder.positional`` form) to the overload's."""
    call = computed.binder.positional(args, kwargs) if kwargs else args
    operands = tensor.whole_operands(call, computed.views_in_program)
    plan = None if operands is None else computed.native_plans.get(operands[0])
    if plan is not None:
        own_plans[operands[0]] = plan
