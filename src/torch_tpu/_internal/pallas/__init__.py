"""Upstream TorchTPU's ``_internal.pallas``: ``jax_op`` (``torch_tpu.pallas``) and the kernel
calls Helion's Pallas launcher makes (``pallas.JaxCallable``, ``tpu_torch_pallas``)."""

from __future__ import annotations

from ...pallas import custom_jax_kernel, jax_op

__all__ = ["custom_jax_kernel", "jax_op"]
