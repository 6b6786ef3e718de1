"""Registered kernels run on tpu tensors (upstream's C++ ``tpu_torch_pallas``, which Helion's
Pallas launcher calls directly on its hot path, through ``torch_tpu._internal.pallas``).

A kernel is a pure JAX function of the input arrays returning a flat list of outputs
(``JaxCallable`` registers one per argument signature). Running it goes through
``buffer.apply``, so it runs at once in strict eager, is recorded into fused graphs and traced
into compiled programs like any lowering.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

_KERNELS: dict[tuple[str, str], Callable] = {}


def register_custom_kernel(name: str, kernel_key: str, *, fn: Callable) -> None:
    _KERNELS[name, kernel_key] = fn


def lookup_custom_kernel(name: str, kernel_key: str) -> bool:
    return (name, kernel_key) in _KERNELS


def call_custom_kernel(
    name: str,
    kernel_key: str,
    *,
    inputs: Sequence[torch.Tensor],
    output_shapes: Sequence[torch.Tensor] | None = None,
    input_output_aliases: Mapping[int, int] | None = None,
    donate_argnums: Sequence[int] | None = None,
    device_assignment: Sequence[int] | None = None,
) -> list[torch.Tensor]:
    """The outputs of kernel ``(name, kernel_key)`` on ``inputs`` (tpu tensors). An aliased
    input (``{input: output}``) is written with that output and returned in its place.
    (``output_shapes`` and ``donate_argnums`` are the kernel's own: its outputs come from the
    function, and its jitted function donates.)"""
    from ..runtime import buffer, tensor

    fn = _KERNELS.get((name, kernel_key))
    if fn is None:
        raise RuntimeError(f"no custom kernel {name!r} registered under {kernel_key!r}")
    if device_assignment is not None and len(device_assignment) > 1:
        raise NotImplementedError(f"{name}: kernels over several devices ({list(device_assignment)})")
    for i, t in enumerate(inputs):
        if not tensor.is_tpu(t):
            where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
            raise RuntimeError(f"{name}: expected input {i} to be a tpu tensor, got {where}")
    outs = buffer.apply(fn, *(tensor.read(t) for t in inputs))
    results = [tensor.wrap(o) for o in outs]
    for i, o in (input_output_aliases or {}).items():
        tensor.write(inputs[i], outs[o])
        results[o] = inputs[i]
    return results
