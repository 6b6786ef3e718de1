"""The tpu default generator: a seed plus a counter, one fresh JAX key per random op.

Same ``torch.manual_seed`` -> same sequence of keys -> same tpu values (not the CPU's values:
the bit generators differ). The state is two int64s, so get/set_rng_state round-trip exactly.
Like PyTorch's default generators it is one per device, shared by all threads; each draw takes
the next counter value atomically, so two threads never get the same key. The state lives here
without JAX (``torch.manual_seed`` seeds it in every process, tpu or not); keys are made on use.
"""

from __future__ import annotations

import functools
import threading

import torch

from .context import context

_lock = threading.Lock()
_seed: int = 0
_offset: int = 0


def manual_seed(seed: int) -> None:
    global _seed, _offset
    with _lock:
        _seed, _offset = int(seed) & 0xFFFF_FFFF_FFFF_FFFF, 0


def initial_seed() -> int:
    return _seed


@functools.lru_cache(maxsize=8)
def _base_key(seed: int):
    import jax

    return jax.random.fold_in(jax.random.key(seed & 0xFFFF_FFFF), seed >> 32)


def next_key():
    """A fresh key (inside a compiled program's trace: one derived from the program's key input,
    which the program draws from here once per call)."""
    global _offset
    trace = context.trace
    if trace is not None:
        return trace.next_key()
    with _lock:
        seed, offset = _seed, _offset
        _offset += 1
    import jax

    return jax.random.fold_in(_base_key(seed), offset & 0xFFFF_FFFF)


def get_state() -> torch.Tensor:
    with _lock:
        return torch.tensor([_seed, _offset], dtype=torch.int64).view(torch.uint8)


def set_state(state: torch.Tensor) -> None:
    global _seed, _offset
    if state.dtype != torch.uint8 or state.numel() != 16:
        raise RuntimeError("tpu RNG state must be a uint8 tensor of 16 bytes (from get_rng_state())")
    seed, offset = (int(v) for v in state.cpu().view(torch.int64))
    with _lock:
        _seed, _offset = seed, offset


manual_seed(torch.initial_seed())
