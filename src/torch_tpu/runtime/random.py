"""tpu generators: a seed plus a counter, one fresh JAX key per random op.

A generator's state is its seed and the number of keys drawn from it (two int64s, so
get/set_state round-trip exactly). Key number ``n`` of seed ``s`` is always the same JAX key, so
the same seed gives the same sequence of tpu values (not the CPU's values: the bit generators
differ). Random ops draw from the ``generator=`` they are given, else from the device's default
generator, which ``torch.manual_seed`` / ``torch.tpu.manual_seed`` seed. Like PyTorch's, a
generator is shared by all threads; each draw takes the next counter value atomically, so two
threads never get the same key.

With the C++ runtime core (``runtime.native``) generators are ``torch.Generator`` objects on tpu
(``torch.Generator(device="tpu")`` works); without it the default generator is held here
(:class:`_PythonGenerator`, same state format) and no other exists. Nothing here imports JAX
until a key is made.
"""

from __future__ import annotations

import functools
import os
import threading

import torch

from . import native
from .context import context

_lock = threading.Lock()
_MASK = 0xFFFF_FFFF_FFFF_FFFF
_STATE_ERROR = "tpu RNG state must be a uint8 tensor of 16 bytes (from get_rng_state())"


class _PythonGenerator:
    """The default generator when the C++ runtime core is missing: the ``torch.Generator``
    methods ``torch.tpu`` uses, over the same seed and counter."""

    def __init__(self, seed: int):
        self._seed, self._offset = seed, 0

    def manual_seed(self, seed: int) -> _PythonGenerator:
        with _lock:
            self._seed, self._offset = int(seed) & _MASK, 0
        return self

    def seed(self) -> int:
        seed = int.from_bytes(os.urandom(8), "little")
        self.manual_seed(seed)
        return seed

    def initial_seed(self) -> int:
        return self._seed

    def get_state(self) -> torch.Tensor:
        with _lock:
            words = [self._seed - (1 << 64) if self._seed >> 63 else self._seed, self._offset]
        return torch.tensor(words, dtype=torch.int64).view(torch.uint8)

    def set_state(self, state: torch.Tensor) -> _PythonGenerator:
        if state.dtype != torch.uint8 or state.numel() != 16:
            raise RuntimeError(_STATE_ERROR)
        seed, offset = (int(v) & _MASK for v in state.cpu().view(torch.int64))
        with _lock:
            self._seed, self._offset = seed, offset
        return self

    def draw(self) -> tuple[int, int]:
        with _lock:
            offset = self._offset
            self._offset += 1
            return self._seed, offset


_default: torch.Generator | _PythonGenerator | None = None
_default_lock = threading.Lock()


def default_generator() -> torch.Generator | _PythonGenerator:
    """The device's default generator; at first use it takes the CPU generator's seed, as it had
    at import (so ``torch.manual_seed`` before or after importing torch_tpu seeds it)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                generator = native._C.default_generator(0) if native.available() else _PythonGenerator(0)
                generator.manual_seed(torch.initial_seed())
                _default = generator
    return _default


def manual_seed(seed: int) -> None:
    default_generator().manual_seed(int(seed) & _MASK)


def _draw(generator) -> tuple[int, int]:
    if generator is None:
        generator = default_generator()
    if type(generator) is _PythonGenerator:
        return generator.draw()
    return native._C.draw(generator, 1)


@functools.lru_cache(maxsize=8)
def _base_key(seed: int):
    import jax

    return jax.random.fold_in(jax.random.key(seed & 0xFFFF_FFFF), seed >> 32)


#: Keys are derived a block at a time (one XLA call instead of one per random op); key number
#: ``n`` is ``fold_in(base, n)`` however it was drawn, so values do not depend on the block size.
_BLOCK = 64


@functools.cache
def _derive_block():
    import jax

    def derive(base, start):
        offsets = (start + jax.numpy.arange(_BLOCK, dtype=jax.numpy.uint32)).astype(jax.numpy.uint32)
        return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(base, offsets)

    return jax.jit(derive)


@functools.lru_cache(maxsize=4)  # a few generators in turn do not derive a block per draw
def _block(seed: int, start: int) -> list:
    return list(_derive_block()(_base_key(seed), start & 0xFFFF_FFFF))  # ready-made key arrays


def next_key(generator: torch.Generator | None = None):
    """A fresh key from ``generator`` (default: the device's default generator). Inside a
    compiled program's trace: one derived from the program's key input, which the program draws
    from the default generator once per call."""
    trace = context.trace
    if trace is not None:
        return trace.next_key()
    seed, offset = _draw(generator)
    start = offset - offset % _BLOCK
    return _block(seed, start)[offset - start]
