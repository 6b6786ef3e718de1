"""Ragged paged attention: a serving step's queries (prefills and decodes packed one after
another) attending to each request's keys and values in a paged KV cache.

This is the attention of a whole vLLM step as one function of the step's metadata, so that the
step compiles to one XLA program whatever its requests' lengths (tpu-inference's
``ragged_paged_attention``, over vLLM's cache layout). Its inputs:

- ``queries`` ``[tokens, heads, head_dim]``: request ``r``'s query tokens are rows
  ``query_start[r]:query_start[r + 1]``, the last ``query_len`` positions of its sequence
  (a decode has one, a prefill chunk many); rows past ``query_start[num_seqs]`` are padding;
- ``kv_cache`` ``[num_blocks, kv_heads, block_size, 2 * head_dim]``: vLLM's page array, keys
  and values side by side in the last dimension;
- ``kv_lens`` ``[requests]``: each request's sequence length (cached and new tokens);
- ``block_tables`` ``[requests, pages_per_seq]``: the pages holding each request's positions
  ``block_size * p ...``, in order;
- ``query_start`` ``[requests + 1]`` and ``num_seqs`` (how many rows of the tables are real
  requests: the arrays are padded to a few sizes so that steps share programs).

Query ``i`` of request ``r``, at position ``kv_lens[r] - query_len + i``, sees the request's
keys at positions up to its own (causal), and with ``sliding_window`` only the last
``sliding_window`` of them (its own included: Mistral's and vLLM's convention); ``soft_cap``
caps the scores with ``soft_cap * tanh(score / soft_cap)`` (Gemma 2). Keys and values may have
fewer heads than queries (grouped-query attention: query head ``h`` reads kv head
``h // (heads // kv_heads)``). Padding rows give zeros.

:func:`ragged_paged_attention` walks the pages with an online softmax (a running maximum and
sum per query row), one page of every query's request at a time, so no request's keys are ever
gathered into a dense ``[requests, pages * block_size]`` tensor; the loop runs as many pages as
the longest sequence of the step needs. Scores and sums are float32 whatever the cache's dtype.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["ragged_paged_attention"]


class _Rows(NamedTuple):
    """Per query row: its request, its position in the request's sequence, whether it is real."""

    request: jax.Array  # [tokens] int32
    position: jax.Array  # [tokens] int32
    kv_len: jax.Array  # [tokens] int32: its request's sequence length
    valid: jax.Array  # [tokens] bool


def _rows(tokens: int, kv_lens, query_start, num_seqs) -> _Rows:
    t = jnp.arange(tokens, dtype=jnp.int32)
    requests = kv_lens.shape[0]
    request = jnp.clip(jnp.searchsorted(query_start, t, side="right") - 1, 0, requests - 1).astype(jnp.int32)
    end = query_start[jnp.minimum(num_seqs, requests)]
    valid = (t < end) & (request < num_seqs)
    query_len = query_start[request + 1] - query_start[request]
    kv_len = kv_lens[request]
    position = kv_len - query_len + (t - query_start[request])
    return _Rows(request, position, kv_len, valid)


class _Softmax(NamedTuple):
    """The online softmax's state per query row and head: running maximum, sum and output."""

    maximum: jax.Array  # [tokens, kv_heads, group] float32
    total: jax.Array  # [tokens, kv_heads, group] float32
    out: jax.Array  # [tokens, kv_heads, group, head_dim] float32


def _page_step(page: jax.Array, state: _Softmax, *, q, kv_cache, block_tables, rows, window, soft_cap):
    """Fold page ``page`` of every row's request into the softmax state."""
    block_size, head_dim = kv_cache.shape[2], q.shape[-1]
    blocks = block_tables[rows.request, page]  # [tokens]
    kv = kv_cache[blocks].astype(jnp.float32)  # [tokens, kv_heads, block, 2 * head_dim]
    key_position = page * block_size + jnp.arange(block_size, dtype=jnp.int32)  # [block]
    # (positions past a sequence hold anything, NaN included: they are never read)
    stored = (key_position[None, :] < rows.kv_len[:, None]) & rows.valid[:, None]  # [tokens, block]
    kv = jnp.where(stored[:, None, :, None], kv, 0.0)
    keys, values = kv[..., :head_dim], kv[..., head_dim:]
    scores = jnp.einsum("tkgd,tkbd->tkgb", q, keys)
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    seen = stored & (key_position[None, :] <= rows.position[:, None])
    if window is not None:
        seen &= key_position[None, :] > rows.position[:, None] - window
    scores = jnp.where(seen[:, None, None, :], scores, -jnp.inf)
    maximum = jnp.maximum(state.maximum, scores.max(-1))
    safe = jnp.where(jnp.isfinite(maximum), maximum, 0.0)  # (no key seen yet: nothing to scale)
    weights = jnp.exp(scores - safe[..., None])  # (exp(-inf) = 0 for unseen keys)
    rescale = jnp.exp(state.maximum - safe)
    total = state.total * rescale + weights.sum(-1)
    out = state.out * rescale[..., None] + jnp.einsum("tkgb,tkbd->tkgd", weights, values)
    return _Softmax(maximum, total, out)


@functools.partial(jax.jit, static_argnames=("scale", "sliding_window", "soft_cap"))
def ragged_paged_attention(
    queries: jax.Array,
    kv_cache: jax.Array,
    kv_lens: jax.Array,
    block_tables: jax.Array,
    query_start: jax.Array,
    num_seqs: jax.Array,
    *,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
) -> jax.Array:
    """Attention of ragged ``queries`` over the paged ``kv_cache`` (see the module); returns
    ``[tokens, heads, head_dim]`` in ``queries``' dtype."""
    tokens, heads, head_dim = queries.shape
    kv_heads, block_size = kv_cache.shape[1], kv_cache.shape[2]
    if heads % kv_heads:
        raise ValueError(f"ragged_paged_attention: {heads} query heads for {kv_heads} kv heads")
    if kv_cache.shape[3] != 2 * head_dim:
        raise ValueError(
            f"ragged_paged_attention: a cache of last dimension {kv_cache.shape[3]} for head_dim {head_dim}"
        )
    group = heads // kv_heads
    num_seqs = jnp.reshape(num_seqs, ()).astype(jnp.int32)
    kv_lens, query_start = kv_lens.astype(jnp.int32), query_start.astype(jnp.int32)
    rows = _rows(tokens, kv_lens, query_start, num_seqs)
    q = queries.astype(jnp.float32).reshape(tokens, kv_heads, group, head_dim) * scale
    state = _Softmax(
        jnp.full((tokens, kv_heads, group), -jnp.inf, jnp.float32),
        jnp.zeros((tokens, kv_heads, group), jnp.float32),
        jnp.zeros((tokens, kv_heads, group, head_dim), jnp.float32),
    )
    longest = jnp.max(jnp.where(jnp.arange(kv_lens.shape[0]) < num_seqs, kv_lens, 0))
    pages = jnp.minimum((longest + block_size - 1) // block_size, block_tables.shape[1])
    step = functools.partial(
        _page_step,
        q=q,
        kv_cache=kv_cache,
        block_tables=block_tables,
        rows=rows,
        window=sliding_window,
        soft_cap=soft_cap,
    )
    state = lax.fori_loop(0, pages, step, state)
    out = jnp.where(state.total[..., None] > 0, state.out / jnp.maximum(state.total, 1e-30)[..., None], 0.0)
    return out.reshape(tokens, heads, head_dim).astype(queries.dtype)
