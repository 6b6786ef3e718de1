"""Quantized serving on tpu: vLLM serves torchao checkpoints (int8 and float8 weight-only,
written by Hugging Face's ``TorchAoConfig``) with greedy tokens equal to Hugging Face's on CPU
from the same checkpoint; quantization methods tpu lacks are vLLM's own error."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from .test_vllm import MAX_TOKENS, PROMPTS, hf_greedy

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[serve]', docs/serving.md)")
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchao") is None, reason="torchao is not installed (pip install -e '.[quant]')"
)


@pytest.fixture(scope="module", autouse=True)
def inductor_options_as_before_torchao():
    """torchao's import turns on Inductor options (``coordinate_descent_tuning``,
    ``force_fuse_int_mm_with_mul``) that vLLM hashes into its compile cache key: imported here,
    not at collection, and undone after this module, so the other tests' engines key their
    compiled model as a fresh ``vllm serve`` does."""
    from torch._inductor import config

    saved = config.save_config()
    import torchao  # noqa: F401

    yield
    config.load_config(saved)


def _quantized(model_path: str, folder, config) -> str:
    """The tiny model quantized by ``config`` (torchao) as Hugging Face saves it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, TorchAoConfig

    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, quantization_config=TorchAoConfig(config)
    )
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("scheme", ["int8", "float8"])
def test_torchao_weight_only_checkpoint_serves_hugging_faces_tokens(new_engine, model_path, tmp_path, scheme):
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig
    from vllm import SamplingParams

    config = {"int8": Int8WeightOnlyConfig, "float8": Float8WeightOnlyConfig}[scheme]()
    checkpoint = _quantized(model_path, tmp_path / scheme, config)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    engine = new_engine(model=checkpoint, quantization="torchao")
    try:
        runner = engine.llm_engine.model_executor.driver_worker.worker.model_runner
        weight = runner.get_model().model.layers[0].mlp.gate_up_proj.weight
        assert weight.device.type == "tpu" and weight.qdata.dtype in (torch.int8, torch.float8_e4m3fn)
        outputs = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    finally:
        engine.llm_engine.engine_core.shutdown()
    for prompt, output in zip(PROMPTS, outputs):
        assert list(output.outputs[0].token_ids) == hf_greedy(checkpoint, prompt, MAX_TOKENS), prompt


def test_a_quantization_tpu_lacks_is_vllms_error(new_engine):
    with pytest.raises(ValueError, match="fp8 quantization is currently not supported in tpu"):
        new_engine(quantization="fp8", dtype="bfloat16")
