"""The Triton kernels vLLM's model runner launches on every step, as torch ops on tpu tensors.

vLLM routes a kernel to a platform's replacement through ``register_kernels`` (the CPU platform
does the same with C++ ones). Each replacement takes the kernel's own arguments by name.
"""

from __future__ import annotations

import torch


def compute_slot_mapping(
    num_tokens,
    max_num_tokens,
    query_start_loc_ptr,
    positions_ptr,
    block_table_ptr,
    block_table_stride,
    slot_mapping_ptr,
    KV_CACHE_BLOCK_SIZE,
    TOTAL_CP_WORLD_SIZE,
    TOTAL_CP_RANK,
    CP_KV_CACHE_INTERLEAVE_SIZE,
    PAD_ID,
    BLOCK_SIZE,
) -> None:
    """Each token's KV-cache slot (its request's page for its position, times the page size, plus
    the offset in the page); the rest of the buffer gets ``PAD_ID``."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("context parallelism is not supported on tpu")
    positions = positions_ptr[:num_tokens]
    tokens = torch.arange(num_tokens, device=positions.device)
    # A token belongs to the request whose range [start, next start) holds it.
    requests = (tokens[:, None] >= query_start_loc_ptr[None, 1:]).sum(1)
    pages = block_table_ptr[requests, positions // KV_CACHE_BLOCK_SIZE].long()
    slot_mapping_ptr[:num_tokens] = pages * KV_CACHE_BLOCK_SIZE + positions % KV_CACHE_BLOCK_SIZE
    slot_mapping_ptr[num_tokens:max_num_tokens] = PAD_ID


OVERRIDES = {"vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping}
