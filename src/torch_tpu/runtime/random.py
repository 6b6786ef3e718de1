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
        _forget_block()


def _forget_block() -> None:
    global _block
    _block = []


def initial_seed() -> int:
    return _seed


@functools.lru_cache(maxsize=8)
def _base_key(seed: int):
    import jax

    return jax.random.fold_in(jax.random.key(seed & 0xFFFF_FFFF), seed >> 32)


#: Keys are derived a block at a time (one XLA call instead of one per random op); key number
#: ``n`` is ``fold_in(base, n)`` however it was drawn, so values do not depend on the block size.
_BLOCK = 64
_block: list = []  # the keys of offsets [_block_start, _block_start + len(_block)), unused ones
_block_start = 0


@functools.cache
def _derive_block():
    import jax

    def derive(base, start):
        offsets = (start + jax.numpy.arange(_BLOCK, dtype=jax.numpy.uint32)).astype(jax.numpy.uint32)
        return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(base, offsets)

    return jax.jit(derive)


def next_key():
    """A fresh key (inside a compiled program's trace: one derived from the program's key input,
    which the program draws from here once per call)."""
    global _offset, _block, _block_start
    trace = context.trace
    if trace is not None:
        return trace.next_key()
    with _lock:
        offset = _offset
        _offset += 1
        index = offset - _block_start
        if not 0 <= index < len(_block):
            _block_start, index = offset, 0
            keys = _derive_block()(_base_key(_seed), offset & 0xFFFF_FFFF)
            _block = list(keys)  # one unstacking call; the keys are ready-made arrays
        return _block[index]


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
        _forget_block()


manual_seed(torch.initial_seed())
