"""Upstream TorchTPU's ``_internal.pallas`` import path, which Helion's Pallas launcher uses:
``jax_op``, ``custom_jax_kernel``, and the modules ``pallas`` (``JaxCallable``) and
``tpu_torch_pallas``. Only re-exports: the code is in ``torch_tpu.pallas``."""

from __future__ import annotations

from ...pallas import custom_jax_kernel, jax_op
from . import pallas, tpu_torch_pallas

__all__ = ["custom_jax_kernel", "jax_op", "pallas", "tpu_torch_pallas"]
