"""The C++ runtime core (``torch_tpu._C``, built from ``csrc/runtime``) and the callbacks it makes.

PyTorch reaches some device features only through C++ interfaces a Python backend cannot
implement: ``torch.Generator(device="tpu")``, ``torch.accelerator.synchronize()`` and its memory
statistics, ``untyped_storage().resize_()`` (FSDP2), a ``data_ptr()`` per storage, pinned host
memory, device indices. The extension implements those interfaces and asks Python for every
decision: the functions below are its callbacks (no JAX at import; they import what they need).
It also serves two steps of every op in one call each, for their common case only
(``tensor.whole_value``, ``tensor._wrap_value``), an op's calls that repeat a kept plan, and a
fused graph's nodes that repeat the last graph's (``execution.fused.record_in_core``).

Without the extension (not built, or built against another torch) ``import torch_tpu`` still
works, with one warning naming what is missing, and those features keep their Python fallbacks.
"""

from __future__ import annotations

import warnings

try:
    from .. import _C
except ImportError as error:  # not built, or for another torch
    _C = None
    _error: ImportError | None = error
else:
    _error = None

#: What is unavailable without the extension (named by the warning).
MISSING_WITHOUT = (
    'torch.Generator(device="tpu") and generator= on tpu random ops, '
    "torch.accelerator.synchronize() and memory statistics, untyped_storage().resize_() "
    "(FSDP2), per-storage data_ptr() handles from C++, pinned memory (pin_memory() returns "
    "an ordinary copy), torch.Stream/torch.Event on tpu"
)


def available() -> bool:
    return _C is not None


def install(device_count: int) -> bool:
    """Register the C++ hooks, device guard and allocator (before PyTorch's Python backend
    registration, which then keeps them); False, after one warning, without the extension."""
    if _C is None:
        warnings.warn(
            f"torch_tpu: the C++ runtime core could not be loaded ({_error}); unavailable: "
            f"{MISSING_WITHOUT}. Reinstall torch_tpu (pip install -e .) to build it.",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    import sys

    _C.install(sys.modules[__name__], device_count)
    return True


# ----------------------------------------------------------------------------- callbacks
def is_initialized() -> bool:
    from . import platform

    return platform.is_initialized()


def device_used(index: int) -> None:
    """A device other than tpu:0 became current for the first time."""
    from . import platform

    platform.use(index)


def synchronize(index: int) -> None:
    from .. import device

    device.synchronize(index)


def memory_stats(index: int) -> tuple[int, int, int, int, int]:
    """(allocated, peak allocated, reserved, peak reserved, live buffers) in bytes."""
    from . import memory

    return memory.allocator_stats(index)


def reset_peak_memory_stats(index: int) -> None:
    from . import memory

    memory.reset_peak(index)


def empty_cache() -> None:
    from .. import device

    device.empty_cache()


def mem_get_info(index: int) -> tuple[int, int]:
    from .. import device

    return device.mem_get_info(index)


def resize_storage(storage, nbytes: int) -> None:
    """``storage.resize_(nbytes)``: the buffer keeps its first bytes (new bytes are zeros)."""
    from . import tensor

    tensor.resize_storage(storage, nbytes)
