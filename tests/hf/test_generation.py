"""``generate()`` on tpu: a static, bucketed KV cache and fused decoding unless the caller chose."""

from __future__ import annotations

import copy

import pytest
import torch

import torch_tpu
from torch_tpu import config
from torch_tpu.integrations.generation import cache_length
from torch_tpu.runtime.transfer import HOST_FILLS
from torch_tpu.testing import hf_zoo


@pytest.fixture(scope="module")
def models():
    cpu = hf_zoo.build("llama", seed=3)
    return cpu, copy.deepcopy(cpu).to("tpu")


def _prompt(length: int = 7) -> torch.Tensor:
    return torch.randint(3, 128, (1, length), generator=torch.Generator().manual_seed(length))


def _generate(model, prompt, new_tokens: int, **options):
    device = next(model.parameters()).device
    ids = prompt.to(device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        **options,
    )
    return out.sequences.cpu() if hasattr(out, "sequences") else out.cpu()


@pytest.mark.parametrize("new_tokens", [5, 20])
def test_greedy_tokens_equal_cpu_and_the_model_config_is_untouched(models, new_tokens):
    cpu, tpu = models
    prompt = _prompt()
    assert torch.equal(_generate(tpu, prompt, new_tokens), _generate(cpu, prompt, new_tokens))
    assert tpu.generation_config.cache_implementation is None  # only the call's copy changed
    assert torch_tpu.get_eager_mode() == "strict"  # fused for the call only


def test_the_cache_is_static_and_bucketed(models):
    _, tpu = models
    ids = _prompt().to("tpu")
    out = tpu.generate(ids, max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
    assert type(out.past_key_values).__name__ == "StaticCache"
    assert out.past_key_values.layers[0].max_cache_len == cache_length(10) == 64


def _graphs_and_executables() -> tuple[int, int]:
    stats = torch.tpu.compilation_cache_stats()
    return stats["misses"], stats["xla_compiles"] + stats["disk_hits"]


def test_a_later_length_in_the_same_bucket_compiles_nothing(models):
    """No new fused graph, and no program of any kind (reading the sequence out of its bucket
    included)."""
    cpu, tpu = models
    prompt = _prompt()
    for _ in range(HOST_FILLS + 1):  # (a fill recurring with every call compiles once it recurs)
        _generate(tpu, prompt, 12)
    before = _graphs_and_executables()
    for new_tokens in (9, 4):
        assert torch.equal(_generate(tpu, prompt, new_tokens), _generate(cpu, prompt, new_tokens))
    assert _graphs_and_executables() == before


def test_what_the_caller_chose_is_kept(models, monkeypatch):
    cpu, tpu = models
    prompt = _prompt(5)
    expected = _generate(cpu, prompt, 6)
    dynamic = tpu.generate(
        prompt.to("tpu"),
        max_new_tokens=6,
        do_sample=False,
        cache_implementation="dynamic",
        return_dict_in_generate=True,
    )
    assert type(dynamic.past_key_values).__name__ == "DynamicCache"
    assert torch.equal(dynamic.sequences.cpu(), expected)
    monkeypatch.setattr(config, "static_generation", False)
    out = tpu.generate(prompt.to("tpu"), max_new_tokens=6, do_sample=False, return_dict_in_generate=True)
    assert type(out.past_key_values).__name__ == "DynamicCache"


@pytest.mark.parametrize(
    ("needed", "max_positions", "length"),
    [(1, None, 64), (64, None, 64), (65, None, 128), (47, 2048, 64), (100, 128, 128), (200, 128, 256)],
)
def test_cache_length_buckets(needed, max_positions, length):
    assert cache_length(needed, max_positions) == length
