"""The plans a kernel keeps for calls that repeat: what its fast path reuses in Python
(:class:`FastPlan`) and what the C++ core's ``PlannedKernel`` serves with no Python frame
(:class:`NativePlan`, :class:`NativeRule`, :class:`HostRule`).

The C++ core reads the native records by field; their field names are declared here and in
``csrc/runtime`` (``kPlanFields``...), and ``configure_plans`` checks the two agree at load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .binding import NO_DEFAULT
from .conversion import FittedNumber, exact_static, indices_to_jax, number, static_arg, to_program_arg


class FastPlan(NamedTuple):
    """What the fast path reuses for calls with one key: the program, the converted defaults of
    the trailing arguments, the default dtype it was kept under, and ``(position, schema default,
    converter)`` of each argument converted at every call."""

    program: Callable | None
    defaults: tuple | None
    default_dtype: torch.dtype | None
    rules: tuple


#: A fast-path key no plan can serve (its list or dtype arguments are beyond the key): whether
#: one can is decided by the key alone, so it is asked once
NO_PLAN = FastPlan(None, None, None, ())


class HostRule(NamedTuple):
    """What the C++ core calls where a planned call's operand has a host copy."""

    #: (arguments, output) -> None: keeps the output's host copy (``dispatch.programs.shadow``)
    shadow: Callable
    #: ``host_copies.host_copies_by_id``: the values that have one
    copies: dict


class NativeRule(NamedTuple):
    """How the C++ core converts one argument of a planned call (``how``: one of the ``NATIVE_*``)."""

    position: int
    how: int
    default: Any
    #: a number's own conversion (a :class:`FittedNumber`); None: ``conversion.number``
    convert: Callable | None = None


class NativePlan(NamedTuple):
    """A :class:`FastPlan` the C++ core serves: its conversions as :class:`NativeRule` s, and what
    the core needs around the program."""

    program: Callable
    defaults: tuple
    default_dtype: torch.dtype
    rules: tuple
    #: whether a rule reads a view (``NATIVE_VIEW``), which strict eager reads apart: Python's
    reads_views: bool
    host_rule: HostRule | None
    #: the op's check (``Lowering.check``), called with the converted arguments first
    check: Callable | None
    #: whether the program is recorded while a graph records (a traced lowering's); an eager
    #: one, Python that records its own pieces, is called
    traced: bool


#: How the C++ core converts an argument of a planned call (``PlannedKernel``): a static one as
#: ``conversion.static`` does (one ``exact_static`` would change is left to Python), a number as
#: ``conversion.number`` does (None where it equals its default; a rule's ``convert``, a
#: :class:`FittedNumber`, converts it instead), a view its op's program reads as
#: ``to_program_arg`` hands it to a fused graph's node (``tensor.read_in_program``; strict
#: eager reads such views apart: Python does), a list of indices as ``indices_to_jax`` makes it
#: where each is None or a whole tpu tensor (others: Python)
NATIVE_STATIC, NATIVE_NUMBER, NATIVE_VIEW, NATIVE_INDICES = 0, 1, 2, 3


def native_rules(rules: tuple, args: tuple) -> tuple | None:
    """A fast plan's conversions (``(position, default, converter)``) of a call with ``args`` as
    the C++ core does them; None where one is beyond it (a view read apart, a list of tensors).
    (A None stays None: the key tells that it is None.)"""
    native = []
    for i, default, convert in rules:
        if convert is number:
            native.append(NativeRule(i, NATIVE_NUMBER, default))
        elif type(convert) is FittedNumber:  # (the core calls it instead of number)
            native.append(NativeRule(i, NATIVE_NUMBER, default, convert))
        elif (convert in (None, static_arg, exact_static) or args[i] is None) and default is NO_DEFAULT:
            native.append(NativeRule(i, NATIVE_STATIC, None))
        elif convert is to_program_arg and isinstance(args[i], torch.Tensor):
            native.append(NativeRule(i, NATIVE_VIEW, None))
        elif convert is indices_to_jax and default is NO_DEFAULT:
            native.append(NativeRule(i, NATIVE_INDICES, None))
        else:
            return None
    return tuple(native)


def field_names() -> dict[str, tuple[str, ...]]:
    """The native records' fields, as ``configure_plans`` compares them with the core's."""
    return {"NativePlan": NativePlan._fields, "NativeRule": NativeRule._fields, "HostRule": HostRule._fields}
