"""LoRA on tpu: vLLM's Punica wrapper for CPU (its batched LoRA matmuls as plain torch ops, which
tpu lowers), with the tokens of requests that have no adapter left alone.

vLLM's torch ops pick each token's adapter as ``stacked_weights[token's slot]``, and a token of a
request without an adapter has slot -1, which picks the last slot's adapter: on vLLM's CPU
backend, a request without an adapter batched with requests that fill every slot is answered
as if it had the last one. Here the LoRA contribution of such tokens is zero, as with vLLM's
GPU kernels, which skip slot -1.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU


def _without_adapter(rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``rows`` (one per token or request, in ``slots``' order) zeroed where the slot is -1."""
    kept = rows[: slots.shape[0]]
    return kept.masked_fill_((slots < 0).unsqueeze(-1), 0)


class TpuPunicaWrapper(PunicaWrapperCPU):
    """vLLM's CPU wrapper, applying no adapter where a token has none (see the module)."""

    def _apply_shrink(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, scale: float) -> None:
        # (every linear layer's LoRA is a shrink into a buffer, then an expand adding it: a zero
        # buffer row adds nothing)
        super()._apply_shrink(y, x, w_t_all, scale)
        _without_adapter(y.view(-1, y.shape[-1]), self.token_lora_indices)

    def add_lora_embedding(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        x = x.clone()
        _without_adapter(x.view(-1, x.shape[-1]), self.token_lora_indices)
        super().add_lora_embedding(y, x, lora_b_stacked, add_inputs, **kwargs)

    def add_lora_logits(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        scale: float,
        *,
        buffer: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> None:
        x = x.reshape(-1, x.shape[-1]).clone()
        _without_adapter(x, self.sampler_indices)
        super().add_lora_logits(y, x, lora_a_stacked, lora_b_stacked, scale, buffer=buffer, **kwargs)
