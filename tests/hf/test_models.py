"""The architecture matrix: each tiny model on tpu against the same weights on CPU, in float32.

Forward outputs, 16 greedy tokens from ``generate()`` (decoder, encoder-decoder and speech models)
and one training step (loss, every parameter's gradient, the loss after an AdamW step). The
table in ``docs/models.md`` is this comparison's output (``python -m torch_tpu.testing.hf_zoo``).
"""

from __future__ import annotations

import pytest

from torch_tpu.testing.hf_zoo import ARCHITECTURES, compare

#: The issue's bound: max abs difference at most 1e-4 of the output's scale.
TOLERANCE = 1e-4


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_matches_cpu(model_type):
    result = compare(model_type, generate_tokens=16)
    assert result.forward_rel <= TOLERANCE, result
    if ARCHITECTURES[model_type].generates:
        assert result.generate_equal, f"{model_type}: greedy ids differ from CPU"
    else:
        assert result.generate_equal is None
    assert result.loss_rel <= TOLERANCE, result
    assert result.grad_rel <= TOLERANCE, f"{model_type}: gradient of {result.worst_grad}: {result}"
    assert result.next_loss_rel <= TOLERANCE, result


def test_matrix_covers_the_required_architectures():
    required = {
        "llama",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "mistral",
        "mixtral",
        "gemma",
        "gemma2",
        "gemma3_text",
        "phi3",
        "gpt2",
        "gpt_neox",
        "bert",
        "roberta",
        "t5",
        "bart",
        "whisper",
        "clip",
        "vit",
        "deepseek_v3",
    }
    assert required <= set(ARCHITECTURES)
