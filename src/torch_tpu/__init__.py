"""torch_tpu: the TPU as a native PyTorch device, on JAX/XLA.

``import torch_tpu`` (or plain ``import torch``, through PyTorch's backend autoload) makes
``torch.device("tpu")`` a real device whose tensors are plain ``torch.Tensor`` objects and whose
ops run through XLA: on a TPU VM that is the TPU; elsewhere the best JAX platform stands in
(``torch.tpu.get_device_name()`` says which).

Importing registers the device and nothing more: JAX is imported, configured and handed its
work the first time a tpu tensor is made (or ``torch.tpu.init()`` is called), so processes that
never use tpu pay almost nothing for having it installed.

The package is layered; each layer imports only the public names of those below it:

- ``runtime``: the device and its values (platform, buffers, tensors, transfers, the generator,
  per-thread execution state, deferred value checks, memory);
- ``execution``: how ops run (eager modes, fused graphs, traces of compiled programs);
- ``ops``: the lowering table and the dispatcher that installs it;
- ``frontends``: ``torch.compile(backend="tpu")`` and export to StableHLO;
- ``distributed``: the ``"tpu_dist"`` process-group backend (XLA collectives across processes);
- ``integrations``: the parts of PyTorch and its ecosystem taught about tpu (autocast,
  ``Module.to``, serialization, pinned memory, Accelerate);
- ``demo`` and ``testing``: a small GPT and its corpus, and the Hugging Face model zoo used by
  the tests (user-level code, not part of the runtime).

Example::

    >>> import torch, torch_tpu
    >>> x = torch.ones(2, 3, device="tpu")
    >>> (x * 2).sum().item()
    12.0
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch

from . import device as _device_module
from .runtime import callbacks as _callbacks
from .runtime import native as _native
from .runtime import platform as _platform

__version__ = "0.1.0"
__all__ = [
    "sync",
    "cpu_fallback_counts",
    "to_jax",
    "from_jax",
    "lowered_ops",
    "EagerMode",
    "eager_mode",
    "get_eager_mode",
    "set_eager_mode",
    "to_stablehlo",
    "pad_to_bucket",
    "bucket_size",
    "async_compile",
    "diagnose",
]

_lock = threading.RLock()
_registered = False
_initialized = False


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, device_index: int) -> bool:
        return _platform.is_initialized()

    def is_built(self) -> bool:
        return True


class _DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _first_use(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """The PrivateUse1 fallback: the first tpu op starts the device and installs the lowerings,
    then runs again; after that it handles only ops with no lowering."""
    if not _initialized:
        _initialize()
        return op(*args, **kwargs)
    from .ops import dispatch

    return dispatch.fallback(op, *args, **kwargs)


def _register() -> None:
    """What ``import torch`` does for tpu: the device, its module and hooks, and the PyTorch
    integrations that must exist before the first op (no JAX). The C++ runtime core registers
    first; PyTorch's Python backend registration then keeps its hooks and guard (the Python ones
    below serve only when the extension is missing)."""
    global _registered
    with _lock:
        if _registered:
            return
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _native.install(_callbacks, _platform.known_device_count())  # (raised when the device starts)

        _setup_privateuseone_for_python_backend(
            "tpu", backend_module=_device_module, hook=_Hooks(), device_guard=_DeviceGuard()
        )
        _add_memory_module()
        first_use = torch.library.Library("_", "IMPL")
        first_use.fallback(_first_use, "PrivateUse1")
        _libraries.append(first_use)
        from .integrations import install

        install()
        from . import distributed

        distributed.register()  # the "tpu_dist" process-group backend
        _registered = True


_libraries: list = []


def _add_memory_module() -> None:
    """``torch.tpu.memory`` (``torch.cuda.memory``'s counterpart: the memory history), a
    submodule of ``torch.tpu`` that ``import torch.tpu.memory`` finds too."""
    from . import memory
    from .runtime import compiler

    _device_module.memory = memory
    sys.modules["torch.tpu.memory"] = memory
    _device_module.compiler = compiler  # (torch.tpu.compiler: XLA's options)
    sys.modules["torch.tpu.compiler"] = compiler


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector held off while the device starts: JAX's import and the lowering
    table allocate a great many objects that all live on, and each full collection meanwhile
    walks the whole heap of torch and JAX (about a third of the start's time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _initialize() -> None:
    """Start the device: JAX configured, the lowering table installed, execution hooks set."""
    global _initialized
    with _lock:
        if _initialized:
            return
        with _collector_paused():
            _platform.initialize()
            from . import ops  # noqa: F401  (fills the lowering table)
            from .execution import modes
            from .ops import dispatch

            dispatch.install()
            modes.install()
            _native.check_python_names()  # (every module the core reads is loaded by now)
            _initialized = True
    from .runtime import dynamo

    dynamo.refresh()  # the modules just loaded are runtime too
    from . import config

    if config.flash_attention:
        from .kernels import use_flash_attention

        use_flash_attention(True)


_platform.start = _initialize  # (how the layers below start the device)
_register()

from .execution.modes import EagerMode, eager_mode, get_eager_mode, set_eager_mode  # noqa: E402


def sync() -> None:
    """Wait for all queued device work (same as ``torch.tpu.synchronize()``)."""
    _device_module.synchronize()


def cpu_fallback_counts() -> Counter:
    """ATen ops that ran on CPU through ``TORCH_TPU_CPU_FALLBACK=1``, with how often."""
    _initialize()
    from .ops.dispatch import recording

    return Counter(recording.cpu_fallback_counts)


def lowered_ops() -> list[str]:
    """Names of the ATen overloads with a native tpu lowering (derived variants excluded)."""
    _initialize()
    from .ops.registry import LOWERINGS

    return sorted(str(op) for op in LOWERINGS)


def to_jax(tensor: torch.Tensor):
    """The ``jax.Array`` value of a tpu tensor (no copy; in fused eager, runs pending work)."""
    from .runtime.checks import before_host_read
    from .runtime.tensor import is_tpu, read

    if not is_tpu(tensor):
        raise ValueError(f"to_jax expects a tpu tensor, got a tensor on {tensor.device}")
    return before_host_read(read(tensor))


def from_jax(array) -> torch.Tensor:
    """A tpu tensor holding a ``jax.Array`` (no copy)."""
    _initialize()
    from .runtime.tensor import wrap

    return wrap(array)


def __getattr__(name: str) -> Any:
    """The public functions of the layers above, imported on first use (``torch_tpu.to_stablehlo``,
    ``torch_tpu.pad_to_bucket``, ``torch_tpu.bucket_size``, ``torch_tpu.async_compile``,
    ``torch_tpu.diagnose``)."""
    if name == "diagnose":
        from .diagnosis import diagnose

        return diagnose
    if name == "async_compile":
        from .execution.warmup import async_compile

        return async_compile
    if name == "to_stablehlo":
        from .frontends.export import to_stablehlo

        return to_stablehlo
    if name in ("pad_to_bucket", "bucket_size"):
        from .frontends import compile

        return getattr(compile, name)
    raise AttributeError(f"module 'torch_tpu' has no attribute {name!r}")
