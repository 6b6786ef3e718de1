"""torch_tpu: the TPU as a native PyTorch device, on JAX/XLA.

``import torch_tpu`` (or plain ``import torch``, through PyTorch's backend autoload) makes
``torch.device("tpu")`` a real device whose tensors are plain ``torch.Tensor`` objects and whose
ops run through XLA: on a TPU VM that is the TPU; elsewhere the best JAX platform stands in
(``torch.tpu.get_device_name()`` says which).

Example::

    >>> import torch, torch_tpu
    >>> x = torch.ones(2, 3, device="tpu")
    >>> (x * 2).sum().item()
    12.0
"""
from __future__ import annotations

import threading
from collections import Counter

import torch

from . import _runtime  # noqa: F401  (configures JAX before anything else touches it)
from . import device as _device_module

__version__ = "0.1.0"
__all__ = ["sync", "cpu_fallback_counts", "to_jax", "from_jax", "lowered_ops", "EagerMode",
           "eager_mode", "get_eager_mode", "set_eager_mode"]

_lock = threading.Lock()
_initialized = False


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, device_index: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _register_device() -> None:
    global _initialized
    with _lock:
        if _initialized:
            return
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _setup_privateuseone_for_python_backend(
            "tpu", backend_module=_device_module, hook=_Hooks(), device_guard=_DeviceGuard())
        from . import ops  # noqa: F401  (fills the lowering table)
        from . import _dispatch

        _dispatch.install()
        from . import _serialization  # noqa: F401  (tpu storages for save/load/deepcopy)
        from . import _accelerate, _autocast, _modules, _transfer

        _modules.install()
        _transfer.install()
        _accelerate.install()
        _autocast.install()
        from . import execution

        execution.install()
        from . import _trace_rules

        _trace_rules.install()  # last: it may import the lazily loaded runtime modules
        _initialized = True


_register_device()

from .execution import EagerMode, eager_mode, get_eager_mode, set_eager_mode  # noqa: E402


def sync() -> None:
    """Wait for all queued device work (same as ``torch.tpu.synchronize()``)."""
    _device_module.synchronize()


def cpu_fallback_counts() -> Counter:
    """ATen ops that ran on CPU through ``TORCH_TPU_CPU_FALLBACK=1``, with how often."""
    from ._dispatch import cpu_fallback_counts as counts
    return Counter(counts)


def lowered_ops() -> list[str]:
    """Names of the ATen overloads with a native tpu lowering (derived variants excluded)."""
    from ._registry import LOWERINGS
    return sorted(str(op) for op in LOWERINGS)


def to_jax(tensor: torch.Tensor):
    """The ``jax.Array`` value of a tpu tensor (no copy; in fused eager, runs pending work)."""
    from ._graph import resolved
    from ._tensor import is_tpu, read
    if not is_tpu(tensor):
        raise ValueError(f"to_jax expects a tpu tensor, got a tensor on {tensor.device}")
    return resolved(read(tensor))


def from_jax(array) -> torch.Tensor:
    """A tpu tensor holding a ``jax.Array`` (no copy)."""
    from ._tensor import wrap
    return wrap(array)
