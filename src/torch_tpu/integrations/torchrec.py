"""Teach TorchRec what its device lists get wrong about tpu.

- **Each process's chip is its ``tpu:0``.** TorchRec names rank ``r``'s device
  ``<type>:<r % local world size>`` (CUDA's layout: every process sees every GPU of its host). A
  tpu process drives one chip, its ``tpu:0`` (as ``DistributedDataParallel`` on tpu takes no
  ``device_ids``), so the shards' placements said ``tpu:1`` on rank 1 and
  ``DistributedModelParallel`` refused its own tensors ("Local shard tensor device does not match
  with local Shard's placement"). The planner's and ``sharding_plan``'s ``placement`` now name
  ``tpu:0`` for a tpu rank; the rank, which decides where a shard lives, is unchanged.
- **The fused modules' default location.** ``FusedEmbeddingBagCollection(device="tpu")``
  without ``location`` raised "EmbeddingLocation could not be set": it now takes
  ``EmbeddingLocation.HOST``, the location TorchRec's own sharded kernels choose for tpu (fbgemm's
  host code path, with every tensor on tpu: ``integrations.fbgemm_tbe``).

- **The dense kernels' device.** TorchRec's data-parallel (and ``dense``) embedding kernels build
  fbgemm's ``DenseTableBatchedEmbeddingBagsCodegen``, which knows CPU, CUDA and MTIA: on tpu it
  was left on CPU, and ``DistributedDataParallel`` refused it. It now moves to the kernel's tpu
  (its lookup: ``integrations.fbgemm_tbe``), and the per-table views are taken again.

- **TorchRec's own tpu kernel** (``UNFUSED_TPU``, which the planner offers for tpu): its
  ``torchrec::`` lookup ops get tpu lowerings (``ops.fbgemm``) when TorchRec defines them.

Applied when those TorchRec modules are imported, so ``import torch_tpu`` never imports TorchRec.
"""

from __future__ import annotations

import functools
import inspect

import torch

from ..runtime.import_hooks import after_import

_MARK = "_torch_tpu"
#: the TorchRec modules that name a rank's device with a ``placement`` of their own binding
PLACEMENT_MODULES = (
    "torchrec.distributed.planner.utils",
    "torchrec.distributed.planner.planners",
    "torchrec.distributed.sharding_plan",
)


def _one_chip_per_process(module) -> None:
    vendor = getattr(module, "placement", None)
    if vendor is None or getattr(vendor, _MARK, False):
        return

    @functools.wraps(vendor)
    def placement(compute_device: str, rank: int, local_size: int) -> str:
        return vendor(compute_device, rank, 1 if compute_device == "tpu" else local_size)

    setattr(placement, _MARK, True)
    module.placement = placement


def _adapt_init(cls, before=None, after=None) -> None:
    """Wrap ``cls.__init__`` (once): where its ``device`` argument is tpu, ``before(arguments)``
    adjusts the call's arguments and ``after(self, device)`` finishes the object."""
    vendor_init = cls.__init__
    if getattr(vendor_init, _MARK, False):
        return
    signature = inspect.signature(vendor_init)

    @functools.wraps(vendor_init)
    def __init__(self, *args, **kwargs):
        call = signature.bind(self, *args, **kwargs)
        device = call.arguments.get("device")
        on_tpu = device is not None and torch.device(device).type == "tpu"
        if on_tpu and before is not None:
            before(call.arguments)
        vendor_init(*call.args, **call.kwargs)
        if on_tpu and after is not None:
            after(self, torch.device(device))

    setattr(__init__, _MARK, True)
    cls.__init__ = __init__


def _host_location_on_tpu(module) -> None:
    def host_location(arguments: dict) -> None:
        if arguments.get("location") is None:
            arguments["location"] = module.EmbeddingLocation.HOST

    _adapt_init(module.FusedEmbeddingBagCollection, before=host_location)


def _dense_kernels_on_tpu(module) -> None:
    def moved_to_tpu(kernel, device: torch.device) -> None:
        kernel._emb_module.to(device)
        views = module._gen_named_parameters_by_table_dense(
            kernel._emb_module, kernel.table_name_to_count.copy(), kernel._config
        )
        kernel._param_per_table = dict(views)
        kernel.init_parameters()

    for cls in (module.BatchedDenseEmbeddingBag, module.BatchedDenseEmbedding):
        _adapt_init(cls, after=moved_to_tpu)


def _torchrec_ops(module) -> None:
    from .fbgemm import register_lowerings

    register_lowerings("torchrec")


def install() -> None:
    for name in PLACEMENT_MODULES:
        after_import(name, _one_chip_per_process)
    after_import("torchrec.modules.fused_embedding_modules", _host_location_on_tpu)
    after_import("torchrec.distributed.batched_embedding_kernel", _dense_kernels_on_tpu)
    after_import("torchrec.experimental.torch_tpu.pallas.ops", _torchrec_ops)
