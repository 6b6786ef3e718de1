"""``torch.distributed`` on tpu: the ``"tpu_dist"`` process-group backend.

Registered at ``import torch_tpu`` without importing JAX: ``init_process_group("tpu_dist")``
works, and ``"tpu_dist"`` is the default backend for tpu tensors
(``Backend.default_device_backend_map["tpu"]``, so ``init_process_group()`` on a tpu machine,
``init_device_mesh("tpu", ...)`` and code that looks the backend up by device type find it).

- ``runtime``: JAX's multi-process runtime, joined from the launcher's environment;
- ``watchdog``: what bounds every collective by its group's timeout, naming the missing ranks;
- ``handshake``: the debug mode's store meeting before each collective (mismatched calls);
- ``programs``: the collectives as jitted ``shard_map`` programs over the group's devices;
- ``process_group``: the c10d process group that ties them to tensors;
- ``topology`` and ``run``: a TPU slice's shape from its VM, the launcher, topology-aware meshes.

See docs/distributed.md.
"""

from __future__ import annotations

import torch.distributed as dist

BACKEND = "tpu_dist"


def _create(options, backend_options=None):
    from .process_group import create

    return create(options, backend_options)


def register() -> None:
    """Register the backend and the device-start hook (idempotent; imports no JAX)."""
    from ..runtime import platform
    from .runtime import join_from_environment
    from .topology import claim_chip

    if not dist.is_available():
        return
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["tpu"])
    for hook in (claim_chip, join_from_environment):
        if hook not in platform.before_start:
            platform.before_start.append(hook)
