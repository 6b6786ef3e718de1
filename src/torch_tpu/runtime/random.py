"""tpu generators: a seed plus a counter, one fresh JAX key per random op.

A generator's state is its seed and the number of keys drawn from it (two int64s, so
get/set_state round-trip exactly). Key number ``n`` of seed ``s`` is always the same JAX key, so
the same seed gives the same sequence of tpu values (not the CPU's values: the bit generators
differ). Random ops draw from the ``generator=`` they are given, else from the device's default
generator (kept in its ``devices.DeviceState``), which ``torch.manual_seed`` /
``torch.tpu.manual_seed`` seed. Like PyTorch's, a generator is shared by all threads; each draw
takes the next counter value atomically, so two threads never get the same key.

With the C++ runtime core (``runtime.native``) generators are ``torch.Generator`` objects on tpu
(``torch.Generator(device="tpu")`` works); without it the default generator is a
:class:`_PythonGenerator` (same state format) and no other exists. Nothing here imports JAX
until a key is made.
"""

from __future__ import annotations

import functools
import os
import threading

import numpy as np
import torch

from . import devices, native
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


_default_lock = threading.Lock()
#: the seed of the last ``manual_seed_all``, for default generators made after it
_seed_all: int | None = None


def default_generator(index: int = 0) -> torch.Generator | _PythonGenerator:
    """``tpu:index``'s default generator; at first use it takes the seed of the last
    ``torch.tpu.manual_seed_all``, else the CPU generator's (so ``torch.manual_seed`` before or
    after importing torch_tpu seeds it). Each device has its own stream, as on CUDA."""
    if index:
        from . import platform

        state = devices.local.state(platform.check_index(index))  # (no other without the C++ core)
    else:
        state = devices.local.first
    generator = state.generator
    if generator is None:
        with _default_lock:
            generator = state.generator
            if generator is None:
                if native.available():
                    generator = native._C.default_generator(state.index)
                else:
                    generator = _PythonGenerator(0)
                generator.manual_seed(torch.initial_seed() if _seed_all is None else _seed_all)
                state.generator = generator
    return generator


def manual_seed(seed: int, index: int = 0) -> None:
    """Seed ``tpu:index``'s default generator."""
    default_generator(index).manual_seed(int(seed) & _MASK)


def manual_seed_all(seed: int) -> None:
    """Seed every device's default generator (those made later too)."""
    global _seed_all
    with _default_lock:
        _seed_all = int(seed) & _MASK
        generators = [state.generator for state in devices.local.states if state.generator is not None]
    for generator in generators:
        generator.manual_seed(_seed_all)


def _draw(generator) -> tuple[int, int]:
    if type(generator) is _PythonGenerator:
        return generator.draw()
    return native._C.draw(generator, 1)


# ----------------------------------------------------------------------------- keys
# Key number ``n`` of seed ``s`` is JAX's ``fold_in(fold_in(key(s_lo), s_hi), n)`` (threefry),
# computed here on the host: bit for bit what ``jax.random`` computes (tests/runtime check it),
# without the XLA programs JAX would compile for it in every fresh process (its seeding,
# fold_in, a derivation of many keys and their unstacking: ~0.8 s before the first random
# number on XLA:CPU).
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(key: tuple[int, int], x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Threefry-2x32 block cipher (20 rounds), as ``jax.random``'s threefry implementation."""
    words = (np.uint32(key[0]), np.uint32(key[1]), np.uint32(key[0] ^ key[1] ^ 0x1BD11BDA))
    x0, x1 = x0 + words[0], x1 + words[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
            x1 = x1 ^ x0
        x0 = x0 + words[(i + 1) % 3]
        x1 = x1 + words[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _fold_in(key: tuple[int, int], data: np.ndarray) -> np.ndarray:
    """``jax.random.fold_in(key, d)`` for each ``d`` of ``data`` (uint32): rows of key data."""
    y0, y1 = _threefry2x32(key, np.zeros_like(data), data)
    return np.stack([y0, y1], axis=-1)


@functools.lru_cache(maxsize=8)
def _base_key(seed: int) -> tuple[int, int]:
    low, high = seed & 0xFFFF_FFFF, seed >> 32  # (``key(low)``'s data is [0, low])
    return tuple(int(w) for w in _fold_in((0, low), np.array([high], np.uint32))[0])


#: Keys are put on the device a block at a time (one transfer instead of one per random op);
#: key number ``n`` is the same however it was drawn, so values do not depend on the block size.
_BLOCK = 64


def key_rows(seed: int, start: int, count: int) -> np.ndarray:
    """The data of keys ``start`` to ``start + count - 1`` of ``seed``, as rows of two uint32."""
    with np.errstate(over="ignore"):  # (uint32 arithmetic wraps, as the cipher wants)
        return _fold_in(_base_key(seed), np.arange(start, start + count, dtype=np.uint64).astype(np.uint32))


@functools.lru_cache(maxsize=8)  # a few generators (or devices) in turn do not redo a block per draw
def _block(seed: int, start: int, index: int):
    import jax

    from . import platform

    return jax.device_put(key_rows(seed, start, _BLOCK), platform.jax_device(index))


def next_key(generator: torch.Generator | None = None, index: int = 0):
    """A fresh key from ``generator`` (default: ``tpu:index``'s default generator) for an op on
    ``tpu:index``: ``(block, position)``, a block of key data on the device and the row to use
    (a cached device scalar), which the op's program turns into the key (:func:`key_of`), so
    drawing runs no program. Inside a compiled program's trace: a key derived from the
    program's key input, which the program draws from the default generator once per call."""
    trace = context.trace
    if trace is not None:
        return trace.next_key()
    if context.capturing:  # (a key drawn now would be replayed: the same numbers every time)
        raise NotImplementedError(
            "random ops cannot be captured in a tpu graph yet: draw the random numbers outside "
            "torch.tpu.graph, into a tensor the captured region reads"
        )
    seed, offset = _draw(default_generator(index) if generator is None else generator)
    start = offset - offset % _BLOCK
    from .transfer import device_scalar

    return _block(seed, start & 0xFFFF_FFFF, index), device_scalar(offset - start, index)


def next_key_data(index: int = 0) -> np.ndarray:
    """The data of a fresh key from ``tpu:index``'s default generator, on the host."""
    seed, offset = _draw(default_generator(index))
    return key_rows(seed, offset & 0xFFFF_FFFF, 1)[0]


def key_of(key):
    """The JAX key a random lowering draws with, from what :func:`next_key` gave (in a program
    or trace: a typed key passes through)."""
    if type(key) is not tuple:
        return key
    import jax

    block, position = key
    return jax.random.wrap_key_data(jax.lax.dynamic_index_in_dim(block, position, keepdims=False))
