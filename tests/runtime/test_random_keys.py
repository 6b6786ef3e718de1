"""Random keys are derived on the host (no XLA program per fresh process): bit for bit the keys
``jax.random`` derives, so a seed's stream is the same as when JAX computed them."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from torch_tpu.runtime import random

#: 64-bit seeds (both halves used), and key numbers around the 32-bit wrap of the counter
SEEDS = [0, 1, 12345, 2**32 + 7, 2**63 + 5, 2**64 - 1]
STARTS = [0, 64, 2**32 - 3]


def _jax_key_data(seed: int, number: int) -> np.ndarray:
    base = jax.random.fold_in(jax.random.key(seed & 0xFFFF_FFFF), seed >> 32)
    return np.asarray(jax.random.key_data(jax.random.fold_in(base, number & 0xFFFF_FFFF)))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("start", STARTS)
def test_host_keys_are_jaxs(seed, start):
    rows = random.key_rows(seed, start, 6)
    assert rows.dtype == np.uint32 and rows.shape == (6, 2)
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(row, _jax_key_data(seed, start + i))


def test_a_drawn_key_is_its_blocks_row_in_the_program():
    block = jax.device_put(random.key_rows(7, 0, 64))
    key_data = jax.jit(lambda block, position: jax.random.key_data(random.key_of((block, position))))
    for position in (0, 5, 63):
        np.testing.assert_array_equal(np.asarray(key_data(block, position)), _jax_key_data(7, position))
    typed = jax.random.key(3)  # (in a compiled program's trace: a typed key passes through)
    assert random.key_of(typed) is typed
