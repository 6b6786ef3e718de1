"""Registering the op table on the PrivateUse1 ("tpu") dispatch key: each lowering's kernel, its
derived in-place and ``out=`` overloads, and the C++ core's ``PlannedKernel`` in front of the
kernels whose planned calls it serves."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ...runtime import native, platform, precision, tensor
from ...runtime.context import context
from ...runtime.flags import flags
from .. import cpu_dtypes
from ..registry import LOWERINGS, Lowering, qualified_name
from . import plans
from .binding import Binder, returns_shape
from .conversion import number
from .errors import check_dtypes
from .kernel import Compute
from .routing import routed_by_device
from .variants import derived_variants, functional_kernel, mutating_kernel, wrap_output, writes_first_only

#: Overloads the dispatcher derived (in-place / out=) -> the functional lowering they use.
DERIVED: dict[torch._ops.OpOverload, torch._ops.OpOverload] = {}
#: The ``native`` lowerings whose PrivateUse1 kernel is the C++ runtime core's (the views),
#: filled by :func:`install`; their Python kernels serve where the core lacks them.
SERVED_BY_THE_CORE: set = set()
#: The libraries holding the registrations (kept alive for the process).
libraries: list = []

#: ``PlannedKernel``'s ``returns``: one contiguous tensor, one laid out like the op's tensor
#: inputs (an elementwise op's, ``tensor.wrap_elementwise``), a tuple (``wrap_output``), or its
#: first argument, into which an in-place variant writes its program's one output
_RETURNS_ONE, _RETURNS_LIKE_INPUTS, _RETURNS_TUPLE, _RETURNS_WRITES_FIRST = range(4)


def _runtime_kernel(op: torch._ops.OpOverload, kernel: Callable) -> Callable:
    """A runtime kernel, refusing the dtypes CPU's kernel refuses (its table entries; unsigned
    dtypes reach the views and copies among these kernels as they reach CPU's)."""
    binder = Binder(op._schema)
    dtype_guard = cpu_dtypes.table_guard(op, binder.names)

    def recorded(*args, **kwargs):
        if flags.attention_needed:
            platform.attend()
        if flags.recorded_ops is not None:
            flags.recorded_ops.add(op)
        if dtype_guard is not None:
            check_dtypes(dtype_guard, op, binder.names, binder.bind(args, kwargs), None, args, kwargs)
        if precision.setting() == "highest":  # (the default: no precision context)
            return kernel(*args, **kwargs)
        return precision.call(kernel, *args, **kwargs)  # (for the programs it runs: ``apply``)

    return recorded


def _is_purely_composite(op: torch._ops.OpOverload) -> bool:
    """CompositeImplicitAutograd with no backend kernel: PyTorch decomposes it before any
    backend sees it, and a tpu kernel would take autograd's path away from it."""
    has = functools.partial(torch._C._dispatch_has_kernel_for_dispatch_key, qualified_name(op))
    return has("CompositeImplicitAutograd") and not has("CPU")


def check_installable(op: torch._ops.OpOverload, nondifferentiable: bool = False) -> None:
    """Refuse lowerings PyTorch would never call, or would call behind autograd's back (a
    composite op whose outputs autograd never tracks, ``nondifferentiable``, may be lowered)."""
    if _is_purely_composite(op) and not nondifferentiable:
        raise RuntimeError(
            f"{op} is CompositeImplicitAutograd: lower the ops it decomposes "
            "into instead (a tpu kernel would bypass autograd)"
        )


# ----------------------------------------------------------------------------- planned kernels
def _servable(entry: Lowering, computed: Compute) -> bool:
    """Whether the C++ core may serve the op's planned calls: it returns one tensor or a tuple
    and does nothing else around its program (no layout rule, shortcut or device argument)."""
    return not (
        computed.native_plans is None
        or entry.layout is not None
        or entry.shortcut is not None
        or returns_shape(entry.op._schema) == "list"
        or "device" in computed.binder.names
    )


def _planned(entry: Lowering, computed: Compute, kernel: Callable) -> Callable:
    """``kernel`` behind the C++ core's ``PlannedKernel``, which serves the calls it has a plan
    for (``computed.native_plans``) with no Python frame (:func:`_servable` ops)."""
    op = entry.op
    if not _servable(entry, computed):
        return kernel
    if returns_shape(op._schema) == "tuple":
        returns = _RETURNS_TUPLE
    else:
        returns = _RETURNS_ONE if entry.promote is None else _RETURNS_LIKE_INPUTS
    return native._C.PlannedKernel(
        kernel, computed.native_plans, op, str(op), computed.views_in_program, returns
    )


