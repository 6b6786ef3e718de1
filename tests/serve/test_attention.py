"""tpu's paged attention backend on its own: a batch mixing a prompt, a decoding step and a chunk
after a cached prefix, against attention computed on CPU request by request from the keys and
values at their slots (float64 for the tolerance), with and without a sliding window and a
logits soft cap."""

from __future__ import annotations

import math

import pytest
import torch

from torch_tpu.testing.reference import assert_matches_cpu

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[serve]', docs/serving.md)")

HEADS, KV_HEADS, HEAD, BLOCK, BLOCKS = 4, 2, 8, 4, 32
#: (tokens already in the cache, new tokens) per request: a prompt, a decoding step, a chunk.
REQUESTS = [(0, 5), (20, 1), (16, 7)]


def batch(dtype: torch.dtype):
    """The step's inputs: block tables, slots, cache with the context written, new q/k/v."""
    g = torch.Generator().manual_seed(0)
    pages = torch.randperm(BLOCKS, generator=g)[: 3 * 8].view(3, 8).int()
    cache = torch.randn(BLOCKS, KV_HEADS, BLOCK, 2 * HEAD, generator=g, dtype=torch.float64)
    new = sum(n for _, n in REQUESTS)
    q = torch.randn(new, HEADS, HEAD, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, new, KV_HEADS, HEAD, generator=g, dtype=torch.float64)
    positions = torch.cat([torch.arange(c, c + n) for c, n in REQUESTS])
    owners = torch.cat([torch.full((n,), r) for r, (_, n) in enumerate(REQUESTS)])
    slots = pages[owners, positions // BLOCK].long() * BLOCK + positions % BLOCK
    return pages, slots, cache.to(dtype), q.to(dtype), k.to(dtype), v.to(dtype)


def run(dtype: torch.dtype, window: int | None = None, soft_cap: float | None = None):
    """The backend's output and the cache after the step, on tpu."""
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from torch_tpu.integrations.vllm.attention import TpuAttentionImpl, TpuAttentionMetadataBuilder

    device = "tpu"
    pages, slots, cache, q, k, v = (t.to(device) for t in batch(dtype))
    starts = torch.tensor([0] + [n for _, n in REQUESTS]).cumsum(0).int()
    seq_lens = torch.tensor([c + n for c, n in REQUESTS]).int()
    common = CommonAttentionMetadata(
        query_start_loc=starts.to(device),
        query_start_loc_cpu=starts,
        seq_lens=seq_lens.to(device),
        num_reqs=len(REQUESTS),
        num_actual_tokens=q.shape[0],
        max_query_len=max(n for _, n in REQUESTS),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=pages,
        slot_mapping=slots,
        seq_lens_cpu_upper_bound=seq_lens,
    )
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD, dtype=dtype)
    metadata = TpuAttentionMetadataBuilder(spec, ["layer"], None, torch.device(device)).build(0, common)
    impl = TpuAttentionImpl(HEADS, HEAD, 1 / math.sqrt(HEAD), KV_HEADS, None, window, "auto", soft_cap)
    output = torch.empty_like(q)
    impl.forward(None, q, k, v, cache, metadata, output)
    return output.cpu(), cache.cpu()


def dense(dtype: torch.dtype, window: int | None = None, soft_cap: float | None = None):
    """The step on CPU, request by request: the new keys and values written at their slots,
    then causal attention over each request's keys gathered from them."""
    pages, slots, cache, q, k, v = batch(dtype)
    cache = cache.clone()
    cache[slots // BLOCK, :, slots % BLOCK] = torch.cat([k, v], -1)
    output, start = torch.empty_like(q), 0
    for r, (context, new) in enumerate(REQUESTS):
        positions = torch.arange(context + new)
        keys = cache[pages[r, positions // BLOCK].long(), :, positions % BLOCK]  # [length, kv_heads, 2h]
        grouped = keys.repeat_interleave(HEADS // KV_HEADS, dim=1).transpose(0, 1)  # [heads, length, 2h]
        queries = q[start : start + new].transpose(0, 1)  # [heads, new, head]
        scores = queries @ grouped[..., :HEAD].transpose(1, 2) / math.sqrt(HEAD)
        if soft_cap is not None:
            scores = soft_cap * torch.tanh(scores / soft_cap)
        query_positions = (context + torch.arange(new))[:, None]
        hidden = positions > query_positions
        if window is not None:
            hidden |= positions <= query_positions - window
        output[start : start + new] = (
            scores.masked_fill(hidden, -math.inf).softmax(-1) @ grouped[..., HEAD:]
        ).transpose(0, 1)
        start += new
    return output, cache


@pytest.mark.parametrize("window, soft_cap", [(None, None), (6, None), (None, 2.0)], ids=str)
def test_paged_attention_matches_attention_over_each_requests_slots(window, soft_cap):
    actual = run(torch.float32, window, soft_cap)
    expected, reference = dense(torch.float32, window, soft_cap), dense(torch.float64, window, soft_cap)
    for got, cpu, exact, what in zip(actual, expected, reference, ("output", "cache")):
        assert_matches_cpu(got, cpu, exact, what)


def test_the_new_keys_and_values_are_written_at_their_slots_exactly():
    _, cache = run(torch.float64)
    torch.testing.assert_close(cache, dense(torch.float64)[1], rtol=0, atol=0)
