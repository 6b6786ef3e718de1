"""Pallas kernels as PyTorch ops on tpu tensors: examples of :func:`torch_tpu.pallas.jax_op`
and tested building blocks.

- :func:`rms_norm` (``torch.ops.torch_tpu.rms_norm``): RMSNorm over the last dimension.
- :func:`flash_attention` (``torch.ops.torch_tpu.flash_attention``): blocked attention with an
  online softmax, causal or with a boolean / additive mask, grouped-query heads.
- :func:`grouped_matmul` (``torch.ops.torch_tpu.grouped_matmul``): the ragged matmul of
  mixture-of-experts layers.
- :func:`ragged_paged_attention` (``torch.ops.torch_tpu.ragged_paged_attention``): a serving
  step's attention, prefills and decodes packed together, over a paged KV cache (a JAX
  function with an online softmax over pages: module ``ragged_paged_attention``).
- :class:`use_flash_attention`: route ``F.scaled_dot_product_attention`` to the flash kernel.

Each is a JAX function with a ``jax.custom_vjp`` whose backward is Pallas kernels too (modules
``rmsnorm``, ``flash``, ``gmm``, usable from JAX directly). On a TPU the kernels compile through
Mosaic; elsewhere they run in Pallas' interpreter (slow: for tests and development). Importing
this module defines the ops, which starts the tpu device. See ``docs/kernels.md``.
"""

from __future__ import annotations

import jax
import torch

from ..pallas import jax_op
from . import flash as _flash
from . import gmm as _gmm
from . import ragged_paged_attention as _ragged
from . import rmsnorm as _rmsnorm
from ._routing import use_flash_attention

__all__ = ["flash_attention", "grouped_matmul", "ragged_paged_attention", "rms_norm", "use_flash_attention"]


# ----------------------------------------------------------------------------- the ops
@jax_op("torch_tpu::rms_norm")
def _rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    return _rmsnorm.rms_norm(x, weight, eps)


@jax_op("torch_tpu::flash_attention")
def _flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None = None,
    causal: bool = False,
    scale: float | None = None,
    mask_grad: bool = False,
) -> jax.Array:
    return _flash.flash_attention(q, k, v, mask, causal=causal, scale=scale, mask_grad=mask_grad)


@jax_op("torch_tpu::grouped_matmul")
def _grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    return _gmm.grouped_matmul(lhs, rhs, group_sizes)


# (the JAX function itself, its statics keyword-only: no gradient, inference only)
jax_op("torch_tpu::ragged_paged_attention", _ragged.ragged_paged_attention, autograd=False)


# ----------------------------------------------------------------------------- the wrappers
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``F.rms_norm(x, (x.shape[-1],), weight, eps)`` as one Pallas kernel (and one for its
    backward): the result has x's dtype, computed in float32. ``eps`` None is
    ``torch.finfo(x.dtype).eps``, as in PyTorch."""
    return torch.ops.torch_tpu.rms_norm(x, weight, torch.finfo(x.dtype).eps if eps is None else float(eps))


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)``
    for ``[B, H, L, D]`` queries and ``[B, H_kv, S, D]`` keys and values (``H_kv`` dividing
    ``H``: grouped-query attention, as ``enable_gqa=True``), never holding the [L, S] scores
    whole. ``mask``: boolean (True attends) or additive, broadcastable to ``[B, H, L, S]``; a
    float mask that requires grad gets its gradient. Rows with every key masked give zeros."""
    mask_grad = mask is not None and mask.requires_grad
    return torch.ops.torch_tpu.flash_attention(q, k, v, mask, causal, scale, mask_grad)


def grouped_matmul(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """Rows of ``lhs`` ``[m, k]`` in consecutive groups of ``group_sizes`` ``[g]`` (integers,
    ``sum <= m``), group ``i`` multiplied by ``rhs[i]`` (``rhs`` ``[g, k, n]``): ``[m, n]``, 0 in
    the rows past the groups. ``torch._grouped_mm(lhs, rhs, offs=group_sizes.cumsum(0))`` (which
    leaves those rows undefined). Differentiable in ``lhs`` and ``rhs``."""
    return torch.ops.torch_tpu.grouped_matmul(lhs, rhs, group_sizes)


def ragged_paged_attention(
    queries: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_lens: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    num_seqs: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
) -> torch.Tensor:
    """A serving step's attention: ``queries`` ``[tokens, heads, head_dim]`` (request ``r``'s
    rows ``query_start[r]:query_start[r + 1]``, the last positions of its sequence) over the
    paged ``kv_cache`` ``[num_blocks, kv_heads, block_size, 2 * head_dim]`` (vLLM's layout)
    through ``block_tables`` ``[requests, pages]``, each request ``kv_lens[r]`` long, the
    first ``num_seqs`` rows of the tables real. Causal, optionally within ``sliding_window``
    and with scores capped by ``soft_cap``; padding rows give zeros. Inference only (no
    gradient). See :mod:`torch_tpu.kernels.ragged_paged_attention`."""
    return torch.ops.torch_tpu.ragged_paged_attention(
        queries,
        kv_cache,
        kv_lens,
        block_tables,
        query_start,
        num_seqs,
        scale=float(scale),
        sliding_window=sliding_window,
        soft_cap=soft_cap,
    )
