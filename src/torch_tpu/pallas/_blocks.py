"""What Pallas TPU kernels share: Mosaic's grid semantics, block lengths, padding to them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu


def compiler_params(*semantics: str) -> pltpu.CompilerParams:
    """Mosaic's grid semantics: ``"parallel"`` axes may be split across cores, ``"arbitrary"``
    ones run in order (they carry an accumulator in scratch or a resident output block)."""
    return pltpu.CompilerParams(dimension_semantics=semantics)


def pad_to(x: jax.Array, axis: int, multiple: int) -> jax.Array:
    """``x`` with zeros appended along ``axis`` up to a multiple of ``multiple``."""
    extra = -x.shape[axis] % multiple
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def block(size: int, preferred: int) -> int:
    """A block length for a dimension of ``size``: ``preferred`` (a multiple of the TPU tile),
    or the whole dimension when it is shorter (a block equal to its array's dimension is always
    allowed)."""
    return size if size <= preferred else preferred
