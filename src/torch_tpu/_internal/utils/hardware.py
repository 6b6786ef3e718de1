"""Which TPU this is (Helion's Pallas backend imports this module): the PCI bus is read in
:mod:`torch_tpu.runtime.hardware`; the chip Pallas kernels target is decided here."""

from __future__ import annotations

from ...runtime.hardware import TpuVersion, get_tpu_device_count, get_tpu_topology, has_nvidia_gpu, tpu_chips

__all__ = [
    "TpuVersion",
    "get_tpu_device_count",
    "get_tpu_device_name",
    "get_tpu_topology",
    "get_tpu_version",
    "has_nvidia_gpu",
    "tpu_chips",
]


def get_tpu_device_name() -> str:
    """The TPU generation Pallas kernels target, e.g. ``"TPU v7"``: the chip on the PCI bus;
    with none, the chip Pallas' TPU interpret mode models where torch_tpu runs on a stand-in
    platform (``torch_tpu.pallas``); ``"TPU"`` if neither is known."""
    chips = tpu_chips()
    if chips:
        return chips[0]
    from ...pallas._interpret import INTERPRET_TARGET, prepare_interpret
    from ...runtime import platform

    if platform.is_initialized() and platform.platform() != "tpu":
        prepare_interpret()  # (the kernels about to be built for it are interpreted)
        return INTERPRET_TARGET
    return TpuVersion.UNKNOWN.value


def get_tpu_version() -> TpuVersion:
    try:
        return TpuVersion(get_tpu_device_name())
    except ValueError:
        return TpuVersion.UNKNOWN
