"""Upstream TorchTPU's C++ ``tpu_torch_pallas`` module, as Helion's Pallas launcher calls it:
re-exported from ``torch_tpu.pallas._custom_kernels``."""

from __future__ import annotations

from ...pallas._custom_kernels import call_custom_kernel, lookup_custom_kernel, register_custom_kernel

__all__ = ["call_custom_kernel", "lookup_custom_kernel", "register_custom_kernel"]
