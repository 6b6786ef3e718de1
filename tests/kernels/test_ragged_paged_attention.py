"""``torch_tpu.kernels.ragged_paged_attention``: a step of mixed prefills and decodes over a
paged KV cache against dense attention per request on CPU (``F.scaled_dot_product_attention``
on each request's keys gathered from its pages), with float64-derived tolerances."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
import torch

from torch_tpu.kernels.ragged_paged_attention import ragged_paged_attention
from torch_tpu.testing.reference import assert_matches_cpu, widened

from ..ops.cases import seeded
from .jax_cases import to_jax, to_torch

HEADS, KV_HEADS, HEAD_DIM, BLOCK, BLOCKS, PAGES = 4, 2, 8, 4, 24, 5
#: (query length, sequence length) per request: a fresh prefill, a chunk of a longer prefill
#: (cached tokens before it), two decodes (one at the cache's last position, one of one token)
REQUESTS = [(6, 6), (3, 11), (1, PAGES * BLOCK), (1, 1)]
#: the tables are padded past the real requests, and the tokens past their queries
ROWS, TOKENS = 6, 16


def _step(seed: int = 0):
    """A step's metadata: each request's pages distinct blocks of the cache, in shuffled order."""
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randperm(BLOCKS, generator=generator)
    tables = torch.zeros(ROWS, PAGES, dtype=torch.int32)
    for r in range(len(REQUESTS)):
        tables[r] = blocks[r * PAGES : (r + 1) * PAGES] % BLOCKS
    lengths = torch.zeros(ROWS, dtype=torch.int32)
    lengths[: len(REQUESTS)] = torch.tensor([n for _, n in REQUESTS])
    starts = torch.zeros(ROWS + 1, dtype=torch.int32)
    starts[1 : len(REQUESTS) + 1] = torch.tensor([q for q, _ in REQUESTS]).cumsum(0)
    starts[len(REQUESTS) + 1 :] = starts[len(REQUESTS)]
    return tables, lengths, starts, torch.tensor([len(REQUESTS)], dtype=torch.int32)


def _dense(q, cache, lengths, tables, starts, num_seqs, scale, window=None, soft_cap=None):
    """Each request's attention computed densely from its keys (the reference)."""
    out = torch.zeros_like(q)
    group = HEADS // KV_HEADS
    for r in range(int(num_seqs)):
        s, e, n = int(starts[r]), int(starts[r + 1]), int(lengths[r])
        kv = cache[tables[r].long()].transpose(0, 1).flatten(1, 2)[:, :n]  # [kv_heads, n, 2d]
        k = kv[..., :HEAD_DIM].repeat_interleave(group, 0)
        v = kv[..., HEAD_DIM:].repeat_interleave(group, 0)
        position = n - (e - s) + torch.arange(e - s)
        key = torch.arange(n)
        seen = key[None, :] <= position[:, None]
        if window is not None:
            seen &= key[None, :] > position[:, None] - window
        scores = q[s:e].transpose(0, 1) @ k.transpose(1, 2) * scale
        if soft_cap is not None:
            scores = soft_cap * torch.tanh(scores / soft_cap)
        weights = scores.masked_fill(~seen, float("-inf")).softmax(-1)
        out[s:e] = (weights @ v).transpose(0, 1)
    return out


def _run(q, cache, tables, lengths, starts, num_seqs, **options):
    out = ragged_paged_attention(
        to_jax(q),
        to_jax(cache),
        *(jnp.asarray(t.numpy()) for t in (lengths, tables, starts, num_seqs)),
        **options,
    )
    return to_torch(out, q.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("window, soft_cap", [(None, None), (5, None), (None, 2.0)], ids=str)
def test_a_mixed_step_matches_dense_attention_per_request(dtype, window, soft_cap):
    tables, lengths, starts, num_seqs = _step()
    q = seeded(TOKENS, HEADS, HEAD_DIM, seed=1).to(dtype)
    cache = seeded(BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_DIM, seed=2).to(dtype)
    scale = HEAD_DIM**-0.5
    got = _run(
        q, cache, tables, lengths, starts, num_seqs, scale=scale, sliding_window=window, soft_cap=soft_cap
    )
    expected = _dense(q, cache, lengths, tables, starts, num_seqs, scale, window, soft_cap)
    reference = _dense(widened(q), widened(cache), lengths, tables, starts, num_seqs, scale, window, soft_cap)
    assert_matches_cpu(got, expected, reference, "attention")
    assert not got[int(starts[len(REQUESTS)]) :].any()  # (padding rows: zeros)


def test_padding_requests_and_blocks_past_the_sequences_are_never_read():
    """Poison everything the step must not read: the padded tables' rows, and every cache
    block outside the requests' pages; the result is unchanged."""
    tables, lengths, starts, num_seqs = _step(seed=3)
    q = seeded(TOKENS, HEADS, HEAD_DIM, seed=1)
    cache = seeded(BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_DIM, seed=2)
    used = torch.zeros(BLOCKS, dtype=torch.bool)
    for r, (_, n) in enumerate(REQUESTS):
        used[tables[r, : -(-n // BLOCK)].long()] = True
    poisoned = cache.clone()
    poisoned[~used] = float("nan")
    tables[len(REQUESTS) :] = BLOCKS - 1
    lengths[len(REQUESTS) :] = 7
    clean = _run(q, cache, tables, lengths, starts, num_seqs, scale=0.5)
    torch.testing.assert_close(_run(q, poisoned, tables, lengths, starts, num_seqs, scale=0.5), clean)


def test_a_mismatched_cache_is_a_clear_error():
    tables, lengths, starts, num_seqs = _step()
    q = seeded(TOKENS, HEADS, HEAD_DIM)
    with pytest.raises(ValueError, match="last dimension 8 for head_dim 8"):
        _run(q, seeded(BLOCKS, KV_HEADS, BLOCK, HEAD_DIM), tables, lengths, starts, num_seqs, scale=1.0)
    with pytest.raises(ValueError, match="3 query heads for 2 kv heads"):
        _run(
            q[:, :3],
            seeded(BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_DIM),
            tables,
            lengths,
            starts,
            num_seqs,
            scale=1.0,
        )


def test_the_tpu_op_matches_the_jax_function():
    from torch_tpu import kernels

    tables, lengths, starts, num_seqs = _step()
    q = seeded(TOKENS, HEADS, HEAD_DIM, seed=1)
    cache = seeded(BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_DIM, seed=2)
    on_tpu = [t.to("tpu") for t in (q, cache, lengths, tables, starts, num_seqs)]
    got = kernels.ragged_paged_attention(*on_tpu, scale=0.3, sliding_window=6, soft_cap=3.0)
    want = _run(q, cache, tables, lengths, starts, num_seqs, scale=0.3, sliding_window=6, soft_cap=3.0)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_the_docs_example_runs():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "kernels.md").read_text()
    section = text.split("### Ragged paged attention")[1].split("\n### ")[0]
    exec(compile(section.split("```python\n", 1)[1].split("```", 1)[0], "docs/kernels.md", "exec"), {})
