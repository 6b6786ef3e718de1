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
import sys
from typing import Callable, Iterable, NamedTuple, Optional

import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Promote

__all__ = ["Lowering", "LOWERINGS", "Promote", "Types", "lower", "runtime"]


class Types(NamedTuple):
    """Dtypes an elementwise op computes in and returns (``torch.result_type`` rules)."""

    compute: np.dtype
    result: np.dtype


@dataclasses.dataclass(frozen=True)
class Lowering:
    op: torch._ops.OpOverload
    fn: Callable
    runtime: bool = False          # fn receives torch tensors and returns them (no JAX in between)
    promote: Optional[Promote] = None
    promote_args: Optional[tuple[str, ...]] = None  # which arguments take part (default: all)
    random: bool = False
    jit: bool = True               # False for data-dependent output shapes (nonzero, unique, ...)
    fusable: bool = False          # jit=False, but takes fused eager's deferred inputs itself
    static: tuple[str, ...] = ()   # Scalar arguments that must be compile-time constants
    dynamic: tuple[str, ...] = ()  # float/int arguments passed as device scalars (no recompiles)
    # Runs on the concrete arrays before the jitted lowering, for value checks XLA cannot raise
    # (index bounds): same arguments as ``fn``, raises PyTorch's exception. In fused eager the
    # inputs are still deferred: a check marked with :func:`fusable_check` takes them as they
    # are (shape checks, and value checks through ``check_bounds``, which run with the graph);
    # any other check makes the graph run first.
    check: Optional[Callable] = None
    family: str = ""               # the ops module that registered it (docs/ops.md's sections)


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

    def register(fn: Callable) -> Callable:
        for op in _overloads(ops):
            _add(Lowering(op, fn, **options))
        return fn
    return register


def fusable_check(check: Callable) -> Callable:
    """Mark a ``check=`` function as safe on fused eager's deferred inputs (see ``Lowering``)."""
    check.fusable = True
    return check


def runtime(*ops) -> Callable:
    """Register a kernel that works on tpu tensors directly (factories, copies, views)."""
    return lower(*ops, runtime=True)
