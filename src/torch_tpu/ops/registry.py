"""The op table: one pure-JAX lowering per functional ATen overload.

A lowering takes ``jax.Array``s and Python values in the order of the ATen schema (``out=``
arguments left out) and returns arrays. Everything a lowering needs from torch-level metadata is
computed by the dispatcher and handed in as keywords: ``types`` (the promoted compute/result
dtypes, when ``promote=`` is given) and ``key`` (a fresh PRNG key, when ``random=True``).

In-place and ``out=`` overloads are derived from the schema by the dispatcher, never written here.
``runtime`` entries are the few kernels that manage tensors themselves (factories, copies, views).
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Promote

__all__ = ["Layout", "Lowering", "LOWERINGS", "OutDtype", "Promote", "Runs", "Types", "lower", "runtime"]


class Types(NamedTuple):
    """Dtypes an elementwise op computes in and returns (``torch.result_type`` rules)."""

    compute: np.dtype
    result: np.dtype


class Runs(enum.Enum):
    """How a lowering runs, which is also when fused eager must leave its graph for it."""

    #: A pure JAX function: jitted in strict eager, recorded as a node of fused eager's graph,
    #: traced into compiled programs. Never leaves the graph.
    TRACED = "traced"
    #: Python that runs at once and routes its own jitted pieces through ``buffer.apply`` (so
    #: they are recorded in fused eager): factories that read global state such as the default
    #: dtype, ops that look at their inputs' dtypes to choose a path. Never leaves the graph by
    #: itself (a piece that needs host values, a boolean mask's coordinates, reads them).
    EAGER = "eager"
    #: Needs its inputs' values on the host (an output shape that depends on them, a
    #: factorization that reports failures by value): the graphs computing the inputs run
    #: first, and the op runs on concrete arrays.
    HOST = "host"


class Layout(enum.Enum):
    """How the outputs of an op PyTorch does not return row-major are laid out (``ops.layout``)."""

    #: as PyTorch's meta kernel lays them out (which CPU follows for the ops that use it)
    META = "meta"
    #: matrices column-major (LAPACK's convention), where meta differs from CPU
    COLUMN_MAJOR = "column_major"
    #: as ``torch.empty_like(input, memory_format=memory_format)`` (``*_like`` factories)
    LIKE = "like"
    #: outputs of the input's rank in the memory format the input suggests (channels-last
    #: stays channels-last), as CPU's kernels do where the meta kernel returns contiguous
    SUGGESTED = "suggested"
    #: as CPU's convolution: channels-last when the input or the weight suggests it (except
    #: 5-d float64, which CPU convolves in its contiguous-only kernel)
    CONVOLUTION = "convolution"


class OutDtype(NamedTuple):
    """The dtype an ``out=`` variant's outputs must have, where CPU's kernel demands one (not
    TensorIterator's cast rule, the default) and says so before its other checks."""

    #: the functional op's arguments -> the dtype every output must have
    expected: Callable[..., torch.dtype]
    #: (expected, given) -> CPU's message
    message: Callable[[torch.dtype, torch.dtype], str]


@dataclasses.dataclass(frozen=True)
class Lowering:
    op: torch._ops.OpOverload
    fn: Callable
    runtime: bool = False  # fn receives torch tensors and returns them (no JAX in between)
    promote: Promote | None = None
    promote_args: tuple[str, ...] | None = None  # which arguments take part (default: all)
    random: bool = False
    runs: Runs = Runs.TRACED
    static: tuple[str, ...] = ()  # Scalar arguments that must be compile-time constants
    dynamic: tuple[str, ...] = ()  # float/int arguments passed as device scalars (no recompiles)
    # Scalar arguments CPU's kernel converts into the op's result dtype, refusing a number that
    # dtype cannot hold (``Scalar::to<scalar_t>``: ``x.add(y, alpha=300)`` on uint8, an alpha
    # of 1e39 on float32); ``fitted_in_opmath``: those it converts into float32 for a
    # half-precision result (``opmath_t``), into the result dtype otherwise
    fitted: tuple[str, ...] = ()
    fitted_in_opmath: tuple[str, ...] = ()
    # Validates the arguments before the lowering runs (same arguments as ``fn``) and raises
    # PyTorch's exception: shape and dtype checks directly, value checks (index bounds) through
    # ``check_bounds``/``checks.when_ready``, which in fused eager and compiled programs run with
    # the graph and report later. A check never needs host values itself.
    check: Callable | None = None
    # The check reads only how many tensors each ``Tensor[]`` argument holds (a foreach op's):
    # views in those lists may still reach the op's program unread, as where there is no check
    check_lists_by_length: bool = False
    family: str = ""  # the ops module that registered it (docs/ops.md's sections)
    layout: Layout | None = None  # outputs not row-major in PyTorch (None: row-major)
    out_dtype: OutDtype | None = None  # the out= variant's dtype rule (None: the cast rule)
    # A faster way for some calls, tried first on the functional overload's tpu tensors: returns
    # the result, or None for the calls it does not cover (which then run ``fn``)
    shortcut: Callable | None = None
    # The same result computed by numpy from the host copies of the call's arguments
    # (``host_copies.host_copy``: small integer tensors copied from the host, ranges, and results of
    # such rules), given them in the result's dtype (same arguments as ``fn``, numbers as they
    # are): kept as the host copy of a small integer result, so that a bounds check over it
    # (a cache's positions, computed from its length) reads no device value
    host: Callable | None = None
    # Tensor arguments whose buffers strict eager donates to the computation (``jax.jit``'s
    # ``donate_argnums``); graphs and compiled programs donate by their own rules
    donate: tuple[str, ...] = ()
    # A user's op (``torch_tpu.pallas.jax_op``): not an ATen overload, so no CPU kernel whose
    # dtype refusals to mirror
    custom: bool = False
    # The C++ runtime core registers its own kernel for this op (the views): ``fn`` serves only
    # where no such kernel is registered
    native: bool = False
    # A CompositeImplicitAutograd op whose outputs are never differentiable (``isclose``'s
    # booleans): its tpu kernel takes nothing from autograd, and runs one program where the
    # decomposition would run a dozen ops (each compiled per shape and dtype)
    nondifferentiable: bool = False
    # How the op runs on values padded to size buckets (``ops.padding``: a rule object with a
    # ``plan(values, names)``); None: its padded inputs are read unpadded (a program per shape).
    # The op's ``check``, if any, sees padded operands as their logical shapes and dtypes
    pad: object = None


LOWERINGS: dict[torch._ops.OpOverload, Lowering] = {}


def qualified_name(op: torch._ops.OpOverload) -> str:
    """``aten::add.Tensor`` (``aten::relu`` for the default overload)."""
    name = op._schema.name
    return name if op._overloadname == "default" else f"{name}.{op._overloadname}"


def _overloads(ops) -> Iterable[torch._ops.OpOverload]:
    for op in ops:
        if isinstance(op, torch._ops.OpOverloadPacket):
            op = op.default
        if not isinstance(op, torch._ops.OpOverload):
            raise TypeError(f"expected an ATen OpOverload, got {op!r}")
        yield op


def _add(entry: Lowering) -> None:
    if entry.op in LOWERINGS:
        raise RuntimeError(f"duplicate tpu lowering for {entry.op}")
    LOWERINGS[entry.op] = entry


def _registering_module() -> str:
    """The ops module a registration comes from, looking through the registry and the family
    helpers (``unary``, ``binary``...) that call ``lower`` on a module's behalf."""
    frame = sys._getframe(2)
    while frame.f_globals["__name__"] in (__name__, "torch_tpu.ops._helpers"):
        frame = frame.f_back
    return frame.f_globals["__name__"].rsplit(".", 1)[-1]


def lower(*ops, **options) -> Callable:
    """Register ``fn`` as the pure-JAX lowering of each overload in ``ops``.

    Example::

        @lower(aten.sin.default, promote=Promote.INT_TO_FLOAT)
        def sin(x, *, types):
            return jnp.sin(x.astype(types.compute)).astype(types.result)
    """
    options.setdefault("family", _registering_module())
    if "pad" not in options and options.get("promote") is not None:
        # TensorIterator's ops compute each element from the inputs' elements at its position
        # (reductions and the ops that broadcast otherwise say so: pad=None or their own rule)
        from .padding import POINTWISE

        options["pad"] = POINTWISE

    def register(fn: Callable) -> Callable:
        for op in _overloads(ops):
            _add(Lowering(op, fn, **options))
        return fn

    return register


def runtime(*ops, native: bool = False) -> Callable:
    """Register a kernel that works on tpu tensors directly (factories, copies, views);
    ``native``: one the C++ runtime core's kernel replaces where it registered one."""
    return lower(*ops, runtime=True, native=native)
