"""``torch.set_float32_matmul_precision`` on tpu.

PyTorch's setting (process-wide, as on CUDA) picks how float32 (and complex64) matrix products
run: "highest" (the default) computes them in full float32, as PyTorch CPU does; "high" and
"medium" let XLA use its faster passes, ``Precision.HIGH`` (bfloat16_3x on a TPU) and
``Precision.DEFAULT`` (one bfloat16 pass), as CUDA uses TF32 for them. Lowerings ask
:func:`matmul_precision` while they are traced; every program is traced and cached under the
setting of the moment (:func:`scope` sets JAX's ``default_matmul_precision``, which JAX's own
executable caches key on; fused graphs and compiled programs key theirs on :func:`current`), so
a change never reuses a program built under another setting. XLA:CPU computes all three alike.

Example::

    torch.set_float32_matmul_precision("high")
    y = x @ w  # bfloat16_3x passes on a TPU
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import torch
from jax import lax

#: PyTorch's setting -> JAX's ``default_matmul_precision`` name (None: full precision)
_JAX_NAMES = {"highest": None, "high": "high", "medium": "default"}
_LAX = {None: lax.Precision.HIGHEST, "high": lax.Precision.HIGH, "default": lax.Precision.DEFAULT}
_SETTABLE = (jnp.float32, jnp.complex64)
#: PyTorch's float32 matmul precision setting ("highest", its default, "high" or "medium"): the
#: per-op path tests it and calls a program directly for "highest" (no :func:`call` frame)
setting = torch._C._get_float32_matmul_precision


def current() -> str | None:
    """The JAX name of PyTorch's float32 matmul precision now (None for "highest")."""
    return _JAX_NAMES[setting()]


def scope(name: str | None):
    """A context tracing and running programs under precision ``name`` (from :func:`current`)."""
    return contextlib.nullcontext() if name is None else jax.default_matmul_precision(name)


def current_scope():
    """:func:`scope` of the setting now."""
    return scope(current())


def call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` under the setting now: on the hot path, no context at all for
    "highest", the default."""
    name = current()
    if name is None:
        return fn(*args, **kwargs)
    with jax.default_matmul_precision(name):
        return fn(*args, **kwargs)


def matmul_precision(dtype) -> lax.Precision:
    """The precision a lowering gives a matrix product of ``dtype`` operands, while traced:
    float32/complex64 as the setting says, every other dtype full (float64 as on CPU; half
    types' products are exact in their float32 accumulators anyway)."""
    if jnp.dtype(dtype) in _SETTABLE:
        return _LAX[jax.config.jax_default_matmul_precision]
    return lax.Precision.HIGHEST
