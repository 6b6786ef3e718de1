"""vLLM on tpu: the fixtures. The tests skip when vLLM is not installed (it lives in its own
environment: the ``serve`` extra, docs/serving.md)."""

from __future__ import annotations

import importlib.metadata
import os
import sys

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[serve]')")

_GROUP, _NAME, _HOOK = "vllm.platform_plugins", "tpu", "torch_tpu.integrations.vllm:register"


@pytest.fixture(scope="session")
def plugin_path(tmp_path_factory) -> str | None:
    """Where the plugin's entry point is declared when torch_tpu is not installed with it (a source
    checkout): a one-entry dist-info put on ``sys.path`` (and handed to subprocesses), which is
    what ``pip install -e .`` writes. None when the installed metadata already declares it."""
    if any(ep.value == _HOOK for ep in importlib.metadata.entry_points(group=_GROUP)):
        return None
    root = tmp_path_factory.mktemp("entry_point")
    info = root / "torch_tpu_vllm_plugin-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_tpu_vllm_plugin\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(f"[{_GROUP}]\n{_NAME} = {_HOOK}\n")
    sys.path.insert(0, str(root))
    return str(root)


@pytest.fixture(scope="session")
def model_path(tmp_path_factory) -> str:
    from torch_tpu.testing.tiny_llama import build

    return build(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def llm(plugin_path, model_path):
    """One engine for the module, in this process (vLLM's engine core and worker run inline)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import vllm

    engine = vllm.LLM(
        model=model_path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        kv_cache_memory_bytes=16 << 20,
        seed=0,
    )
    yield engine
    engine.llm_engine.engine_core.shutdown()
