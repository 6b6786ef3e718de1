"""fbgemm's sparse ops on tpu (their lowerings: ``ops.fbgemm``).

fbgemm (``fbgemm_gpu``, TorchRec's kernel library; its CPU build ``fbgemm-gpu-cpu``) defines its
ops when it is imported, so their tpu kernels are registered then: ``install`` waits for that
import, and nothing here imports fbgemm or JAX before it."""

from __future__ import annotations

import functools

import torch

from ..runtime.import_hooks import after_import


@functools.cache
def register(module=None) -> None:
    """Register the lowerings as the ops' tpu kernels (once fbgemm has defined the ops)."""
    library = register_lowerings("fbgemm")  # (first: it starts torch_tpu, which JAX's use awaits)
    from . import fbgemm_tbe

    fbgemm_tbe.register(library)


def register_lowerings(namespace: str) -> torch.library.Library:
    """``ops.fbgemm``'s lowerings of ``namespace``'s ops as their tpu kernels (the ops the
    namespace's library has defined by now); the library they are registered in."""
    from .. import device

    device.init()  # (the dispatcher's machinery)
    from ..ops import dispatch
    from ..ops.fbgemm import LOWERINGS
    from ..ops.registry import Lowering, Runs

    library = torch.library.Library(namespace, "IMPL")
    dispatch.libraries.append(library)
    for name, (fn, options) in LOWERINGS[namespace].items():
        packet = getattr(getattr(torch.ops, namespace), name, None)
        if packet is None:  # (a version without this op)
            continue
        runs = Runs.HOST if options.get("runs") == "host" else Runs.TRACED
        entry = Lowering(packet.default, fn, runs=runs, custom=True, family=namespace)
        library.impl(packet.default, dispatch.kernel_of(entry), "PrivateUse1")
    return library


def install() -> None:
    after_import("fbgemm_gpu", register)
