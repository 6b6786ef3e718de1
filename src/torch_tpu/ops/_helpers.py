"""Family helpers: most lowerings are one line built from these."""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..execution.fused import check_key
from ..runtime import checks
from ..runtime.buffer import apply
from ..runtime.context import context
from ..runtime.dtypes import FLOAT8_JAX, cast, check_scalar, item_name, to_jax, to_torch, type_name  # noqa: F401  (type_name: for op modules)
from ..runtime.host_copies import host_copy, host_range
from ..runtime.transfer import number_of
from .padding import POINTWISE
from .registry import OutDtype, Promote, lower

_LIBRARIES = tuple(os.path.dirname(m.__file__) for m in (torch, sys.modules["torch_tpu"]))


def structured_out(expected: Callable[..., torch.dtype]) -> OutDtype:
    """The out= dtype rule of PyTorch's structured kernels outside TensorIterator: the outputs
    must have the result's dtype, ``expected`` from the op's arguments."""
    return OutDtype(
        expected,
        lambda want, got: (
            f"Expected out tensor to have dtype {item_name(want)}, but got {item_name(got)} instead"
        ),
    )


def input_dtype(x, *_) -> torch.dtype:
    return x.dtype


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn as PyTorch's ``TORCH_WARN`` does: attributed to the user's line that called the op
    (the first frame outside torch and torch_tpu), so filters and ``-W error`` treat it alike."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
        frame = frame.f_back
    warnings.warn_explicit(
        message,
        category,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=frame.f_globals.get("__name__"),
        registry=frame.f_globals.setdefault("__warningregistry__", {}),
    )


def overload(packet, name: str):
    """``packet.<name>`` if that overload exists and takes a Tensor ``self``, else None
    (some packets also hold TorchScript number overloads such as ``aten::copysign(float, float)``)."""
    if name not in packet.overloads():
        return None
    op = getattr(packet, name)
    args = op._schema.arguments
    return op if args and args[0].name == "self" and str(args[0].type) == "Tensor" else None


def unary(op, fn: Callable, promote: Promote = Promote.DEFAULT, **options) -> None:
    """``op(self)`` computed as ``fn`` in the promoted compute dtype, returned in the result dtype."""
    options.setdefault("pad", POINTWISE)
    lower(op, promote=promote, promote_args=("self",), **options)(
        lambda x, *, types: fn(x.astype(types.compute)).astype(types.result)
    )


def converted(value, dtype) -> jax.Array:
    """An operand (or a Python number) in the dtype an op computes in: into a float8 dtype with
    c10's rounding (``cast``: e4m3fn saturating, e8m0 by its exponent), else as XLA converts."""
    return cast(value, dtype) if dtype in FLOAT8_JAX else jnp.asarray(value, dtype)


def binary(op, fn: Callable, promote: Promote = Promote.DEFAULT, **options) -> None:
    """``op(self, other)`` with PyTorch's type promotion (scalars and 0-dim tensors included)."""
    operands = tuple(a.name for a in op._schema.arguments[:2])
    options.setdefault("pad", POINTWISE)
    lower(op, promote=promote, promote_args=operands, **options)(
        lambda x, y, *, types: fn(converted(x, types.compute), converted(y, types.compute)).astype(
            types.result
        )
    )


def predicate(op, fn: Callable, **options) -> None:
    """``op(self, other) -> bool``, comparing in the promoted dtype."""
    binary(op, fn, promote=Promote.ALWAYS_BOOL, **options)


def accumulator(dtype) -> np.dtype:
    """The dtype torch CPU accumulates ``dtype`` in (its "opmath"): float32 for the half types."""
    return np.dtype(jnp.float32) if dtype in (jnp.float16, jnp.bfloat16) else np.dtype(dtype)


def result_dtype(*dtypes) -> jnp.dtype:
    """The dtype PyTorch promotes these (non-scalar) tensor dtypes to (``torch.promote_types``)."""
    result = to_torch(dtypes[0])
    for dtype in dtypes[1:]:
        result = torch.promote_types(result, to_torch(dtype))
    return np.dtype(to_jax(result))


