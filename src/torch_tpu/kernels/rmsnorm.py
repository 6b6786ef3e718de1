"""RMSNorm as Pallas kernels: ``y = x / sqrt(mean(x**2, -1) + eps) * weight``, forward and
backward, over blocks of rows (each row normalized whole, in float32)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ..pallas import interpret_mode
from ..pallas._blocks import block, compiler_params, pad_to

#: rows per block on a TPU (a multiple of the 8-row sublane tile)
BLOCK_ROWS = 256


def _forward_kernel(x_ref, w_ref, y_ref, rstd_ref, *, eps):
    x = x_ref[...].astype(jnp.float32)
    rstd = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    y_ref[...] = (x * rstd * w_ref[...].astype(jnp.float32)).astype(y_ref.dtype)
    rstd_ref[...] = rstd


def _backward_kernel(x_ref, w_ref, rstd_ref, dy_ref, dx_ref, dw_ref):
    """dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * weight, xhat = x * rstd; dw sums
    dy * xhat over all rows, accumulated in its one resident output block."""
    xhat = x_ref[...].astype(jnp.float32) * rstd_ref[...]
    dy = dy_ref[...].astype(jnp.float32)
    g = dy * w_ref[...].astype(jnp.float32)
    dx = rstd_ref[...] * (g - xhat * jnp.mean(g * xhat, axis=-1, keepdims=True))
    dx_ref[...] = dx.astype(dx_ref.dtype)

    @pl.when(pl.program_id(0) == 0)
    def _():
        dw_ref[...] = jnp.zeros_like(dw_ref)

    dw_ref[...] += jnp.sum(dy * xhat, axis=0, keepdims=True)


def _rows(x, block_rows):
    """``x`` as padded rows ``[rows, d]``, the block length and the grid."""
    rows = math.prod(x.shape[:-1])
    length = block(rows, block_rows)
    flat = pad_to(x.reshape(rows, x.shape[-1]), 0, length)
    return flat, length, (flat.shape[0] // length,)


def _forward(x, weight, eps, block_rows, interpret):
    flat, length, grid = _rows(x, block_rows)
    d = x.shape[-1]
    rows_spec = pl.BlockSpec((length, d), lambda i: (i, 0))
    with interpret_mode(interpret):
        y, rstd = pl.pallas_call(
            functools.partial(_forward_kernel, eps=eps),
            out_shape=(
                jax.ShapeDtypeStruct(flat.shape, x.dtype),
                jax.ShapeDtypeStruct((flat.shape[0], 1), jnp.float32),
            ),
            grid=grid,
            in_specs=[rows_spec, pl.BlockSpec((1, d), lambda i: (0, 0))],
            out_specs=(rows_spec, pl.BlockSpec((length, 1), lambda i: (i, 0))),
            compiler_params=compiler_params("parallel"),
            name="rms_norm_forward",
        )(flat, weight.reshape(1, d))
    rows = math.prod(x.shape[:-1])
    return y[:rows].reshape(x.shape), rstd


def _backward(x, weight, rstd, dy, block_rows, interpret):
    flat, length, grid = _rows(x, block_rows)
    dy_flat = _rows(dy, block_rows)[0]
    d = x.shape[-1]
    rows_spec = pl.BlockSpec((length, d), lambda i: (i, 0))
    row_spec = pl.BlockSpec((1, d), lambda i: (0, 0))
    with interpret_mode(interpret):
        dx, dw = pl.pallas_call(
            _backward_kernel,
            out_shape=(
                jax.ShapeDtypeStruct(flat.shape, x.dtype),
                jax.ShapeDtypeStruct((1, d), jnp.float32),
            ),
            grid=grid,
            in_specs=[rows_spec, row_spec, pl.BlockSpec((length, 1), lambda i: (i, 0)), rows_spec],
            out_specs=(rows_spec, row_spec),
            # dw's block is the same at every step: the steps run in order
            compiler_params=compiler_params("arbitrary"),
            name="rms_norm_backward",
        )(flat, weight.reshape(1, d), rstd, dy_flat)
    rows = math.prod(x.shape[:-1])
    return dx[:rows].reshape(x.shape), dw.reshape(weight.shape).astype(weight.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _rms_norm(x, weight, eps, block_rows, interpret):
    return _forward(x, weight, eps, block_rows, interpret)[0]


def _rms_norm_fwd(x, weight, eps, block_rows, interpret):
    y, rstd = _forward(x, weight, eps, block_rows, interpret)
    return y, (x, weight, rstd)


def _rms_norm_bwd(eps, block_rows, interpret, residuals, dy):
    x, weight, rstd = residuals
    return _backward(x, weight, rstd, dy, block_rows, interpret)


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


def rms_norm(
    x: jax.Array,
    weight: jax.Array,
    eps: float = 1e-6,
    *,
    block_rows: int = BLOCK_ROWS,
    interpret: bool | None = None,
) -> jax.Array:
    """RMSNorm over ``x``'s last dimension, scaled by ``weight`` (that dimension's length);
    the result has ``x``'s dtype. Differentiable (``jax.vjp``) through a Pallas backward.
    ``interpret``: where the kernels run, as
    :func:`torch_tpu.pallas.interpret_mode` takes it (None: compiled on TPUs, interpreted
    elsewhere; True: interpreted everywhere)."""
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: weight of shape {weight.shape} for rows of length {x.shape[-1]}")
    return _rms_norm(x, weight, float(eps), block_rows, interpret)
