"""Environment switches, read once at import (names shared with upstream TorchTPU)."""
from __future__ import annotations

import os


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


#: ``TPU_LAUNCH_BLOCKING=1``: debug eager, block after every op so errors surface where they happen.
launch_blocking: bool = _flag("TPU_LAUNCH_BLOCKING")
#: ``TORCH_TPU_CPU_FALLBACK=1``: run ops with no tpu lowering on CPU (slow, counted, reported).
cpu_fallback: bool = _flag("TORCH_TPU_CPU_FALLBACK")
#: ``TORCH_TPU_PLATFORM=cpu|gpu|tpu``: force the XLA platform instead of the best available one.
platform: str | None = os.environ.get("TORCH_TPU_PLATFORM") or None
