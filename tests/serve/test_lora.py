"""Multi-LoRA serving on tpu (``enable_lora``): two adapters and the base model in one batch give
PEFT's greedy tokens on CPU (vLLM's CPU backend gives the base model's requests the last adapter's
tokens there); an adapter vLLM cannot load is vLLM's error."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[serve]', docs/serving.md)")
pytest.importorskip("peft", reason="PEFT makes the adapters (the ecosystem extra)")

PROMPTS = ["Once upon a time", "The little fox", "In the deep blue sea there was"]
MAX_TOKENS = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _adapter(model_path: str, directory, rank: int, seed: int) -> list[list[int]]:
    """Save a LoRA adapter of ``rank`` with random weights (PEFT starts B at zero: no effect) to
    ``directory``; returns PEFT's greedy tokens on CPU for :data:`PROMPTS`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    model.save_pretrained(str(directory))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokens = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = model.eval().generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)
        tokens.append(out[0, ids.shape[1] :].tolist())
    return tokens


@pytest.fixture(scope="module")
def lora_engine(new_engine):
    """An engine with LoRA on (two adapters at a time, rank up to 8), in this process."""
    import os

    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    engine = new_engine(enable_lora=True, max_lora_rank=8, max_loras=2)
    yield engine
    engine.llm_engine.engine_core.shutdown()
    if saved is None:
        del os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"]
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved


def test_two_adapters_and_the_base_model_in_one_batch_give_pefts_tokens(lora_engine, model_path, tmp_path):
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    from .test_vllm import hf_greedy

    expected = {name: _adapter(model_path, tmp_path / name, 8, seed) for name, seed in (("a", 1), ("b", 2))}
    requests = [LoRARequest("a", 1, str(tmp_path / "a")), LoRARequest("b", 2, str(tmp_path / "b")), None]
    outputs = lora_engine.generate(
        PROMPTS * 3,
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
        lora_request=[request for request in requests for _ in PROMPTS],
    )
    got = [list(output.outputs[0].token_ids) for output in outputs]
    assert got[:3] == expected["a"]
    assert got[3:6] == expected["b"]
    assert got[6:] == [hf_greedy(model_path, prompt, MAX_TOKENS) for prompt in PROMPTS]


def test_an_adapter_above_max_lora_rank_is_vllms_error(lora_engine, model_path, tmp_path):
    # (the module's last test: vLLM 0.32 leaves the refused request in its in-process engine, on
    # CPU as on tpu, and the next generate() waits for it forever; with V1 multiprocessing the
    # engine core dies of the same ValueError)
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    _adapter(model_path, tmp_path / "wide", 16, 3)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    with pytest.raises(ValueError, match="LoRA rank 16 is greater than max_lora_rank 8"):
        lora_engine.generate(PROMPTS[:1], greedy, lora_request=LoRARequest("wide", 3, str(tmp_path / "wide")))
