"""Host <-> device copies (numpy has no bfloat16 for torch, so it travels as int16 bits)."""
from __future__ import annotations

import warnings

import jax
import numpy as np
import torch
from jax import lax
import jax.numpy as jnp

from . import _graph, _runtime


def _host_array(host: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a numpy array the device value may keep. On the CPU platform
    ``device_put(..., may_alias=False)`` still aliases suitably aligned host memory (torch's
    allocations are), so a tensor mutated after its transfer would change the device value."""
    array = host.numpy()
    return array.copy() if _runtime.platform() == "cpu" else array


def to_device(host: torch.Tensor) -> jax.Array:
    """A device copy of a CPU tensor (never aliasing it: torch may mutate the host tensor later)."""
    host = host.detach().resolve_conj().resolve_neg().contiguous()
    if host.dtype == torch.bfloat16:
        bits = jax.device_put(_host_array(host.view(torch.int16)), _runtime.device())
        return lax.bitcast_convert_type(bits, jnp.bfloat16)
    return jax.device_put(_host_array(host), _runtime.device())


def _host_view(value: jax.Array) -> torch.Tensor:
    """A read-only CPU tensor over the value's host copy (zero-copy on the CPU platform)."""
    value = _graph.for_host(value)  # a sync point in fused eager
    if value.dtype == jnp.bfloat16:  # numpy has no bfloat16 that torch understands: move bits
        return _host_view(lax.bitcast_convert_type(value, jnp.int16)).view(torch.bfloat16)
    with warnings.catch_warnings():  # the view is only read, never written
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.asarray(value))


def to_host(value: jax.Array) -> torch.Tensor:
    """A new CPU tensor with the value's contents, owning ordinary (resizable) storage."""
    view = _host_view(value)
    return torch.empty(view.shape, dtype=view.dtype).copy_(view)


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


def install() -> None:
    """Route CPU ``_pin_memory`` through :func:`_pin_memory` (PyTorch's kernel asks the
    PrivateUse1 hooks for a pinned allocator, which a Python backend cannot provide), so
    ``DataLoader(pin_memory=True)`` -- the Trainer's default -- works."""
    global _host_library
    _host_library = torch.library.Library("aten", "IMPL")
    _host_library.impl("_pin_memory", _pin_memory, "CPU")
