"""The Triton kernels vLLM's model runner launches on every step, as torch ops on tpu tensors.

vLLM routes a kernel to a platform's replacement through ``register_kernels`` (the CPU platform
does the same with C++ ones). Each replacement takes the kernel's own arguments by name.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from torch_tpu.pallas import jax_op


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
    """Each token's KV-cache slot; the rest of the buffer gets ``PAD_ID``. One op (a step's
    host work is its ops' dispatch: this kernel written as torch ops was ten of them)."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("context parallelism is not supported on tpu")
    slots = _slot_mapping_op()(
        query_start_loc_ptr,
        positions_ptr[:num_tokens],
        block_table_ptr,
        size=max_num_tokens,
        block_size=KV_CACHE_BLOCK_SIZE,
        pad_id=PAD_ID,
    )
    if max_num_tokens == slot_mapping_ptr.shape[0]:
        slot_mapping_ptr.copy_(slots)
    else:
        slot_mapping_ptr[:max_num_tokens] = slots


@functools.cache
def _slot_mapping_op():
    """The op of :func:`_slot_mapping`, defined at the first step (defining an op starts the
    device, which a worker of several must not do before joining the others)."""
    return jax_op("torch_tpu::vllm_slot_mapping", _slot_mapping, autograd=False)


def _slot_mapping(
    query_start: jax.Array,
    positions: jax.Array,
    block_table: jax.Array,
    *,
    size: int,
    block_size: int,
    pad_id: int,
) -> jax.Array:
    """Token ``t``'s slot: its request's page for its position, times the page size, plus the
    offset in the page (the request: the one whose range ``[start, next start)`` holds ``t``);
    tokens ``len(positions)`` to ``size`` get ``pad_id``."""
    tokens = jnp.arange(positions.shape[0])
    requests = (tokens[:, None] >= query_start[None, 1:]).sum(1)
    pages = block_table[requests, positions // block_size].astype(positions.dtype)
    slots = pages * block_size + positions % block_size
    return jnp.full((size,), pad_id, positions.dtype).at[: positions.shape[0]].set(slots)


OVERRIDES = {"vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping}
