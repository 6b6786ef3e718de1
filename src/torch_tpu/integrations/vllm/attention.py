"""Paged attention on tpu: vLLM's attention backend over ``torch_tpu.kernels.ragged_paged_attention``.

The KV cache of a layer is vLLM's ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` page
array (key and value side by side in the last dimension). A step writes its new keys and values
at their slots with one ``index_put_``, then attends with the ragged paged attention kernel: the
step's queries packed request after request (prefills, chunks of them and decodes together),
each request's keys read page by page through its block table with an online softmax, never
gathered into a dense tensor. Everything the kernel reads of the step (sequence lengths, query
starts, block tables, the request count) is a tensor vLLM's model runner keeps on the device,
an input of the step's program rather than a constant of it: a batch size keeps one program
while its sequences grow, prefills and decodes alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.attention.backends.registry import register_backend
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheLayout


class TpuAttentionBackend(AttentionBackend):
    # The layer's forward writes the new keys and values itself (it has the step's metadata).
    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float32, torch.bfloat16, torch.float16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float32", "bfloat16", "float16"]

    @staticmethod
    def get_name() -> str:
        return "TPU_ATTN"

    @staticmethod
    def get_impl_cls() -> type[TpuAttentionImpl]:
        return TpuAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[TpuAttentionMetadataBuilder]:
        return TpuAttentionMetadataBuilder

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


# vLLM's layers look their backend up by name in its registry of backends.
register_backend("TPU_ATTN", f"{__name__}.TpuAttentionBackend")


@dataclass
class TpuAttentionMetadata:
    num_actual_tokens: int
    #: [tokens]: where each new key and value is written (vLLM's slot: block * block_size + offset).
    slot_mapping: torch.Tensor
    #: [requests, pages] int32: the pages each request reads, in order.
    block_table: torch.Tensor
    #: [requests] int32: each request's sequence length, its new tokens included.
    seq_lens: torch.Tensor
    #: [requests + 1] int32: where each request's query tokens start among the step's tokens.
    query_start: torch.Tensor
    #: [1] int32: how many rows of the tables are requests.
    num_seqs: torch.Tensor


class TpuAttentionMetadataBuilder(AttentionMetadataBuilder[TpuAttentionMetadata]):
    # Every tensor built here is a view of vLLM's persistent buffers (or a cached count): a step
    # captured as one program (``graph.py``) reads them again at each replay.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._counts: dict[int, torch.Tensor] = {}  # request count -> its [1] tensor on the device

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> TpuAttentionMetadata:
        m = common_attn_metadata
        num_reqs, num_tokens = m.num_reqs, m.num_actual_tokens
        count = self._counts.get(num_reqs)
        if count is None:
            count = self._counts[num_reqs] = torch.tensor([num_reqs], dtype=torch.int32, device=self.device)
        # (the lengths are exact: the platform turns off async scheduling, the only case where
        # vLLM's device copy of them is an upper bound)
        return TpuAttentionMetadata(
            num_actual_tokens=num_tokens,
            slot_mapping=m.slot_mapping[:num_tokens].long(),
            block_table=m.block_table_tensor[:num_reqs],
            seq_lens=m.seq_lens[:num_reqs],
            query_start=m.query_start_loc[: num_reqs + 1],
            num_seqs=count,
        )


class TpuAttentionImpl(AttentionImpl):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        unsupported = {
            "ALiBi": alibi_slopes is not None,
            "attention sinks": sinks is not None,
            f"{attn_type} attention": attn_type != AttentionType.DECODER,
        }
        for feature, used in unsupported.items():
            if used:
                raise NotImplementedError(f"{feature} is not supported by tpu's attention backend")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.sliding_window = sliding_window
        self.logits_soft_cap = float(logits_soft_cap) if logits_soft_cap else None
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        kv_cache: torch.Tensor,
        attn_metadata: TpuAttentionMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization is not supported on tpu")
        if attn_metadata is None:  # a profiling run: no cache yet
            return output
        n, d = attn_metadata.num_actual_tokens, self.head_size
        block_size = kv_cache.shape[2]
        kv_cache, first_block = _all_layers(kv_cache)
        if key is not None and value is not None and self.kv_sharing_target_layer_name is None:
            # (a padding token's slot is -1: written to slot 0, vLLM's null block, never read)
            slots = attn_metadata.slot_mapping.clamp_min(0)
            blocks = slots // block_size + first_block if first_block else slots // block_size
            kv_cache[blocks, :, slots % block_size] = torch.cat([key[:n], value[:n]], -1)
        block_table = attn_metadata.block_table
        if first_block:
            block_table = block_table + first_block

        from torch_tpu.kernels import ragged_paged_attention  # (defines the op: the device has started)

        out = ragged_paged_attention(
            query.view(-1, self.num_heads, d),
            kv_cache,
            attn_metadata.seq_lens,
            block_table,
            attn_metadata.query_start,
            attn_metadata.num_seqs,
            scale=self.scale,
            sliding_window=self.sliding_window,
            soft_cap=self.logits_soft_cap,
        )
        output.view(out.shape).copy_(out)
        return output


def _all_layers(kv_cache: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The pages of every layer as one tensor, and where this layer's (``kv_cache``) start.

    vLLM allocates all layers' caches in one buffer (``[layers, blocks, ...]``) and hands each
    layer its slice. Read or written as that slice, the layer's cache would be copied out of the
    buffer and back at every step (tens of MiB); as the whole buffer, with block numbers offset
    to the layer's, the write is one scatter XLA does in place and the read costs nothing."""
    storage = kv_cache.untyped_storage()
    page = kv_cache[0].numel()
    offset = kv_cache.storage_offset()
    if not kv_cache.is_contiguous() or offset % page or (storage.nbytes() // kv_cache.element_size()) % page:
        return kv_cache, 0
    pages = storage.nbytes() // kv_cache.element_size() // page
    return kv_cache.as_strided((pages, *kv_cache.shape[1:]), kv_cache.stride(), 0), offset // page
