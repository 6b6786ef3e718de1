"""Upstream TorchTPU's ``_internal.pallas.pallas``, as Helion's Pallas launcher imports it
(``JaxCallable``, ``jax_placeholder``, ``_get_kernel_invocation_key``): re-exported from
``torch_tpu.pallas._jax_callable``."""

from __future__ import annotations

from ...pallas import jax_op
from ...pallas._jax_callable import (
    JAX_TO_TORCH_DTYPE_MAP,
    TORCH_TO_JAX_DTYPE_MAP,
    JaxCallable,
    _get_kernel_invocation_key,
    custom_jax_kernel,
    jax_placeholder,
    jax_placeholders,
    torch_placeholder,
)
from . import tpu_torch_pallas

__all__ = [
    "JAX_TO_TORCH_DTYPE_MAP",
    "TORCH_TO_JAX_DTYPE_MAP",
    "JaxCallable",
    "_get_kernel_invocation_key",
    "custom_jax_kernel",
    "jax_op",
    "jax_placeholder",
    "jax_placeholders",
    "torch_placeholder",
    "tpu_torch_pallas",
]
