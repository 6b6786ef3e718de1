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


#: the default generator of each device index made so far
_defaults: dict[int, torch.Generator | _PythonGenerator] = {}
_default_lock = threading.Lock()
#: the seed of the last ``manual_seed_all``, for default generators made after it
_seed_all: int | None = None


def default_generator(index: int = 0) -> torch.Generator | _PythonGenerator:
    """``tpu:index``'s default generator; at first use it takes the seed of the last
    ``torch.tpu.manual_seed_all``, else the CPU generator's (so ``torch.manual_seed`` before or
    after importing torch_tpu seeds it). Each device has its own stream, as on CUDA."""
    generator = _defaults.get(index)
    if generator is None:
        with _default_lock:
            generator = _defaults.get(index)
            if generator is None:
                if native.available():
                    generator = native._C.default_generator(index)
                elif index == 0:
                    generator = _PythonGenerator(0)
                else:
                    from . import platform

                    platform.check_index(index)  # (only tpu:0 exists without the C++ core)
                generator.manual_seed(torch.initial_seed() if _seed_all is None else _seed_all)
                _defaults[index] = generator
    return generator


def manual_seed(seed: int, index: int = 0) -> None:
    """Seed ``tpu:index``'s default generator."""
    default_generator(index).manual_seed(int(seed) & _MASK)


def manual_seed_all(seed: int) -> None:
    """Seed every device's default generator (those made later too)."""
    global _seed_all
    with _default_lock:
        _seed_all = int(seed) & _MASK
        generators = list(_defaults.values())
    for generator in generators:
        generator.manual_seed(_seed_all)


def _draw(generator) -> tuple[int, int]:
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


def next_key(generator: torch.Generator | None = None, index: int = 0):
    """A fresh key from ``generator`` (default: ``tpu:index``'s default generator). Inside a
    compiled program's trace: one derived from the program's key input, which the program draws
    from the default generator once per call."""
    trace = context.trace
    if trace is not None:
        return trace.next_key()
    seed, offset = _draw(default_generator(index) if generator is None else generator)
    start = offset - offset % _BLOCK
    return _block(seed, start)[offset - start]
