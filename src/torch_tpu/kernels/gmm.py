"""A ragged (grouped) matmul as Pallas kernels, for mixture-of-experts layers: ``lhs``'s rows
come in consecutive groups (``group_sizes[i]`` rows for group ``i``), each multiplied by its own
``rhs[i]``.

The grid walks row tiles, and a tile that straddles groups is visited once per group in it, each
visit writing only its group's rows. Which (group, tile) each step visits is computed on device
from ``group_sizes`` and handed to the kernel as scalar-prefetched metadata, so the sizes may be
traced values (one compiled kernel for every split of the rows). The grid has a static length,
an upper bound on the visits; the steps past the real ones do nothing.

``gmm``: ``[m, k] x [g, k, n] -> [m, n]``; rows past ``sum(group_sizes)`` are 0. ``tgmm`` (the
right operand's gradient): ``[m, k]^T x [m, n] -> [g, k, n]`` per group; an empty group's is 0."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..pallas import interpret_mode
from ..pallas._blocks import block, compiler_params, pad_to

#: tile lengths on a TPU (rows, contraction, output columns)
TILING = (128, 128, 128)


def _visits(group_sizes, rows, tm, tail):
    """The metadata the kernels prefetch, for ``rows`` (padded) rows in tiles of ``tm``: each
    visit's group and row tile, each group's first and past-the-end row, and how many visits are
    real (a [1] array). With ``tail`` the rows after the last group form one more group (gmm
    writes them as zeros, so every row tile is visited)."""
    sizes = group_sizes.astype(jnp.int32)
    ends = jnp.minimum(jnp.cumsum(sizes), rows)
    if tail:
        ends = jnp.concatenate([ends, jnp.array([rows], jnp.int32)])
    starts = jnp.concatenate([jnp.zeros(1, jnp.int32), ends[:-1]])
    tiles = jnp.where(ends > starts, (ends - 1) // tm - starts // tm + 1, 0)
    visit_ends = jnp.cumsum(tiles)
    total = visit_ends[-1]
    # each group adds at most one visit beyond the row tiles (the tile it shares with the last)
    count = rows // tm + ends.shape[0] - 1
    visit = jnp.minimum(jnp.arange(count, dtype=jnp.int32), jnp.maximum(total - 1, 0))
    group = jnp.minimum(jnp.searchsorted(visit_ends, visit, side="right"), ends.shape[0] - 1)
    tile = starts[group] // tm + visit - (visit_ends[group] - tiles[group])
    tile = jnp.clip(tile, 0, rows // tm - 1)
    return (group.astype(jnp.int32), tile.astype(jnp.int32), starts, ends, total.reshape(1)), count


def _in_group(tile, start, end, shape, tm):
    rows = tile * tm + lax.broadcasted_iota(jnp.int32, shape, 0)
    return (rows >= start) & (rows < end)


def _gmm_kernel(groups, tiles, starts, ends, total, lhs_ref, rhs_ref, out_ref, acc_ref, *, tm, g, transpose):
    v, kk = pl.program_id(1), pl.program_id(2)
    group, tile = groups[v], tiles[v]
    real = v < total[0]

    @pl.when(kk == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(real & (group < g))  # the tail group (rows past the last group) multiplies nothing
    def _():
        dims = (((1,), (1 if transpose else 0,)), ((), ()))
        acc_ref[...] += lax.dot_general(lhs_ref[...], rhs_ref[...], dims, preferred_element_type=jnp.float32)

    @pl.when(real & (kk == pl.num_programs(2) - 1))
    def _():
        # the tile's first visit starts it from zeros; later ones keep the rows written before
        first = (v == 0) | (tiles[jnp.maximum(v - 1, 0)] != tile)
        kept = jnp.where(first, jnp.zeros(out_ref.shape, out_ref.dtype), out_ref[...])
        inside = _in_group(tile, starts[group], ends[group], out_ref.shape, tm)
        out_ref[...] = jnp.where(inside, acc_ref[...].astype(out_ref.dtype), kept)


def _tiled(tiling, *dims):
    return [block(d, t) for d, t in zip(dims, tiling)]


def gmm(lhs, rhs, group_sizes, *, transpose_rhs=False, tiling=TILING, interpret=None):
    """``out[rows of group i] = lhs[rows of group i] @ rhs[i]`` (``rhs[i].T`` with
    ``transpose_rhs``, rhs then ``[g, n, k]``); lhs ``[m, k]``, group_sizes ``[g]`` integers with
    ``sum <= m``. The result has lhs's dtype, accumulated in float32."""
    m, k = lhs.shape
    g = rhs.shape[0]
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    tm, tk, tn = _tiled(tiling, m, k, n)
    lhs_p = pad_to(pad_to(lhs, 0, tm), 1, tk)
    rhs_p = pad_to(pad_to(rhs, 2 if transpose_rhs else 1, tk), 1 if transpose_rhs else 2, tn)
    metadata, count = _visits(group_sizes, lhs_p.shape[0], tm, tail=True)

    def rhs_index(j, v, kk, groups, *_):
        group = jnp.minimum(groups[v], g - 1)
        return (group, j, kk) if transpose_rhs else (group, kk, j)

    with interpret_mode(interpret):
        out = pl.pallas_call(
            functools.partial(_gmm_kernel, tm=tm, g=g, transpose=transpose_rhs),
            out_shape=jax.ShapeDtypeStruct(
                (lhs_p.shape[0], rhs_p.shape[1 if transpose_rhs else 2]), lhs.dtype
            ),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=len(metadata),
                grid=(rhs_p.shape[1 if transpose_rhs else 2] // tn, count, lhs_p.shape[1] // tk),
                in_specs=[
                    pl.BlockSpec((tm, tk), lambda j, v, kk, groups, tiles, *_: (tiles[v], kk)),
                    pl.BlockSpec((None, tn, tk) if transpose_rhs else (None, tk, tn), rhs_index),
                ],
                out_specs=pl.BlockSpec((tm, tn), lambda j, v, kk, groups, tiles, *_: (tiles[v], j)),
                scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)],
            ),
            # a row tile's visits are consecutive steps that share its resident output block
            compiler_params=compiler_params("parallel", "arbitrary", "arbitrary"),
            name="gmm",
        )(*metadata, lhs_p, rhs_p)
    return out[:m, :n]


