"""Teach Hugging Face Accelerate (which ``transformers.Trainer`` runs on) the tpu device.

Accelerate picks its device from a fixed list of vendor checks (``PartialState.default_device``:
mps, mlu, npu, cuda, xpu, ...) and falls back to CPU, while the Trainer itself already picks
``tpu:0`` through ``torch.accelerator``. The two then disagree: the model sits on tpu and every
batch arrives on CPU. Accelerate's own escape hatch, ``ACCELERATE_TORCH_DEVICE``, would also
override ``Accelerator(cpu=True)``, so instead the CPU answer of ``default_device`` becomes tpu
when tpu is the current accelerator. The patch is applied when ``accelerate.state`` is imported
(now, if it already is), so ``import torch_tpu`` never imports Accelerate itself.
"""

from __future__ import annotations

import torch

from .import_hooks import after_import


def _patch(state_module) -> None:
    cls = state_module.PartialState
    vendor_default = cls.default_device
    if getattr(vendor_default.fget, "_torch_tpu", False):
        return

    def default_device(self) -> torch.device:
        device = vendor_default.fget(self)
        accelerator = torch.accelerator.current_accelerator()
        if device.type == "cpu" and accelerator is not None and accelerator.type == "tpu":
            return torch.device("tpu", torch.accelerator.current_device_index())
        return device

    default_device._torch_tpu = True
    default_device.__doc__ = vendor_default.__doc__
    cls.default_device = property(default_device)


def install() -> None:
    after_import("accelerate.state", _patch)
