"""The XLA platform behind the "tpu" device: chosen once, reported truthfully."""
from __future__ import annotations

import functools

import jax

from . import _compilation_cache, config

jax.config.update("jax_enable_x64", True)  # int64/float64 tensors keep their width, like torch

_PLATFORM_ALIASES = {"gpu": "cuda", "cuda": "cuda", "tpu": "tpu", "cpu": "cpu"}
if config.platform:
    if config.platform not in _PLATFORM_ALIASES:
        raise ValueError(f"TORCH_TPU_PLATFORM must be one of cpu, gpu, tpu; got {config.platform!r}")
    jax.config.update("jax_platforms", _PLATFORM_ALIASES[config.platform])


if config.cache_dir:
    # Every compiled executable (strict eager's per-op ones, fused graphs, later compiled
    # models) persists, so a second process skips XLA compilation for what it has seen before.
    _compilation_cache.enable(config.cache_dir, config.cache_min_compile_seconds)


@functools.lru_cache(maxsize=None)
def device() -> jax.Device:
    """The JAX device that backs ``tpu:0`` (TPU if present, else GPU, else CPU)."""
    return jax.devices()[0]


def platform() -> str:
    return device().platform


def device_name() -> str:
    d = device()
    if d.platform == "tpu":
        return getattr(d, "device_kind", "TPU")
    return f"XLA:{d.platform.upper()} (stand-in)"
