"""The lowerings of fbgemm's sparse ops, the ones TorchRec's jagged tensors and embedding
modules call; ``integrations.fbgemm`` registers them once fbgemm is imported. Each gives what
fbgemm's CPU kernel gives (``tests/rec`` checks them against it); fbgemm's own Autograd kernels
wrap them, as they wrap the CPU ones.

- ``asynchronous_complete_cumsum`` / ``_inclusive_`` / ``_exclusive_``: lengths to offsets.
- ``offsets_range``: each position's index within its segment.
- ``permute_1D_sparse_data``, ``permute_2D_sparse_data``: a jagged tensor's features reordered
  (or picked, or repeated): lengths, values and weights. The values' count depends on the
  lengths, so without ``permuted_lengths_sum`` the op reads the lengths on the host.
- ``permute_pooled_embs`` (and ``_auto_grad``): blocks of columns of pooled embeddings
  reordered (``KeyedTensor.regroup``).
- jagged <-> dense, one jagged dimension: ``jagged_to_padded_dense_forward`` (and its backward),
  ``jagged_2d_to_dense``, ``jagged_1d_to_dense``, ``dense_to_jagged_forward`` (which reads the
  offsets on the host unless ``total_L`` is given).
"""

from __future__ import annotations

import jax.numpy as jnp

#: namespace -> op name -> (its lowering, how it runs)
LOWERINGS: dict = {"fbgemm": {}, "torchrec": {}}


def _lowering(name: str, namespace: str = "fbgemm", **options):
    def register(fn):
        LOWERINGS[namespace][name] = (fn, options)
        return fn

    return register


def _exclusive(lengths):
    return jnp.cumsum(lengths) - lengths


@_lowering("asynchronous_complete_cumsum")
def complete_cumsum(lengths):
    return jnp.concatenate([jnp.zeros((1,), lengths.dtype), jnp.cumsum(lengths)])


@_lowering("asynchronous_inclusive_cumsum")
def inclusive_cumsum(lengths):
    return jnp.cumsum(lengths).astype(lengths.dtype)


@_lowering("asynchronous_exclusive_cumsum")
def exclusive_cumsum(lengths):
    return _exclusive(lengths).astype(lengths.dtype)


def segment_of(starts, positions):
    """The segment each position falls in, given the segments' (sorted) start offsets."""
    return jnp.searchsorted(starts, positions, side="right") - 1


def bags_of(offsets, count: int):
    """Each of ``count`` ids' bag under ``offsets`` (a bag's ids from ``offsets[b]`` to
    ``offsets[b + 1]``), and whether a bag holds it at all (ids past ``offsets[-1]`` are given
    the last bag: the caller masks them)."""
    at = jnp.arange(count, dtype=offsets.dtype)
    return jnp.clip(segment_of(offsets, at), 0, offsets.shape[0] - 2), at < offsets[-1]


@_lowering("offsets_range")
def offsets_range(offsets, range_size):
    positions = jnp.arange(range_size, dtype=offsets.dtype)
    return positions - offsets[segment_of(offsets, positions)]


def _permute_segments(permute, lengths, values, weights, total):
    """Rows of a jagged tensor (``lengths``: ``[rows, batch]``) reordered as ``permute`` says: the
    new lengths, and ``values``/``weights`` regathered into ``total`` positions."""
    row_lengths = lengths.reshape(lengths.shape[0], -1).sum(1)
    row_starts = _exclusive(row_lengths)
    new_row_lengths = row_lengths[permute]
    new_starts = _exclusive(new_row_lengths)
    positions = jnp.arange(total, dtype=new_starts.dtype)
    segment = segment_of(new_starts, positions)
    source = row_starts[permute][segment] + positions - new_starts[segment]
    return lengths[permute], values[source], None if weights is None else weights[source]


def _permuted_total(permute, lengths, total) -> int:
    """The permuted values' count: given, or summed on the host (the op runs there then)."""
    if total is not None:
        return int(total)
    return int(lengths.reshape(lengths.shape[0], -1)[permute].sum())


@_lowering("permute_2D_sparse_data", runs="host")
def permute_2d_sparse_data(permute, lengths, values, weights=None, permuted_lengths_sum=None):
    total = _permuted_total(permute, lengths, permuted_lengths_sum)
    return _permute_segments(permute, lengths, values, weights, total)


@_lowering("permute_1D_sparse_data", runs="host")
def permute_1d_sparse_data(permute, lengths, values, weights=None, permuted_lengths_sum=None):
    total = _permuted_total(permute, lengths, permuted_lengths_sum)
    return _permute_segments(permute, lengths, values, weights, total)


def _block_sources(offset_dim_list, permute_list, output_starts, size: int):
    """Each of ``size`` output columns' input column: output block ``i`` (columns from
    ``output_starts[i]``) is input block ``permute_list[i]`` (from
    ``offset_dim_list[permute_list[i]]``)."""
    columns = jnp.arange(size, dtype=output_starts.dtype)
    block = jnp.clip(segment_of(output_starts[:-1], columns), 0, permute_list.shape[0] - 1)
    return offset_dim_list[permute_list[block]] + columns - output_starts[block]


