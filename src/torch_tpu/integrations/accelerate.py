"""Teach Hugging Face Accelerate (which ``transformers.Trainer`` runs on) the tpu device.

Accelerate picks its device and its distributed backend from fixed vendor lists (mps, mlu, npu,
cuda, xpu, ...; ``torch_xla`` for anything TPU) and otherwise falls back to CPU, so on its own it
neither trains on tpu nor sees a ``torchrun`` job on tpu as distributed. Two answers are
adapted, only where Accelerate found none of its own devices and tpu is the current accelerator:

- ``PartialState.default_device`` (one process): CPU becomes tpu. The Trainer itself already picks
  ``tpu:0`` through ``torch.accelerator``; without this the model sits on tpu and every batch
  arrives on CPU. (Accelerate's escape hatch ``ACCELERATE_TORCH_DEVICE`` would also override
  ``Accelerator(cpu=True)``.)
- ``PartialState._prepare_backend`` and ``set_device`` (launched by ``torchrun``: ``LOCAL_RANK``
  set): the backend becomes ``"tpu_dist"`` (or the one asked for) with Accelerate's
  ``MULTI_CPU`` distributed type, and the device this rank's tpu. ``MULTI_CPU`` is Accelerate's
  path for one device per process without CUDA's ``device_ids``: it creates the process group
  from the launcher's environment, wraps the model in ``DistributedDataParallel`` without
  ``device_ids`` (what tpu wants: each rank's tpu is its own ``tpu:0``), shards the data, and
  gathers and broadcasts through ``torch.distributed`` (CPU tensors go to the group's gloo
  part). Its only CPU-specific step, the device, is replaced here.

The patch is applied when ``accelerate.state`` is imported (now, if it already is), so
``import torch_tpu`` never imports Accelerate itself.
"""

from __future__ import annotations

import os

import torch

from ..runtime.import_hooks import after_import

_MARK = "_torch_tpu"


def _tpu_is_current() -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "tpu"


def _tpu_device() -> torch.device:
    return torch.device("tpu", torch.accelerator.current_device_index())


def _patch(state_module) -> None:
    cls = state_module.PartialState
    if getattr(cls.set_device, _MARK, False):
        return
    distributed_type = state_module.DistributedType
    vendor_default, vendor_prepare, vendor_set_device = (
        cls.default_device,
        cls._prepare_backend,
        cls.set_device,
    )

    def default_device(self) -> torch.device:
        device = vendor_default.fget(self)
        return _tpu_device() if device.type == "cpu" and _tpu_is_current() else device

    def _prepare_backend(self, cpu: bool = False, sagemaker_dp=False, backend: str | None = None):
        chosen, kind = vendor_prepare(self, cpu, sagemaker_dp, backend)
        launched = int(os.environ.get("LOCAL_RANK", -1)) != -1
        if kind == distributed_type.NO and launched and not cpu and _tpu_is_current():
            self._torch_tpu_distributed = True  # (in the shared state: set_device reads it)
            return backend or "tpu_dist", distributed_type.MULTI_CPU
        return chosen, kind

    def set_device(self) -> None:
        if self.device is None and self.__dict__.get("_torch_tpu_distributed"):
            self.device = _tpu_device()
            return
        vendor_set_device(self)

    for name, fn, vendor in [
        ("_prepare_backend", _prepare_backend, vendor_prepare),
        ("set_device", set_device, vendor_set_device),
    ]:
        fn.__doc__ = vendor.__doc__
        setattr(cls, name, fn)
    default_device.__doc__ = vendor_default.__doc__
    cls.default_device = property(default_device)
    setattr(cls.set_device, _MARK, True)


def install() -> None:
    after_import("accelerate.state", _patch)
