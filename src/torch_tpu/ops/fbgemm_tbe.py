"""The math of fbgemm's table-batched embeddings (TBE: ``SplitTableBatchedEmbeddingBagsCodegen``,
the kernel of TorchRec's fused and sharded embedding modules) as JAX functions of the TBE's flat
layout; ``integrations.fbgemm_tbe`` makes them the tpu kernels of fbgemm's lookup ops.

The layout, as fbgemm keeps it: every table's rows in one flat ``weights`` tensor, feature ``t``'s
rows from ``weights_offsets[t]``, ``D_offsets[t + 1] - D_offsets[t]`` wide; ``indices`` flat,
bag ``s = t * B + b`` (feature ``t``, sample ``b``) from ``offsets[s]`` to ``offsets[s + 1]``.
Each index is looked up as ``max_D`` positions of ``weights``, masked past its feature's width, so
one gather serves features of every width.

The fused optimizers update only the rows a batch touched, with the gradient summed over a row's
occurrences first (fbgemm's "exact" optimizers): the updates write whole rows (``.at[].set``:
duplicates write the same values), never add twice."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .fbgemm import bags_of, segment_of

#: fbgemm's ``PoolingMode``
SUM, MEAN, NONE = 0, 1, 2
#: fbgemm's ``WeightDecayMode`` values the rowwise optimizers here take
DECAY_NONE, DECAY_L2, DECAY_DECOUPLE = 0, 1, 2


class Layout(NamedTuple):
    """A lookup's tensors besides the weights: where each feature's rows start in the flat
    weights, each feature's columns in the output, the ids and their bags' offsets."""

    weights_offsets: jax.Array  # [T]
    D_offsets: jax.Array  # [T + 1]
    indices: jax.Array  # [L]
    offsets: jax.Array  # [T * B + 1]


class Rows(NamedTuple):
    """Where each index reads: its bag, its feature, and ``max_D`` flat positions (``valid``:
    inside the feature's width, and an index some bag holds); with what its gradient needs."""

    bag: jax.Array  # [L]
    feature: jax.Array  # [L]
    width: jax.Array  # [L]
    positions: jax.Array  # [L, max_D]; past the end of weights where not valid
    valid: jax.Array  # [L, max_D]
    ids: jax.Array  # [L]: the index itself
    bag_length: jax.Array  # [L]
    first_column: jax.Array  # [L]: its feature's first output column
    batch: int


def rows(weights, layout: Layout, max_D: int) -> Rows:
    offsets, D_offsets = layout.offsets, layout.D_offsets
    bags = offsets.shape[0] - 1
    batch = bags // (D_offsets.shape[0] - 1)
    bag, used = bags_of(offsets, layout.indices.shape[0])
    feature = bag // batch
    width = (D_offsets[1:] - D_offsets[:-1])[feature]
    column = jnp.arange(max_D)
    valid = (column[None, :] < width[:, None]) & used[:, None]
    start = layout.weights_offsets[feature] + layout.indices.astype(layout.weights_offsets.dtype) * width
    positions = jnp.where(valid, start[:, None] + column[None, :], weights.shape[0])
    bag_length = (offsets[1:] - offsets[:-1])[bag]
    return Rows(bag, feature, width, positions, valid, layout.indices, bag_length, D_offsets[feature], batch)


def scales(r: Rows, indice_weights, pooling_mode: int):
    """Each index's factor in its bag: its per-sample weight, over the bag's length for MEAN."""
    scale = (
        jnp.ones(r.bag.shape, jnp.float32) if indice_weights is None else indice_weights.astype(jnp.float32)
    )
    if pooling_mode == MEAN:
        scale = scale / jnp.maximum(r.bag_length, 1).astype(jnp.float32)
    return scale


def gathered(weights, r: Rows):
    """``[L, max_D]``: each index's row, 0 past its width."""
    return jnp.where(r.valid, weights.at[r.positions].get(mode="fill", fill_value=0), 0).astype(jnp.float32)


def forward(weights, layout: Layout, indice_weights, total_D: int, max_D: int, pooling_mode: int):
    """fbgemm's lookup: ``[B, total_D]`` pooled bags (``[L, max_D]`` rows for ``NONE``), in float32."""
    r = rows(weights, layout, max_D)
    looked_up = gathered(weights, r) * scales(r, indice_weights, pooling_mode)[:, None]
    if pooling_mode == NONE:
        return looked_up
    pooled = jax.ops.segment_sum(looked_up, r.bag, num_segments=layout.offsets.shape[0] - 1)
    column = jnp.arange(total_D, dtype=layout.D_offsets.dtype)  # (each output column's feature)
    feature = jnp.clip(segment_of(layout.D_offsets, column), 0, layout.D_offsets.shape[0] - 2)
    within = column - layout.D_offsets[feature]
    return pooled[feature[None, :] * r.batch + jnp.arange(r.batch)[:, None], within[None, :]]


def row_gradients(grad_output, r: Rows, indice_weights, pooling_mode: int, clip=None):
    """``[L, max_D]``: the gradient each index's row receives from the output's gradient
    (``clip``: the bag's gradient clipped to ``[-clip, clip]`` first, as fbgemm's CPU kernel
    clips, before the per-sample weight and MEAN's scale)."""
    if pooling_mode == NONE:
        per_bag = grad_output.astype(jnp.float32)
    else:
        within = jnp.minimum(jnp.arange(r.valid.shape[1])[None, :], r.width[:, None] - 1)
        column = r.first_column[:, None] + within
        per_bag = grad_output[(r.bag % r.batch)[:, None], column].astype(jnp.float32)
    if clip is not None:
        per_bag = jnp.clip(per_bag, -clip, clip)
    return jnp.where(r.valid, per_bag * scales(r, indice_weights, pooling_mode)[:, None], 0)


def weight_gradient(weights, r: Rows, grads):
    """The dense gradient of the flat weights: each row's gradients summed over its occurrences."""
    return jnp.zeros(weights.shape, jnp.float32).at[r.positions].add(grads, mode="drop")


def indice_weight_gradient(grad_output, weights, r: Rows, feature_requires_grad):
    """The per-sample weights' gradient (weighted SUM lookups): each row against its bag's gradient."""
    grad = (row_gradients(grad_output, r, None, SUM) * gathered(weights, r)).sum(1)
    if feature_requires_grad is not None:
        grad = jnp.where(feature_requires_grad[r.feature] != 0, grad, 0)
    return grad


def adagrad(weights, momentum, r: Rows, grad, lr, eps: float):
    """Adagrad per element: the squares' sum in ``momentum`` (laid out as the weights)."""
    touched = r.positions
    g = grad.at[touched].get(mode="fill", fill_value=0)
    m = momentum.at[touched].get(mode="fill", fill_value=0) + g * g
    w = weights.at[touched].get(mode="fill", fill_value=0).astype(jnp.float32) - lr * g / (jnp.sqrt(m) + eps)
    return (
        weights.at[touched].set(w.astype(weights.dtype), mode="drop"),
        momentum.at[touched].set(m, mode="drop"),
    )


def rowwise_adagrad(
    weights, momentum, momentum_offsets, r: Rows, grad, lr, eps: float, decay: float, mode: int
):
    """Adagrad with one accumulator per row (the mean of the row's squared gradient), fbgemm's
    ``EXACT_ROWWISE_ADAGRAD``; L2 decay adds to the gradient, decoupled decay shrinks the row."""
    touched = r.positions
    w = weights.at[touched].get(mode="fill", fill_value=0).astype(jnp.float32)
    g = grad.at[touched].get(mode="fill", fill_value=0)
    decayed = g + decay * w if mode == DECAY_L2 else g
    mean_square = jnp.where(r.valid, decayed * decayed, 0).sum(1) / r.width.astype(jnp.float32)
    slot = momentum_offsets[r.feature] + r.ids.astype(momentum_offsets.dtype)
    slot = jnp.where(r.valid[:, 0], slot, momentum.shape[0])
    m = momentum.at[slot].get(mode="fill", fill_value=0) + mean_square
    multiplier = lr / (jnp.sqrt(m) + eps)
    correction = jnp.ones_like(multiplier)
    if mode == DECAY_L2:
        correction = 1.0 - multiplier * decay
    elif mode == DECAY_DECOUPLE:
        correction = jnp.broadcast_to(1.0 - lr * decay, multiplier.shape)
    updated = correction[:, None] * w - multiplier[:, None] * g
    return (
        weights.at[touched].set(updated.astype(weights.dtype), mode="drop"),
        momentum.at[slot].set(m, mode="drop"),
    )


def bounds_checked(rows_per_table, indices, offsets):
    """fbgemm's input check: ``(bad, indices, offsets)``, ``bad`` flagging each id outside its
    table and each offset outside ``[0, L]`` or below the one before it; the fixed inputs look
    bad ids up as row 0 and clamp the offsets."""
    count = indices.shape[0]
    bags = offsets.shape[0] - 1
    batch = bags // rows_per_table.shape[0]
    clamped = jnp.clip(offsets, 0, count)
    fixed_offsets = jax.lax.cummax(clamped)
    bad_offsets = (clamped != offsets) | (fixed_offsets != clamped)
    bag, used = bags_of(fixed_offsets, count)
    rows_here = rows_per_table[bag // batch].astype(indices.dtype)
    bad_ids = ((indices < 0) | (indices >= rows_here)) & used
    return (
        jnp.concatenate([bad_ids, bad_offsets]),
        jnp.where(bad_ids, jnp.zeros((), indices.dtype), indices),
        fixed_offsets.astype(offsets.dtype),
    )