def permute_pooled_embs(pooled, offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list):
    return pooled[..., _block_sources(offset_dim_list, permute_list, inv_offset_dim_list, pooled.shape[-1])]


_lowering("permute_pooled_embs")(permute_pooled_embs)
_lowering("permute_pooled_embs_auto_grad")(permute_pooled_embs)


def _one_level(name: str, offsets: list):
    if len(offsets) != 1:
        raise NotImplementedError(f"fbgemm::{name} on tpu: one jagged dimension only, got {len(offsets)}")
    return offsets[0]


def _padded(values, offsets, length: int, padding):
    """``[batch, length, ...]``: row ``b`` holds segment ``b`` of ``values`` (``offsets[b]`` to
    ``offsets[b + 1]``), cut at ``length``, then ``padding``."""
    starts, ends = offsets[:-1], offsets[1:]
    positions = jnp.arange(length, dtype=offsets.dtype)
    valid = positions[None, :] < (ends - starts)[:, None]
    gathered = values[jnp.where(valid, starts[:, None] + positions[None, :], 0)]
    valid = valid.reshape(valid.shape + (1,) * (values.ndim - 1))
    return jnp.where(valid, gathered, jnp.asarray(padding, values.dtype))


def _jagged(dense, offsets, total: int):
    """The inverse: ``total`` values, value ``j`` from row ``b`` (its segment) at ``j -
    offsets[b]``; 0 past the dense row's length."""
    positions = jnp.arange(total, dtype=offsets.dtype)
    row = jnp.clip(segment_of(offsets[:-1], positions), 0, dense.shape[0] - 1)
    within = positions - offsets[row]
    valid = within < dense.shape[1]
    taken = dense[row, jnp.minimum(within, dense.shape[1] - 1)]
    valid = valid.reshape(valid.shape + (1,) * (dense.ndim - 2))
    return jnp.where(valid, taken, jnp.zeros((), dense.dtype))


@_lowering("jagged_to_padded_dense_forward")
def jagged_to_padded_dense(values, offsets, max_lengths, padding_value=0.0):
    return _padded(
        values, _one_level("jagged_to_padded_dense_forward", offsets), max_lengths[0], padding_value
    )


@_lowering("jagged_to_padded_dense_backward")
def jagged_to_padded_dense_backward(grad_output, offsets, total_L):
    return _jagged(grad_output, _one_level("jagged_to_padded_dense_backward", offsets), total_L)


@_lowering("dense_to_jagged_forward", runs="host")
def dense_to_jagged(dense, x_offsets, total_L=None):
    offsets = _one_level("dense_to_jagged_forward", x_offsets)
    return _jagged(dense, offsets, int(offsets[-1]) if total_L is None else int(total_L))


@_lowering("jagged_2d_to_dense")
def jagged_2d_to_dense(values, offsets, max_sequence_length):
    return _padded(values, offsets, max_sequence_length, 0)


@_lowering("jagged_1d_to_dense")
def jagged_1d_to_dense(values, offsets, max_sequence_length, padding_value):
    return _padded(values, offsets, max_sequence_length, padding_value)


def _unsupported(name: str, **given) -> None:
    for option, value in given.items():
        if value:
            raise NotImplementedError(f"fbgemm::{name} on tpu: {option}")


@_lowering("block_bucketize_sparse_features")
def block_bucketize_sparse_features(
    lengths, indices, bucketize_pos, sequence, block_sizes, my_size, weights=None,
    batch_size_per_feature=None, max_B=-1, block_bucketize_pos=None, keep_orig_idx=False,
    total_num_blocks=None, keep_orig_idx_per_feature=None,
):  # fmt: skip
    """Row-wise sharding's split of a jagged batch: id ``i`` of feature ``t`` goes to rank
    ``i // block_sizes[t]`` as ``i % block_sizes[t]`` (ids past ``my_size`` blocks: rank ``i %
    my_size``, as ``i // my_size``); the result is ordered by rank, then bag, then position, with
    each id's position in its bag (``bucketize_pos``) and where each id went (``sequence``)."""
    unsupported = {
        "variable batch sizes": batch_size_per_feature is not None,
        "block_bucketize_pos": bool(block_bucketize_pos),
        "total_num_blocks": total_num_blocks is not None,
        "keep_orig_idx_per_feature": keep_orig_idx_per_feature is not None,
    }
    _unsupported("block_bucketize_sparse_features", **unsupported)
    bags = lengths.shape[0]
    offsets = complete_cumsum(lengths)
    bag, _ = bags_of(offsets, indices.shape[0])
    at = jnp.arange(indices.shape[0], dtype=offsets.dtype)
    block = block_sizes.astype(indices.dtype)[bag // (bags // block_sizes.shape[0])]
    inside = indices < block * my_size
    rank = jnp.where(inside, indices // jnp.maximum(block, 1), indices % my_size)
    local = (
        indices if keep_orig_idx else jnp.where(inside, indices % jnp.maximum(block, 1), indices // my_size)
    )
    key = rank.astype(offsets.dtype) * bags + bag
    order = jnp.argsort(key, stable=True)
    new_lengths = jnp.zeros(my_size * bags, lengths.dtype).at[key].add(1)
    position = (at - offsets[bag]).astype(indices.dtype)
    return (
        new_lengths,
        local[order],
        None if weights is None else weights[order],
        position[order] if bucketize_pos else None,
        jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0])).astype(indices.dtype)
        if sequence
        else None,
    )


