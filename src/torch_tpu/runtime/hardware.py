"""Which TPU this is, from the PCI bus (no runtime started: safe at import, in any process).

The chip Pallas kernels target, which also asks Pallas, is ``torch_tpu._internal.utils.hardware``'s.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path

_GOOGLE_VENDOR = "0x1ae0"
_PCI = Path("/sys/bus/pci/devices")
#: PCI device id -> chip name
_CHIPS = {
    "0x005e": "TPU v4",
    "0x0062": "TPU v5p",
    "0x0063": "TPU v5e",
    "0x006f": "TPU v6e",
    "0x0076": "TPU v7",
}
#: chip -> chips on the host -> topology string (the mesh of chips)
_TOPOLOGIES = {
    "TPU v4": {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"},
    "TPU v5p": {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"},
    "TPU v5e": {1: "1,1,1", 4: "2,2,1", 8: "2,2,2"},
    "TPU v6e": {1: "1,1,1", 4: "2,2,1", 8: "2,4,1"},
    "TPU v7": {2: "1,1,1,2", 4: "1,2,1,2", 8: "2,2,1,2"},
}


class TpuVersion(enum.Enum):
    V4 = "TPU v4"
    V5P = "TPU v5p"
    V5E = "TPU v5e"
    V6E = "TPU v6e"
    V7 = "TPU v7"
    UNKNOWN = "TPU"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def tpu_chips(usable_only: bool = False) -> list[str]:
    """The chip name of each Google TPU on the PCI bus (``usable_only``: those this process
    can open through VFIO)."""
    try:
        devices = sorted(_PCI.iterdir())
    except OSError:
        return []
    chips = []
    for device in devices:
        if _read(device / "vendor") != _GOOGLE_VENDOR:
            continue
        chip = _CHIPS.get(_read(device / "device") or "")
        if chip is None:
            continue
        if usable_only:
            try:
                (Path("/dev/vfio") / (device / "iommu_group").readlink().name).stat()
            except OSError:
                continue
        chips.append(chip)
    return chips


def get_tpu_device_count() -> int:
    """TPU chips on the PCI bus that this process can open."""
    return len(tpu_chips(usable_only=True))


def get_tpu_topology(world_size: int | None = None) -> str | None:
    """The chip mesh (``"2,2,1"``) of ``world_size`` chips (default: all usable ones) of the
    attached generation; None without a TPU."""
    chips = tpu_chips(usable_only=True)
    if not chips or chips[0] not in _TOPOLOGIES:
        return None
    count = len(chips) if world_size is None else world_size
    topology = _TOPOLOGIES[chips[0]].get(count)
    if topology is None:
        raise RuntimeError(f"No TPU topology found for count: {count}")
    return topology


def has_nvidia_gpu() -> bool:
    return any(os.path.exists(d) for d in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg"))
