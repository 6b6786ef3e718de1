"""The vLLM platform plugin declared from a source checkout, for tests and benchmarks.

vLLM finds platform plugins through installed distribution metadata (``importlib.metadata``
entry points of the group ``vllm.platform_plugins``). ``pip install -e .`` writes that from
pyproject.toml; a checkout run with ``PYTHONPATH=src`` has none, so :func:`declare` writes the same
one entry as a minimal dist-info directory and puts it on ``sys.path`` (and ``PYTHONPATH``, for
the processes vLLM starts).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

GROUP, NAME, HOOK = "vllm.platform_plugins", "tpu", "torch_tpu.integrations.vllm:register"


def declared() -> bool:
    return any(ep.value == HOOK for ep in importlib.metadata.entry_points(group=GROUP))


def declare(directory: str | os.PathLike) -> str | None:
    """Declare the entry point under ``directory`` unless installed metadata already does; returns
    the directory put on the path, or None."""
    if declared():
        return None
    root = os.fspath(directory)
    info = os.path.join(root, "torch_tpu_vllm_plugin-0.0.0.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: torch_tpu_vllm_plugin\nVersion: 0.0.0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write(f"[{GROUP}]\n{NAME} = {HOOK}\n")
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
    return root
