"""``torch.compile(model)`` with PyTorch's default backend, on tpu tensors, compiles with the
"tpu" backend, as upstream TorchTPU routes it.

PyTorch's Inductor has a Pallas code generator for a device named "tpu" (written for a real
TPU): on tpu tensors it fails on any other platform ("Unsupported TPU device kind: cpu"), and
its kernels call ``jax.config.update('jax_enable_x64', False)``, which turns JAX's 64-bit types
off for the whole process: every later int64 or random op on tpu then fails. A call of the
default backend (``torch._TorchCompileInductorWrapper``) whose example inputs include a tpu
tensor goes to :func:`torch_tpu.frontends.compile.backend` instead; Inductor's ``mode`` and
``options`` (which tune Inductor's own code generation) do not apply to it.
"""

from __future__ import annotations

import functools

import torch


def _on_tpu(inputs) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in inputs)


def install() -> None:
    """Route the default backend's tpu graphs to the "tpu" backend (once)."""
    wrapper = torch._TorchCompileInductorWrapper
    compile_with_inductor = wrapper.__call__
    if getattr(compile_with_inductor, "routes_tpu", False):
        return

    @functools.wraps(compile_with_inductor)
    def __call__(self, model_, inputs_):
        if _on_tpu(inputs_):
            from ..frontends.compile import backend

            return backend(model_, inputs_)
        return compile_with_inductor(self, model_, inputs_)

    __call__.routes_tpu = True
    wrapper.__call__ = __call__
