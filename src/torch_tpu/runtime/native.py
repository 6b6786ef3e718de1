"""The C++ runtime core (``torch_tpu._C``, built from ``csrc/runtime``), loaded.

PyTorch reaches some device features only through C++ interfaces a Python backend cannot
implement: ``torch.Generator(device="tpu")``, ``torch.accelerator.synchronize()`` and its memory
statistics, ``untyped_storage().resize_()`` (FSDP2), a ``data_ptr()`` per storage, pinned host
memory, device indices. The extension implements those interfaces and asks Python for every
decision: the functions of :mod:`.callbacks` (this module imports no other runtime module, so
every runtime module may import it).
It also serves two steps of every op in one call each, for their common case only
(``tensor.whole_value``, ``tensor._wrap_value``), an op's calls that repeat a kept plan, and a
fused graph's nodes that repeat the last graph's (``flags.record_in_core``).

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


def install(callbacks, device_count: int) -> bool:
    """Register the C++ hooks, device guard and allocator (before PyTorch's Python backend
    registration, which then keeps them), which call the functions of ``callbacks`` (the module
    :mod:`.callbacks`) by name; False, after one warning, without the extension."""
    if _C is None:
        warnings.warn(
            f"torch_tpu: the C++ runtime core could not be loaded ({_error}); unavailable: "
            f"{MISSING_WITHOUT}. Reinstall torch_tpu (pip install -e .) to build it.",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    _C.install(callbacks, device_count)
    return True


# ----------------------------------------------------------------------------- names
def check_python_names() -> None:
    """Check that every Python name the C++ core reaches by string exists where it reads it
    (``_C.python_names()``: the table in ``csrc/runtime/PythonNames.h``): a global of its
    module, or an attribute, slot or method of its class's instances (one the class's
    ``__init__`` sets counts). Raises RuntimeError naming each missing one; jax's types are
    checked where this jax has them at the path named. Nothing to check without the core."""
    if _C is None:
        return
    missing = []
    for owner_path, name in _C.python_names():
        owner = _resolve(owner_path)
        if owner is None:
            if owner_path.startswith("torch_tpu."):
                missing.append(f"{owner_path} (itself)")
            continue
        if not _has(owner, name):
            missing.append(f"{owner_path}.{name}")
    if missing:
        raise RuntimeError(
            f"torch_tpu: the C++ core reads Python names that do not exist: {', '.join(missing)}. "
            "Restore them, or update csrc/runtime/PythonNames.h and rebuild (pip install -e .)"
        )


def _resolve(path: str) -> object:
    """The module, or the class inside one, that ``path`` names; None where there is none."""
    import importlib

    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            found = getattr(found, part, None)
        return found
    return None


def _has(owner: object, name: str) -> bool:
    import types

    if hasattr(owner, name):  # a module's global; a class's attribute, method, slot or property
        return True
    if isinstance(owner, types.ModuleType):
        return False
    code = getattr(getattr(owner, "__init__", None), "__code__", None)
    return code is not None and name in code.co_names  # (an attribute its __init__ sets)