# ----------------------------------------------------------------------------- TorchRec's own
# The ``torchrec::`` ops of TorchRec's experimental tpu embedding kernel (``UNFUSED_TPU``, in
# ``torchrec.experimental.torch_tpu``): lookups by plain ids, pooled by a fixed count or by
# offsets (with per-bag row offsets: stacked tables), their backward as scatter-adds, and a
# column-block permutation. Each is what the op's CPU kernel in TorchRec computes.


def _pooled(rows, offsets):
    bag, used = bags_of(offsets, rows.shape[0])
    rows = jnp.where(used[:, None], rows, jnp.zeros((), rows.dtype))
    return jnp.zeros((offsets.shape[0] - 1, rows.shape[1]), rows.dtype).at[bag].add(rows)


def _scattered(grad_rows, ids, used, num_rows: int, emb_dim: int):
    ids = jnp.where(used, ids, num_rows)  # (dropped)
    return jnp.zeros((num_rows, emb_dim), grad_rows.dtype).at[ids].add(grad_rows, mode="drop")


@_lowering("embedding_lookup", "torchrec")
def embedding_lookup(indices, weights, emb_dim):
    return weights[indices]


@_lowering("embedding_lookup_backward", "torchrec")
def embedding_lookup_backward(grad_out, indices, num_rows, emb_dim):
    return _scattered(grad_out, indices, jnp.ones(indices.shape, bool), num_rows, emb_dim)


@_lowering("embedding_pooled_lookup", "torchrec")
def embedding_pooled_lookup(idx, table, pool):
    return table[idx].reshape(-1, pool, table.shape[1]).sum(1)


@_lowering("embedding_pooled_lookup_backward", "torchrec")
def embedding_pooled_lookup_backward(grad_out, idx, pool, num_rows, emb_dim):
    grad_rows = jnp.repeat(grad_out, pool, axis=0)
    return _scattered(grad_rows, idx, jnp.ones(idx.shape, bool), num_rows, emb_dim)


@_lowering("embedding_pooled_lookup_offset", "torchrec")
def embedding_pooled_lookup_offset(indices, offsets, weights, emb_dim):
    return _pooled(weights[indices], offsets)


@_lowering("embedding_pooled_lookup_offset_backward", "torchrec")
def embedding_pooled_lookup_offset_backward(grad_out, indices, offsets, num_rows, emb_dim):
    bag, used = bags_of(offsets, indices.shape[0])
    return _scattered(grad_out[bag], indices, used, num_rows, emb_dim)


@_lowering("embedding_pooled_batched_lookup_offset", "torchrec")
def embedding_pooled_batched_lookup_offset(indices, offsets, weights, row_offsets, emb_dim):
    bag, _ = bags_of(offsets, indices.shape[0])
    return _pooled(weights[indices + row_offsets[bag].astype(indices.dtype)], offsets)


@_lowering("embedding_pooled_batched_lookup_offset_backward", "torchrec")
def embedding_pooled_batched_lookup_offset_backward(
    grad_out, indices, offsets, row_offsets, num_rows, emb_dim
):
    bag, used = bags_of(offsets, indices.shape[0])
    rows = indices + row_offsets[bag].astype(indices.dtype)
    return _scattered(grad_out[bag], rows, used, num_rows, emb_dim)


def _permuted_columns(offset_dim_list, permute_list, size: int):
    """fbgemm's permutation with the output blocks' starts derived from the permuted widths."""
    dims = offset_dim_list[1:] - offset_dim_list[:-1]
    starts = complete_cumsum(dims[permute_list])
    return _block_sources(offset_dim_list, permute_list, starts, size)


@_lowering("permute_pooled_embs", "torchrec")
def torchrec_permute_pooled_embs(pooled_embs, offset_dim_list, permute_list):
    return pooled_embs[:, _permuted_columns(offset_dim_list, permute_list, pooled_embs.shape[1])]


@_lowering("permute_pooled_embs_backward", "torchrec")
def torchrec_permute_pooled_embs_backward(grad_out, offset_dim_list, permute_list):
    columns = _permuted_columns(offset_dim_list, permute_list, grad_out.shape[1])
    return jnp.zeros_like(grad_out).at[:, columns].add(grad_out)
