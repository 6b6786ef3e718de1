"""vLLM on tpu: the fixtures (imported lazily: vLLM lives in its own environment, the ``serve``
extra of docs/serving.md, and the tests skip without it)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def plugin_path(tmp_path_factory) -> str | None:
    """The plugin's entry point, declared for a source checkout (None when installed), before any
    test imports vLLM: vLLM picks its platform once per process, at the first use of it."""
    from torch_tpu.testing import vllm_plugin

    return vllm_plugin.declare(tmp_path_factory.mktemp("entry_point"))


@pytest.fixture(scope="session", autouse=True)
def vllm_cache(tmp_path_factory):
    """vLLM's compile cache (the AOT-compiled model it saves after compiling) in this session's
    temporary directory, not ``~/.cache/vllm``: the session starts cold, and the server reads back
    what the in-process engine saved."""
    saved = os.environ.get("VLLM_CACHE_ROOT")
    os.environ["VLLM_CACHE_ROOT"] = str(tmp_path_factory.mktemp("vllm_cache"))
    yield os.environ["VLLM_CACHE_ROOT"]
    if saved is None:
        del os.environ["VLLM_CACHE_ROOT"]
    else:
        os.environ["VLLM_CACHE_ROOT"] = saved


@pytest.fixture(scope="session")
def model_path(tmp_path_factory) -> str:
    from torch_tpu.testing.tiny_llama import build

    return build(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def new_engine(plugin_path, model_path):
    """Starts a vLLM engine on the tiny model (or ``model``: another checkpoint; float32, a 16 MiB
    KV cache, seed 0), with the given options on top."""

    def start(model: str | None = None, **options):
        import vllm

        defaults = {"dtype": "float32", "max_model_len": 256, "kv_cache_memory_bytes": 16 << 20, "seed": 0}
        return vllm.LLM(model=model or model_path, **{**defaults, **options})

    return start


@pytest.fixture(scope="session")
def llm(new_engine):
    """One engine for the module, in this process (vLLM's engine core and worker run inline)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    engine = new_engine()
    yield engine
    engine.llm_engine.engine_core.shutdown()
