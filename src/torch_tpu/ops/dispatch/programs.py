"""What wraps a lowering into the program a kernel runs: arguments read back in its trace,
random keys, outputs transposed into their memory order, padded values, host copies of small
integer results."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...runtime import host_copies, precision, random, tensor
from ...runtime.buffer import Padded
from .. import padding as padding_rules


def transposing(fn: Callable, orders: tuple) -> Callable:
    """``fn`` returning each output that has an order in ``orders`` transposed into it (several
    outputs as a plain tuple: what the layout's wrapping reads)."""

    def run(*args, **kwargs):
        outs = fn(*args, **kwargs)
        if not isinstance(outs, (tuple, list)):
            return outs.transpose(orders[0])
        return tuple(o if o is None or d is None else o.transpose(d) for o, d in zip(outs, orders))

    return run


def reading_arguments(fn: Callable, readers: list[tuple[int, Callable]]) -> Callable:
    """``fn`` given each positional argument ``i`` as ``read(value)``, for each ``(i, read)`` in
    ``readers`` (a jitted lowering's: it runs when JAX traces, not at every call)."""

    def run(*values, **kwargs):
        values = list(values)
        for i, read in readers:
            values[i] = read(values[i])
        return fn(*values, **kwargs)

    return functools.wraps(fn)(run)


def or_default(default: Any) -> Callable:
    """A reader giving ``default`` for an argument passed as None (a scalar left at its schema
    default: a constant of the program)."""
    return lambda value: default if value is None else value


def keyed(fn: Callable) -> Callable:
    """A random lowering given :func:`random.next_key`'s draw, whose key its program makes."""

    def run(*values, key, **kwargs):
        return fn(*values, key=random.key_of(key), **kwargs)

    return functools.wraps(fn)(run)


# ----------------------------------------------------------------------------- padded values
def holds_padded(values: list) -> bool:
    """Whether an op's converted arguments include a padded value (a tensor list's included)."""
    for v in values:
        kind = type(v)
        if kind is Padded or (kind is list and any(type(x) is Padded for x in v)):
            return True
    return False


def unpadded(value: Any) -> Any:
    if type(value) is Padded:
        return value.unpadded()
    if type(value) is list:
        return [unpadded(v) for v in value]
    return value


def run_padded(rule, lowered: Callable, values: list, extra: dict, names, index: int) -> Any:
    """The op's padded outputs (``ops.padding.run``) on ``tpu:index``, under the matmul precision
    now; None where the rule does not serve the call or its program fails (the unpadded path then
    runs, and raises the op's own error if the call is wrong)."""
    try:
        return precision.call(padding_rules.run, rule, lowered, values, extra, names, index)
    except Exception:  # noqa: BLE001  (a wrong call's error names padded sizes: raised unpadded)
        return None


# ----------------------------------------------------------------------------- host copies
#: The most elements a result computed on the host too (``Lowering.host``) may have: numpy's
#: cost per op stays below the op's own
HOST_SHADOW_ELEMENTS = 4096


def is_integral(result: Any) -> bool:
    """Whether ``result`` is an integer array, which an op with a host rule computes on the host
    too where it is small (positions, lengths: what bounds checks read)."""
    dtype = getattr(result, "dtype", None)
    return dtype is not None and dtype.kind in "iu"


def shadow(rule: Callable, args: tuple, result: Any, kwargs: dict | None = None) -> None:
    """Keep ``rule``'s result over the host copies of the call's arguments as ``result``'s host
    copy (``host_copies.host_copy``), where every tensor among them has one (or is a 0-dim CPU
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
        host_copies.keep_host_copy(result, host, shared=True)
