"""The tpu default generator: a seed plus a counter, one fresh JAX key per random op.

Same ``torch.manual_seed`` -> same sequence of keys -> same tpu values (not the CPU's values:
the bit generators differ). The state is two int64s, so get/set_rng_state round-trip exactly.
"""
from __future__ import annotations

import functools

import jax
import torch

from . import _tracing

_seed: int = 0
_offset: int = 0


def manual_seed(seed: int) -> None:
    global _seed, _offset
    _seed, _offset = int(seed) & 0xFFFF_FFFF_FFFF_FFFF, 0


def initial_seed() -> int:
    return _seed


@functools.lru_cache(maxsize=8)
def _base_key(seed: int) -> jax.Array:
    return jax.random.fold_in(jax.random.key(seed & 0xFFFF_FFFF), seed >> 32)


def next_key() -> jax.Array:
    """A fresh key (inside a compiled program's trace: one derived from the program's key input,
    which the program draws from here once per call)."""
    global _offset
    if _tracing.current is not None:
        return _tracing.current.next_key()
    key = jax.random.fold_in(_base_key(_seed), _offset & 0xFFFF_FFFF)
    _offset += 1
    return key


def get_state() -> torch.Tensor:
    return torch.tensor([_seed, _offset], dtype=torch.int64).view(torch.uint8)


def set_state(state: torch.Tensor) -> None:
    global _seed, _offset
    if state.dtype != torch.uint8 or state.numel() != 16:
        raise RuntimeError("tpu RNG state must be a uint8 tensor of 16 bytes (from get_rng_state())")
    _seed, _offset = (int(v) for v in state.cpu().view(torch.int64))


manual_seed(torch.initial_seed())