def host_number(value) -> bool | int | float | complex | None:
    """The Python number behind a Scalar argument (the dispatcher hands one over as a weakly
    typed device scalar, whose host value JAX keeps); None for a tensor's value or in a trace."""
    if isinstance(value, (bool, int, float, complex)):
        return value
    number = number_of(value)  # (the dispatcher's scalars: no device read)
    if number is not None:
        return number
    if isinstance(value, jax.Array) and value.weak_type and not isinstance(value, jax.core.Tracer):
        return value.item()
    return None


def check_number_fits(value, dtype, numel: int) -> bool:
    """CPU's conversion of a Scalar argument's number into ``dtype`` (filling ``numel``
    elements, see ``check_scalar``), refusing one it cannot hold; False where ``value`` has no
    number on the host (a tensor's value, or a traced one), which is left unchecked here."""
    number = host_number(value)
    if number is None:
        return False
    check_scalar(number, dtype, numel)
    return True


def has_values(array) -> bool:
    """Whether a value check can look at ``array``: not under a JAX transformation (``jax.vmap``...)
    other than a compiled program's trace (``context.trace``), whose results it reports."""
    return context.trace is not None or not isinstance(array, jax.core.Tracer)


def apply_check(fn: Callable, *args: Any) -> Any:
    """``apply`` for the small program of a value check. While a fused graph records, a check
    whose inputs are computed already (a batch of indices from the host), or take a few of the
    graph's ops over such inputs (``torch.arange``'s positions, a view of the batch), runs at
    once (``Graph.computed_apart``). It is still reported with the graph
    (``checks.when_ready``), but reporting it waits for this program alone. Recorded, its
    result would come with the whole graph: the end of ``backward()``, which reports the
    step's checks, would wait for the forward and backward to finish computing, instead of
    the optimizer's ops being recorded while they run. A check of the same values again while
    the graph records (``execution.fused.check_key``) reuses the first one's result."""
    recorder = context.recorder
    if recorder is None or context.trace is not None:
        return apply(fn, *args)
    graph = recorder.open_graph()  # (the op's: a graph that ran keeps no results of checks)
    key = check_key(fn, args)
    known = graph.checked.get(key) if key is not None else None
    if known is not None:
        return known[1]
    result = graph.computed_apart(fn, args)
    if result is None:
        result = apply(fn, *args)
    if key is not None and recorder.graph is graph:  # (the arguments kept: their ids stay theirs)
        graph.checked[key] = (args, result)
    return result


def report_values(results, report: Callable[[Any], None], flags: list | None = None) -> None:
    """Call ``report`` with the host values of ``results`` (small arrays a value check computed
    with ``apply``), which raises PyTorch's error if they show one: at once in strict eager; in
    fused eager and compiled programs, with the graph or program that computes them, reported
    where a value depending on them is read (``runtime.checks``). ``flags``: leaves of
    ``results`` all False when ``report`` would pass (``checks.Check.flags``)."""
    if context.trace is not None:
        context.trace.check(results, report)
    else:
        checks.when_ready(results, report, flags)


def _first_out_of_bounds_in(xp, index, low, high, ignore=None) -> tuple:
    """(whether an entry of ``index`` other than ``ignore`` lies outside [low, high), the first
    such entry, its flat position), computed by ``xp`` (``jnp`` on the device, ``np`` on the
    host)."""
    flat = index.reshape(-1)
    if ignore is not None:
        flat = xp.where(flat == ignore, low, flat)
    bad = (flat < low) | (flat >= high)
    first = xp.argmax(bad)
    return xp.any(bad), flat[first], first


_first_out_of_bounds = jax.jit(functools.partial(_first_out_of_bounds_in, jnp))


def _out_of_bounds(index, low: int, high: int, ignore: int | None) -> tuple | None:
    """:func:`_first_out_of_bounds_in` of a non-empty ``index``: on its host copy if it was
    copied from the host (no program, no wait; None when every entry is in bounds, the common
    case, taken from its range alone), else as a small program on the device (None: ``index``
    is traced by a JAX transformation, with no values to check)."""
    known = host_range(index)
    if known is not None:
        if low <= known[0] and known[1] < high:
            return None
        return _first_out_of_bounds_in(np, host_copy(index), low, high, ignore)
    if index.size and has_values(index):
        return apply_check(_first_out_of_bounds, index, low, high, ignore)
    return None


