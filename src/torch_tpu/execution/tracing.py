"""Tracing the eager lowerings into one JAX function (``torch.compile`` and export).

While a trace is active, tpu storages hold JAX tracers instead of arrays, and every op runs
through the same dispatcher and lowerings as in eager; ``jax.jit`` sees one program. Two things
cannot be baked into that program as constants, so they become its inputs and outputs:

- random ops draw their keys from a key that is an input of the traced function (fresh on every
  call, from the tpu generator), so dropout differs between steps and follows ``manual_seed``;
- value checks (index bounds) cannot raise inside XLA: their results become extra outputs,
  reported after the call the way fused eager reports them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax

from ..runtime.context import context

#: What JAX raises when traced code needs a concrete value (an output shape that depends on
#: data, a host-side check): the compiled program names the op instead.
NEEDS_VALUES = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerBoolConversionError,
)


class Trace:
    """What one trace of a program collects besides its outputs."""

    def __init__(self, key: jax.Array):
        self.key = key
        self.draws = 0
        self.origin = ""  # the op being traced, for errors of its checks
        self.checks: list[tuple[Any, Callable[[Any], None], str]] = []

    def next_key(self) -> jax.Array:
        key = jax.random.fold_in(self.key, self.draws)
        self.draws += 1
        return key

    def check(self, values: Any, callback: Callable[[Any], None]) -> None:
        """Report ``callback(host values)`` after the traced program has run."""
        self.checks.append((values, callback, self.origin))


@contextlib.contextmanager
def tracing(key: jax.Array) -> Iterator[Trace]:
    """Trace in this thread (``context.trace``) until the block ends; fused recording is off."""
    outer = context.trace, context.recorder
    context.trace, context.recorder = Trace(key), None
    try:
        yield context.trace
    finally:
        context.trace, context.recorder = outer
