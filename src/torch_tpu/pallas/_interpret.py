"""Where Pallas TPU kernels run: compiled through Mosaic on a TPU, in Pallas' TPU interpret mode
on any other platform (the XLA:CPU stand-in, a GPU), which runs a kernel's body with the
platform's own ops while modelling one TPU chip's memories."""

from __future__ import annotations

import contextlib
import functools
import logging

_log = logging.getLogger("torch_tpu")

#: The TPU generation Pallas kernels are interpreted as on other platforms (TPU interpret mode
#: models one chip's memories); what ``_internal.utils.hardware`` reports there.
INTERPRET_TARGET = "TPU v7"
_JAX_INTERPRET_TARGET = "TPU7x"  # (JAX's name for it)


@functools.cache
def _on_tpu() -> bool:
    from ..runtime import platform

    return platform.platform() == "tpu"


@functools.cache
def prepare_interpret() -> None:
    """Once per process off TPU: Pallas' TPU interpret mode becomes JAX's default (kernels built
    outside a traced op, such as Helion's ``pl.kernel``, read it when they are made; on this
    platform Pallas TPU kernels run no other way), the platform gets the interpreted chip's
    hardware facts (``pltpu.get_tpu_info()`` in a kernel), and the log says so."""
    from jax._src.pallas.mosaic import tpu_info
    from jax.experimental.pallas import tpu as pltpu

    from ..runtime import platform

    pltpu.set_tpu_interpret_mode()
    chip = tpu_info.chip_version_from_device_kind(_JAX_INTERPRET_TARGET)
    tpu_info.registry.setdefault(platform.platform(), lambda: tpu_info.get_tpu_info_for_chip(chip, 1))
    _log.warning(
        "torch_tpu: no TPU here (%s): Pallas kernels run in Pallas' TPU interpret mode, as a %s",
        platform.device_name(),
        INTERPRET_TARGET,
    )


def interpret_mode(interpret: bool | None = None) -> contextlib.AbstractContextManager:
    """The context Pallas kernels are traced in (``pl.pallas_call`` reads it when called; it is
    part of JAX's jit cache key). ``interpret`` None: none on a TPU (kernels compile through
    Mosaic), Pallas' TPU interpret mode elsewhere; True: TPU interpret mode on any platform
    (small test blocks a TPU would not compile); False: none (compiled, so a TPU only)."""
    if interpret is False or (interpret is None and _on_tpu()):
        return contextlib.nullcontext()
    if not _on_tpu():
        prepare_interpret()
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.force_tpu_interpret_mode()