def check_bounds(
    checks: Sequence[tuple[jax.Array, int, bool]],
    error: Callable[[int, int, int], Exception],
    ignore: int | None = None,
    by_element: bool = False,
) -> None:
    """Raise ``error(position, value, size)`` for the first index outside its dimension
    (``position``: which of ``checks``; ``by_element``: the bad entry's flat position in it).

    ``checks`` holds ``(index, size, negative_allowed)``; all are checked with one host sync
    (:func:`report_values`). Indices equal to ``ignore`` (a loss's ``ignore_index``) pass.
    """
    results, where = [], []  # (where: not the index arrays: a check kept with a fused graph
    # must not keep the graph's values, and so the graph, alive)
    for position, (index, size, negative_ok) in enumerate(checks):
        result = _out_of_bounds(index, -size if negative_ok else 0, size, ignore)
        if result is not None:
            results.append(result)
            where.append((position, size))
    if not results:
        return

    def report(results) -> None:
        for (position, size), (any_bad, value, element) in zip(where, results):
            if any_bad:
                raise error(int(element) if by_element else position, int(value), size)

    report_values(results, report, flags=[any_bad for any_bad, _, _ in results])


@functools.partial(jax.jit, static_argnums=1)
def _has_zero(divisor: jax.Array, dtype) -> jax.Array:
    return jnp.any(jnp.asarray(divisor, dtype) == 0)


def _zero_division(has_zero) -> None:
    if has_zero:
        raise RuntimeError("ZeroDivisionError")  # CPU's exception, message and all


#: (id of a number's device scalar, dtype) -> (the scalar, whether it is 0 in that dtype): the
#: scalar held, so that its id is not another's while it is here
_ZERO_NUMBERS: dict[tuple[int, Any], tuple[jax.Array, bool]] = {}


def _is_zero_number(divisor, dtype) -> bool:
    """Whether a number (as the dispatcher's cached device scalar) is 0 once in ``dtype``
    (``x // 256`` on uint8 divides by zero), decided once per scalar and dtype."""
    key = (id(divisor), dtype)
    known = _ZERO_NUMBERS.get(key)
    if known is not None and known[0] is divisor:
        return known[1]
    zero = bool(np.asarray(divisor).astype(dtype) == 0)
    if len(_ZERO_NUMBERS) >= 256:
        _ZERO_NUMBERS.clear()
    _ZERO_NUMBERS[key] = (divisor, zero)
    return zero


def check_nonzero(divisor, dtype) -> None:
    """Raise CPU's error for an integer division whose ``divisor``, converted to the integer
    ``dtype`` it divides in, holds a zero (XLA would return an arbitrary value).

    A Python number, or the weakly typed device copy the dispatcher made of one (JAX keeps its
    host value), is checked at once, even in fused eager; a tensor as :func:`check_bounds` does.
    """
    python_scalar = isinstance(divisor, (int, float)) or (
        getattr(divisor, "weak_type", False)
        and isinstance(divisor, jax.Array)
        and not isinstance(divisor, jax.core.Tracer)
        and divisor.ndim == 0  # (a weakly typed array of several elements is a tensor's)
    )
    if python_scalar and context.trace is None:
        _zero_division(_is_zero_number(divisor, dtype))
    elif has_values(divisor):
        report_values(apply(_has_zero, divisor, np.dtype(dtype)), _zero_division)


def check_values(
    holds: Callable[..., jax.Array], values: Sequence[jax.Array], error: Callable[[], Exception]
) -> None:
    """Raise ``error()`` unless ``holds(*values)`` (a jitted function returning a boolean
    scalar) is true: checked like :func:`check_bounds`. Values that are Python numbers were
    already checked by the caller."""
    if not all(hasattr(v, "size") and v.size and has_values(v) for v in values):
        return

    def report(ok) -> None:
        if not ok:
            raise error()

    report_values(apply(holds, *values), report)
