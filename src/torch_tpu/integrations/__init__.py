"""The parts of PyTorch and its ecosystem taught about tpu, installed at registration (none of
them imports JAX): ``autocast`` (per-op casting on AutocastPrivateUse1), ``modules``
(``Module.to`` moves parameters in place, as for CUDA), ``serialization`` (save/load, deepcopy,
safetensors), ``pin_memory`` (``DataLoader(pin_memory=True)``), ``accelerate`` (Accelerate's
default device), ``generation`` (Hugging Face ``generate()`` with a static cache),
``runtime.dynamo`` (Dynamo never traces the runtime; it lives with the modules it marks),
``printing`` (a printed tensor is formatted on the host), ``inductor`` (``torch.compile``'s
default backend compiles tpu graphs with the "tpu" backend), ``fbgemm`` (TorchRec's sparse ops, once
fbgemm is imported), ``torchrec`` (a tpu rank's device is its ``tpu:0``; the fused modules'
default location)."""

from __future__ import annotations

from ..runtime import dynamo


def install() -> None:
    from . import (
        accelerate,
        autocast,
        fbgemm,
        generation,
        inductor,
        modules,
        pin_memory,
        printing,
        serialization,
        torchrec,
    )

    for integration in (
        modules,
        serialization,
        pin_memory,
        accelerate,
        generation,
        autocast,
        dynamo,
        printing,
        inductor,
        fbgemm,
        torchrec,
    ):
        integration.install()