def _planned_in_place(variant: torch._ops.OpOverload, own_plans: dict, computed: Compute, kernel: Callable):
    """An in-place overload's ``kernel`` behind a ``PlannedKernel`` serving the calls it has a
    plan for in ``own_plans`` (learned by ``kernel``: ``variants.mutating_kernel``) with no
    Python frame: the functional program's output becomes the first argument's value
    (``tensor.write_whole``), where that argument is its whole storage and shares it with no
    other argument; any other call, or an output of another shape or dtype, goes to ``kernel``."""
    return native._C.PlannedKernel(
        kernel, own_plans, variant, str(variant), computed.views_in_program, _RETURNS_WRITES_FIRST
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


def _kernel(entry: Lowering, computed: Compute) -> Callable:
    from ..meta_check import checked  # TORCH_TPU_CHECK_META (a no-op unless switched on)

    kernel = checked(entry.op, routed_by_device(entry.op, functional_kernel(entry, computed.call)))
    return _planned(entry, computed, kernel)


def kernel_of(entry: Lowering, check_meta: bool = True) -> Callable:
    """The tpu kernel of a lowering that is not in the table: a user's op
    (``torch_tpu.pallas.jax_op``), which then runs, records and traces like an ATen op.
    (``check_meta=False`` for an op that reaches it from its meta call: one with no tensors.)"""
    computed = Compute(entry)
    if not check_meta:
        return routed_by_device(entry.op, functional_kernel(entry, computed.call))
    return _kernel(entry, computed)


# ----------------------------------------------------------------------------- install
def _configure_core() -> None:
    """Tell the C++ core what ``PlannedKernel`` reads of the state an op's call runs in, and
    check its plan records' fields against ours."""
    native._C.configure_plans(
        context,
        tensor.wrap,
        tensor.wrap_elementwise,
        number,
        wrap_output,
        tensor.write_whole,
        plans.field_names(),
    )


def _install_variants(lib, entry: Lowering, computed: Compute, explicit: set) -> None:
    """Register the in-place and ``out=`` overloads derived from ``entry``'s op."""
    from ..meta_check import checked

    op = entry.op
    for variant, resize in derived_variants(op):
        if variant in explicit or variant in DERIVED:
            continue
        DERIVED[variant] = op
        plannable = not resize and _servable(entry, computed) and returns_shape(op._schema) == "one"
        plannable = plannable and writes_first_only(op._schema, variant._schema)
        own_plans = {} if plannable else None
        mutating = checked(
            variant, mutating_kernel(computed, variant._schema, resize, entry.out_dtype, own_plans)
        )
        if plannable:
            _register_kernel(lib, variant, _planned_in_place(variant, own_plans, computed, mutating))
        else:
            lib.impl(variant, mutating, "PrivateUse1")


def install() -> None:
    """Register every lowering (and its derived variants) on PrivateUse1. Strict: errors on
    lowerings of CompositeImplicitAutograd ops (autograd would bypass them) or of non-ATen ops."""
    from .. import sparse
    from ..meta_check import checked  # TORCH_TPU_CHECK_META (a no-op unless switched on)
    from .fallback import fallback

    if native.available():
        _configure_core()
    lib = torch.library.Library("aten", "IMPL")
    libraries.append(lib)
    explicit = set(LOWERINGS)
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    for op, entry in LOWERINGS.items():
        check_installable(op, entry.nondifferentiable)
        if entry.native and has_kernel(qualified_name(op), "PrivateUse1"):
            SERVED_BY_THE_CORE.add(op)  # (no core, or one built before it had this kernel: ours)
            continue
        if entry.runtime:
            kernel = routed_by_device(op, _runtime_kernel(op, entry.fn), lowered=False)
            lib.impl(op, checked(op, kernel), "PrivateUse1")
            continue
        # one Compute (and so one set of compiled executables) serves the op and its variants
        computed = Compute(entry)
        _register_kernel(lib, op, _kernel(entry, computed))
        _install_variants(lib, entry, computed, explicit)
    sparse.install(fallback)
