"""tpu's paged attention backend on its own: a batch mixing a prompt, a decoding step and a chunk
after a cached prefix, against the same backend on CPU (float64 reference for the tolerance) and
against attention computed request by request from the keys and values at their slots."""

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


def run(device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The backend's output and the cache after the step."""
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from torch_tpu.integrations.vllm.attention import TpuAttentionImpl, TpuAttentionMetadataBuilder

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
    impl = TpuAttentionImpl(HEADS, HEAD, 1 / math.sqrt(HEAD), KV_HEADS, None, None, "auto")
    output = torch.empty_like(q)
    impl.forward(None, q, k, v, cache, metadata, output)
    return output, cache


def test_paged_attention_matches_cpu():
    expected = run("cpu", torch.float32)
    reference = run("cpu", torch.float64)
    for actual, cpu, exact, what in zip(run("tpu", torch.float32), expected, reference, ("output", "cache")):
        assert_matches_cpu(actual, cpu, exact, what)


def test_paged_attention_is_causal_attention_over_each_requests_slots():
    output, cache = run("cpu", torch.float64)
    pages, _, _, q, k, v = batch(torch.float64)
    start = 0
    for r, (context, new) in enumerate(REQUESTS):
        positions = torch.arange(context + new)
        slots = pages[r, positions // BLOCK].long(), positions % BLOCK
        keys = cache[slots[0], :, slots[1]]  # [length, kv_heads, 2 * head]
        expect_new = torch.cat([k[start : start + new], v[start : start + new]], -1)
        torch.testing.assert_close(keys[context:], expect_new, rtol=0, atol=0)  # written at the slots
        grouped = keys.repeat_interleave(HEADS // KV_HEADS, dim=1).transpose(0, 1)  # [heads, length, 2h]
        queries = q[start : start + new].transpose(0, 1)  # [heads, new, head]
        scores = queries @ grouped[..., :HEAD].transpose(1, 2) / math.sqrt(HEAD)
        scores = scores.masked_fill(positions > (context + torch.arange(new))[:, None], -math.inf)
        expected = (scores.softmax(-1) @ grouped[..., HEAD:]).transpose(0, 1)
        torch.testing.assert_close(output[start : start + new], expected)
        start += new