def _tgmm_kernel(groups, tiles, starts, ends, total, lhs_ref, grad_ref, out_ref, acc_ref, *, tm):
    v = pl.program_id(2)
    group, tile = groups[v], tiles[v]
    real = v < total[0]

    @pl.when((v == 0) | (groups[jnp.maximum(v - 1, 0)] != group))
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(real)
    def _():
        lhs = lhs_ref[...]
        inside = _in_group(tile, starts[group], ends[group], (lhs.shape[0], 1), tm)
        dims = (((0,), (0,)), ((), ()))
        acc_ref[...] += lax.dot_general(
            jnp.where(inside, lhs, jnp.zeros_like(lhs)),
            grad_ref[...],
            dims,
            preferred_element_type=jnp.float32,
        )

    last = (v == total[0] - 1) | (groups[jnp.minimum(v + 1, pl.num_programs(2) - 1)] != group)

    @pl.when(real & last)
    def _():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


def tgmm(lhs, grad, group_sizes, num_groups, *, tiling=TILING, interpret=None):
    """``out[i] = lhs[rows of group i].T @ grad[rows of group i]``: ``[g, k, n]`` from lhs
    ``[m, k]`` and grad ``[m, n]`` (gmm's right-operand gradient); lhs's dtype."""
    m, k = lhs.shape
    n = grad.shape[1]
    tm, tk, tn = _tiled(tiling, m, k, n)
    lhs_p = pad_to(pad_to(lhs, 0, tm), 1, tk)
    grad_p = pad_to(pad_to(grad, 0, tm), 1, tn)
    metadata, count = _visits(group_sizes, lhs_p.shape[0], tm, tail=False)
    with interpret_mode(interpret):
        out = pl.pallas_call(
            functools.partial(_tgmm_kernel, tm=tm),
            out_shape=jax.ShapeDtypeStruct((num_groups, lhs_p.shape[1], grad_p.shape[1]), lhs.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=len(metadata),
                grid=(lhs_p.shape[1] // tk, grad_p.shape[1] // tn, count),
                in_specs=[
                    pl.BlockSpec((tm, tk), lambda kk, j, v, groups, tiles, *_: (tiles[v], kk)),
                    pl.BlockSpec((tm, tn), lambda kk, j, v, groups, tiles, *_: (tiles[v], j)),
                ],
                out_specs=pl.BlockSpec((None, tk, tn), lambda kk, j, v, groups, *_: (groups[v], kk, j)),
                scratch_shapes=[pltpu.VMEM((tk, tn), jnp.float32)],
            ),
            # a group's visits are consecutive steps that accumulate into its resident output block
            compiler_params=compiler_params("parallel", "parallel", "arbitrary"),
            name="tgmm",
        )(*metadata, lhs_p, grad_p)
    # an empty group has no visits: its block was never written
    return jnp.where(group_sizes[:, None, None] > 0, out[:, :k, :n], 0).astype(lhs.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _grouped_matmul(lhs, rhs, group_sizes, tiling, interpret):
    return gmm(lhs, rhs, group_sizes, tiling=tiling, interpret=interpret)


def _grouped_matmul_fwd(lhs, rhs, group_sizes, tiling, interpret):
    return _grouped_matmul(lhs, rhs, group_sizes, tiling, interpret), (lhs, rhs, group_sizes)


def _grouped_matmul_bwd(tiling, interpret, residuals, grad):
    lhs, rhs, group_sizes = residuals
    grad = grad.astype(lhs.dtype)
    dlhs = gmm(grad, rhs, group_sizes, transpose_rhs=True, tiling=tiling, interpret=interpret)
    drhs = tgmm(lhs, grad, group_sizes, rhs.shape[0], tiling=tiling, interpret=interpret)
    return dlhs, drhs.astype(rhs.dtype), None


_grouped_matmul.defvjp(_grouped_matmul_fwd, _grouped_matmul_bwd)


def grouped_matmul(lhs, rhs, group_sizes, *, tiling=TILING, interpret=None):
    """:func:`gmm`, differentiable in ``lhs`` and ``rhs`` (the backward is :func:`gmm` with the
    right operand transposed and :func:`tgmm`). ``interpret``: where the kernels run, as
    :func:`torch_tpu.pallas.interpret_mode` takes it (None: compiled on TPUs, interpreted
    elsewhere; True: interpreted everywhere)."""
    if lhs.ndim != 2 or rhs.ndim != 3 or group_sizes.shape != rhs.shape[:1] or lhs.shape[1] != rhs.shape[1]:
        raise ValueError(
            f"grouped_matmul: lhs [m, k], rhs [g, k, n], group_sizes [g]; got {lhs.shape}, {rhs.shape}, "
            f"{group_sizes.shape}"
        )
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ValueError(f"grouped_matmul: group_sizes must be integers, got {group_sizes.dtype}")
    return _grouped_matmul(lhs, rhs, group_sizes, tuple(tiling), interpret)
