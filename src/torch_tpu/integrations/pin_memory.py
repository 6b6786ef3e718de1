"""``DataLoader(pin_memory=True)`` with tpu as the accelerator (the Trainer's default), when the
C++ runtime core is missing.

PyTorch's CPU ``_pin_memory`` kernel asks the PrivateUse1 hooks for a pinned allocator. The C++
runtime core (``runtime.native``) provides one, and then PyTorch's own kernel runs; a Python
backend cannot, so without it the kernel is routed through :func:`_pin_memory` instead.
"""

from __future__ import annotations

import torch


def _pin_memory(host: torch.Tensor, device=None) -> torch.Tensor:
    """``Tensor.pin_memory()`` when tpu is the accelerator: an ordinary contiguous CPU copy.

    Page-locked memory is a CUDA allocator feature with no PJRT counterpart reachable from Python;
    ``device_put`` stages host buffers itself. So "pinned for tpu" is a plain copy (what pinning
    returns), and ``is_pinned()`` stays False. Other devices keep PyTorch's own kernel."""
    target = torch.device(device) if device is not None else torch.accelerator.current_accelerator()
    if target is not None and target.type == "tpu":
        return host.clone(memory_format=torch.contiguous_format)
    return torch.ops.aten._pin_memory.default.redispatch(_COMPOSITE, host, device)


_COMPOSITE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
_host_library = None


def _empty_host_cache(original):
    """``torch.accelerator.empty_host_cache()``: nothing to release on tpu (its pinned host blocks
    are freed with their tensors, never cached). PyTorch's own version looks up a caching host
    allocator for the accelerator, which the C++ runtime core does not register, and crashes on
    the missing one; vLLM calls it at every engine shutdown."""

    def empty_host_cache() -> None:
        accelerator = torch.accelerator.current_accelerator()
        if accelerator is None or accelerator.type != "tpu":
            original()

    return empty_host_cache


def install() -> None:
    """Route CPU ``_pin_memory`` through :func:`_pin_memory` (PyTorch's kernel asks the
    PrivateUse1 hooks for a pinned allocator, which a Python backend cannot provide), so
    ``DataLoader(pin_memory=True)`` -- the Trainer's default -- works; make
    ``torch.accelerator.empty_host_cache()`` safe on tpu."""
    global _host_library
    from ..runtime import native

    torch.accelerator.empty_host_cache = _empty_host_cache(torch.accelerator.empty_host_cache)
    if native.available():
        return
    _host_library = torch.library.Library("aten", "IMPL")
    _host_library.impl("_pin_memory", _pin_memory, "CPU")
