"""``torch.save``/``torch.load``, pickle, ``copy.deepcopy`` and safetensors for tpu tensors.

PyTorch moves tensors in and out of files through their *storages*: ``torch.save`` writes the
bytes of ``storage.cpu()`` under the location tag ``"tpu:0"``; ``torch.load`` rebuilds each storage
on the CPU and moves it with ``storage.to("tpu")``; ``copy.deepcopy`` clones the storage; pickle
uses the legacy format, which reads and writes storages through raw data pointers; sharing
(views, tied weights) is recognized by ``data_ptr()``. A C++ backend gets all of this from its
allocator. A tpu storage has none: its bytes are a ``jax.Array`` attached to the Python storage
object (``runtime.buffer``). So the few storage entry points that would reach the allocator or a host
pointer are redirected here, for tpu storages only (every other device runs PyTorch's code
unchanged), and safetensors' loader learns the device name. Saved files are ordinary PyTorch
checkpoints: a process without torch_tpu loads them with ``map_location="cpu"``.

:func:`install` applies the patches (``torch_tpu`` calls it once, at registration).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import device as device_module

_StorageBase = torch._C.StorageBase
_Untyped = torch.UntypedStorage
_TensorBase = torch._C.TensorBase


def _is_tpu(storage: _StorageBase) -> bool:
    return storage.device.type == "tpu"


def _empty_tpu_storage(nbytes: int, index: int) -> torch.UntypedStorage:
    """A tpu storage of ``nbytes`` uninitialized bytes on ``tpu:index``, made the way tpu
    tensors make theirs."""
    from ..runtime import tensor

    holder = tensor.empty([nbytes], torch.uint8, index=index)
    return holder.untyped_storage()  # the storage (and its value) outlives the holder tensor


# ----------------------------------------------------------------------------- patches
def _untyped_storage_new(cls, *args, **kwargs):
    """``torch.UntypedStorage(..., device="tpu")``: C++ would allocate through the device's
    allocator, which a Python backend does not have (the call crashes the process). Reached by
    ``storage.to("tpu")`` (``torch.load`` onto tpu), ``storage.clone()`` (``copy.deepcopy``) and
    ``TypedStorage(..., device="tpu")``."""
    device = kwargs.get("device")
    if device is None or cls is not _Untyped or torch.device(device).type != "tpu":
        return _StorageBase.__new__(cls, *args, **kwargs)
    index = device_module._get_device_index(device)  # refuses a device this process does not drive
    if not args:
        return _empty_tpu_storage(0, index)
    if isinstance(args[0], int):
        return _empty_tpu_storage(args[0], index)
    host = _StorageBase.__new__(_Untyped, *args)  # a sequence of byte values
    return _empty_tpu_storage(host.nbytes(), index).copy_(host)


def _data_ptr(self) -> int:
    """A tpu storage has no host address (C++ raises "invalid python storage" for a storage with
    bytes but no host data). Like a CUDA pointer, what it reports is an opaque device handle: the
    StorageImpl's address, unique and stable while the storage lives, and 0 when it is empty.
    Callers key sharing on it: ``torch.load`` keeps a storage (so views stay shared) only if it
    is nonzero, ``torch.save`` and safetensors detect tensors saved twice by it."""
    if not _is_tpu(self):
        return _StorageBase.data_ptr(self)
    return self._cdata if self.nbytes() else 0


def _tensor_data_ptr(self) -> int:
    """``tensor.data_ptr()`` of a tpu tensor: its storage's handle (:func:`_data_ptr`) plus its
    byte offset, so the two agree as on other devices (C++ adds the offset to a null pointer).
    safetensors and transformers compare them to tell tied weights from views."""
    address = _TensorBase.data_ptr(self)
    if self.device.type == "tpu":
        address += self.untyped_storage().data_ptr()
    return address


def _as_bytes(storage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _copy_(self, source, non_blocking=None):
    """C++ ``storage.copy_`` refuses storages without host data (see :func:`_data_ptr`); copy
    between byte tensors over the two storages instead, which dispatches to tpu's ``copy_``."""
    if not (_is_tpu(self) or _is_tpu(source)):
        return _StorageBase.copy_(self, source, non_blocking)
    if self.nbytes() != source.nbytes():
        raise RuntimeError(
            f"size does not match, self was {self.nbytes()} bytes but src was {source.nbytes()} bytes"
        )
    if self.device == source.device:  # (``copy.deepcopy``'s clone: values are immutable, so the
        from ..runtime import buffer  # copy shares its source's, with no program per shape)

        value = buffer.peek(source)  # (a padded value stays padded)
        buffer.put(self, value if type(value) is buffer.Padded else buffer.get_array(source))
        return self
    _as_bytes(self).copy_(_as_bytes(source), non_blocking=bool(non_blocking))
    return self


def _write_file(self, *args, **kwargs):
    """The legacy format (pickle, ``_use_new_zipfile_serialization=False``) writes from the
    storage's host pointer, which a tpu storage does not have: write a host copy instead."""
    target = self.cpu() if _is_tpu(self) else self
    return _StorageBase._write_file(target, *args, **kwargs)


def _set_from_file(self, *args, **kwargs):
    """The legacy loader reads into the storage's host pointer: read into a host storage of the
    same size, then copy it over."""
    if not _is_tpu(self):
        return _StorageBase._set_from_file(self, *args, **kwargs)
    host = _Untyped(self.nbytes())
    _StorageBase._set_from_file(host, *args, **kwargs)
    return self.copy_(host)


_STORAGE_PATCHES: dict[str, Callable] = {
    "__new__": _untyped_storage_new,
    "data_ptr": _data_ptr,
    "copy_": _copy_,
    "_write_file": _write_file,
    "_set_from_file": _set_from_file,
}


def _safetensors_device(device: Any) -> Any:
    """safetensors' Rust loader only accepts the device names it knows; an index alone means
    "the current accelerator" to torch (``tensor.to(0)``), which is tpu in a torch_tpu process."""
    if isinstance(device, str) and device.split(":")[0] == "tpu":
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type == "tpu":
        device_module._get_device_index(device)
        return device.index or 0
    return device


def _patch_safetensors() -> None:
    try:
        import safetensors
        import safetensors.torch
    except ImportError:
        return
    rust_safe_open = safetensors.safe_open

    def safe_open(filename, framework, device="cpu", *args, **kwargs):
        return rust_safe_open(filename, framework, _safetensors_device(device), *args, **kwargs)

    safe_open.__doc__ = rust_safe_open.__doc__
    safetensors.safe_open = safetensors.torch.safe_open = safe_open


def install() -> None:
    from ..runtime import native

    for name, patch in _STORAGE_PATCHES.items():
        if name != "data_ptr" or not native.available():  # C++ storages have their own handles
            setattr(_Untyped, name, patch)
    if not native.available():
        torch.Tensor.data_ptr = _tensor_data_ptr
    # ``storage.tpu()`` / ``storage.is_tpu`` (PyTorch generates them only on request).
    if not hasattr(torch.storage._StorageBase, "tpu"):
        from torch.utils.backend_registration import _generate_storage_methods_for_privateuse1_backend

        _generate_storage_methods_for_privateuse1_backend("tpu")
    _patch_safetensors()
