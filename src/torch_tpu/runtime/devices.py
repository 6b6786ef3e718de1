"""The devices this process drives, and what each one keeps: one owner for per-device state.

``tpu:i``'s :class:`DeviceState` holds its JAX device, its default generator
(:mod:`.random`), its cache of scalar constants (:mod:`.transfer`) and its memory peak
(:mod:`.memory`). :data:`local` holds them all, in tpu index order. ``tpu:0``'s state exists
from import (there is always a ``tpu:0``, whose generator may be made and seeded before the
device starts); the platform binds the JAX devices, and adds the others' states, as it starts
(:func:`.platform.initialize`).
"""

from __future__ import annotations

from typing import Any

from .lru import Kind, caches


class DeviceState:
    """What ``tpu:index`` keeps for itself."""

    __slots__ = ("generator", "index", "jax_device", "peak_allocated", "scalars")

    def __init__(self, index: int, jax_device: Any = None):
        self.index = index
        #: the JAX device behind ``tpu:index`` (None until the platform starts)
        self.jax_device = jax_device
        #: the default generator, made at first use (``random.default_generator``)
        self.generator: Any = None
        #: Python number -> its device scalar (``transfer.device_scalar``; never replaced, as
        #: transfer binds tpu:0's once; cleared with the other caches: ``lru.caches``)
        self.scalars = caches.lru(f"devices.scalars[{index}]", Kind.CONSTANTS)
        #: the largest allocated bytes a query saw (``memory.allocated``; XLA:CPU keeps none)
        self.peak_allocated = 0


class Devices:
    """The local devices' states, in tpu index order (``tpu:i`` is ``states[i]``)."""

    __slots__ = ("_indices", "first", "states")

    def __init__(self) -> None:
        #: ``tpu:0``'s state: the per-op paths read it directly
        self.first = DeviceState(0)
        self.states = [self.first]
        self._indices: dict = {}

    def start(self, jax_devices: list) -> None:
        """Bind the local JAX devices, in tpu index order (once, as the platform starts)."""
        self.first.jax_device = jax_devices[0]
        self.states += [DeviceState(i, d) for i, d in enumerate(jax_devices) if i]
        self._indices = {d: i for i, d in enumerate(jax_devices)}

    def __len__(self) -> int:
        """How many devices: the local ones once started, else 1 (``tpu:0``)."""
        return len(self.states)

    def state(self, index: int) -> DeviceState:
        """``tpu:index``'s state (``index`` checked already: ``platform.check_index``)."""
        return self.states[index]

    def index_of(self, jax_device: Any) -> int:
        """The tpu index of a local JAX device."""
        return self._indices[jax_device]


#: this process's devices
local = Devices()
