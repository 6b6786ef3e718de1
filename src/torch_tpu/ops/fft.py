"""Discrete Fourier transforms: the three ATen kernels every ``torch.fft`` function reduces
to (``_fft_r2c``, ``_fft_c2r``, ``_fft_c2c``) and the frequency grids.

The kernels take an ``int`` normalization: 0 leaves the transform unscaled, 1 scales it by
``1/sqrt(n)`` and 2 by ``1/n``, ``n`` being the signal size (the product of the transformed
dims' sizes; for ``c2r``, of the output's). JAX's transforms are computed unscaled (``norm``
picks the unscaled direction) and scaled here, so both directions share one rule.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch

from .creation import _float_or_default
from .registry import Layout, Runs, lower

aten = torch.ops.aten

_UNSCALED = {True: "backward", False: "forward"}  # jnp's norm leaving (forward?) unscaled


def _normalized(x, signal_size: int, normalization: int):
    scale = {0: 1.0, 1: 1.0 / math.sqrt(signal_size), 2: 1.0 / signal_size}[normalization]
    return x if scale == 1.0 else x * jnp.asarray(scale, x.real.dtype)


def _signal_size(shape, dims) -> int:
    return math.prod(shape[d] for d in dims)


@lower(aten._fft_r2c.default, layout=Layout.META)
def fft_r2c(x, dim, normalization, onesided):
    """Real-to-complex: with ``onesided`` the last dim in ``dim`` keeps ``n // 2 + 1`` bins."""
    transform = jnp.fft.rfftn if onesided else jnp.fft.fftn
    result = transform(x, axes=dim, norm="backward")
    return _normalized(result, _signal_size(x.shape, dim), normalization)


@lower(aten._fft_c2r.default, layout=Layout.META)
def fft_c2r(x, dim, normalization, last_dim_size):
    """Complex-to-real inverse of a onesided transform; the output's last dim has ``last_dim_size``."""
    sizes = [x.shape[d] for d in dim[:-1]] + [last_dim_size]
    result = jnp.fft.irfftn(x, s=sizes, axes=dim, norm="forward")
    return _normalized(result, math.prod(sizes), normalization)


@lower(aten._fft_c2c.default, layout=Layout.META)
def fft_c2c(x, dim, normalization, forward):
    transform = jnp.fft.fftn if forward else jnp.fft.ifftn
    result = transform(x, axes=dim, norm=_UNSCALED[forward]) if dim else x
    return _normalized(result, _signal_size(x.shape, dim), normalization)


# ----------------------------------------------------------------------------- frequencies
# These read the default dtype, so they resolve outside any trace. torch CPU builds the integer
# grid in the result dtype and multiplies it in place by ``1 / (n * d)`` rounded to that dtype.
def _frequencies(grid: np.ndarray, n: int, d: float, dtype) -> jnp.ndarray:
    dtype = _float_or_default(dtype)
    return jnp.asarray(grid, dtype) * jnp.asarray(1.0 / (n * d), dtype)


@lower(aten.fft_fftfreq.default, runs=Runs.EAGER)
def fft_fftfreq(n, d=1.0, dtype=None, layout=None, device=None, pin_memory=None):
    grid = np.concatenate([np.arange((n + 1) // 2), np.arange(-(n // 2), 0)])
    return _frequencies(grid, n, d, dtype)


@lower(aten.fft_rfftfreq.default, runs=Runs.EAGER)
def fft_rfftfreq(n, d=1.0, dtype=None, layout=None, device=None, pin_memory=None):
    return _frequencies(np.arange(n // 2 + 1), n, d, dtype)
