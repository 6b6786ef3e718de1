"""Paged attention on tpu in plain torch ops: vLLM's reference algorithm, lowered through XLA.

The KV cache of a layer is vLLM's ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` page
array (key and value side by side in the last dimension). A step writes its new keys and values
at their slots with one ``index_put_``, gathers each request's pages through its block table into
a ``[requests, kv_heads, length, head_size]`` tensor, and runs ``scaled_dot_product_attention``
with a mask that combines causality (a query at position p sees keys up to p) and each request's
length. Queries are packed per request into a ``[requests, longest query]`` grid.

The per-step indices are built once per step on the host from vLLM's CPU copies of the batch
layout, and shared by every layer. Their sizes do not follow the sequences' lengths (keys: the
block table's full width; queries: the longest rounded up to a power of two), so decoding steps
of one batch size run one compiled program.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.attention.backends.registry import register_backend
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheLayout


def _bucket(n: int) -> int:
    """The next power of two: the few shapes a growing length compiles."""
    return 1 << max(n - 1, 0).bit_length()


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
    #: [requests, pages]: the pages each request reads, padded with page 0 (masked out).
    block_table: torch.Tensor
    #: [requests, longest query]: the packed token each query row takes (padding repeats one).
    query_index: torch.Tensor
    #: [tokens]: each token's row in the flattened [requests * longest query] result.
    output_index: torch.Tensor
    #: [requests, 1, longest query, pages * block_size]: which keys each query row sees.
    mask: torch.Tensor


class TpuAttentionMetadataBuilder(AttentionMetadataBuilder[TpuAttentionMetadata]):
    def __init__(self, kv_cache_spec: AttentionSpec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> TpuAttentionMetadata:
        m = common_attn_metadata
        num_reqs, num_tokens = m.num_reqs, m.num_actual_tokens
        starts = m.query_start_loc_cpu[: num_reqs + 1].numpy().astype(np.int64)
        seq_lens = m.seq_lens_cpu_upper_bound
        # Exact here: the platform turns off async scheduling, the only case where it is not.
        seq_lens = (seq_lens if seq_lens is not None else m.seq_lens.cpu())[:num_reqs].numpy()
        query_lens = np.diff(starts)
        longest = _bucket(int(query_lens.max()))
        # Every request reads the block table's full width (max_model_len tokens): one key length
        # for every step, so a batch size keeps one program while its sequences grow (lengths
        # rounded up instead are new shapes every few steps, which fused eager then runs alone).
        pages = m.block_table_tensor.shape[1]

        rows = np.arange(longest)
        query_index = np.minimum(starts[:-1, None] + rows, max(num_tokens - 1, 0))
        token_request = np.repeat(np.arange(num_reqs), query_lens)
        token_row = np.arange(num_tokens) - starts[token_request]
        key_position = np.arange(pages * self.block_size)
        # Query row j of a request is position (seq_len - query_len + j); padding rows see key 0.
        query_position = (seq_lens - query_lens)[:, None] + rows
        mask = (key_position <= query_position[:, :, None]) & (key_position < seq_lens[:, None, None])

        def upload(array: np.ndarray, dtype=torch.int64) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(self.device, dtype)

        return TpuAttentionMetadata(
            num_actual_tokens=num_tokens,
            slot_mapping=m.slot_mapping[:num_tokens].long(),
            block_table=m.block_table_tensor[:num_reqs, :pages].long(),
            query_index=upload(query_index),
            output_index=upload(token_request * longest + token_row),
            mask=upload(mask[:, None], torch.bool),
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
            "sliding-window attention": sliding_window is not None,
            "logits soft-capping": bool(logits_soft_cap),
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
        if key is not None and value is not None and self.kv_sharing_target_layer_name is None:
            slots = attn_metadata.slot_mapping
            kv_cache[slots // block_size, :, slots % block_size] = torch.cat([key[:n], value[:n]], -1)

        pages = kv_cache[attn_metadata.block_table]  # [requests, pages, kv_heads, block, 2d]
        kv = pages.transpose(1, 2).flatten(2, 3)  # [requests, kv_heads, pages * block, 2d]
        q = query[attn_metadata.query_index].transpose(1, 2)  # [requests, heads, longest, d]
        out = torch.nn.functional.scaled_dot_product_attention(
            q,
            kv[..., :d],
            kv[..., d:],
            attn_mask=attn_metadata.mask,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        out = out.transpose(1, 2).reshape(-1, self.num_heads, d)[attn_metadata.output_index]
        output[:n].copy_(out)
        return output
