"""vLLM's sampler on tpu: every sampling parameter runs on the device, inside the decoding step's
tensors, and each does what vLLM defines (checked through settings whose answer is known: a
filter narrow enough to leave only the most likely token samples the greedy tokens)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[serve]', docs/serving.md)")

PROMPT = "Once upon a time"
TOKENS = 8


def _tokens(llm, **params) -> list[int]:
    from vllm import SamplingParams

    output = llm.generate(PROMPT, SamplingParams(max_tokens=TOKENS, ignore_eos=True, **params))
    return list(output[0].outputs[0].token_ids)


@pytest.fixture(scope="module")
def greedy(llm) -> list[int]:
    return _tokens(llm, temperature=0.0)


@pytest.mark.parametrize(
    "narrowest",
    [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}],
    ids=["top_k", "top_p", "min_p"],
)
def test_a_filter_leaving_only_the_likeliest_token_samples_the_greedy_tokens(llm, greedy, narrowest):
    assert _tokens(llm, temperature=1.0, seed=3, **narrowest) == greedy


def test_a_seed_repeats_its_tokens_and_other_seeds_sample_others(llm):
    first = _tokens(llm, temperature=2.0, seed=11)
    assert _tokens(llm, temperature=2.0, seed=11) == first
    others = [_tokens(llm, temperature=2.0, seed=s) for s in (12, 13)]
    assert any(o != first for o in others)


def test_top_k_samples_among_the_k_likeliest_tokens(llm):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=TOKENS, ignore_eos=True, temperature=1.5, top_k=2, logprobs=2, seed=5)
    sample = llm.generate(PROMPT, params)[0].outputs[0]
    for token, ranked in zip(sample.token_ids, sample.logprobs):
        likeliest = {t for t, lp in ranked.items() if lp.rank <= 2}
        assert token in likeliest


def test_a_strong_repetition_penalty_repeats_no_token(llm):
    from vllm import SamplingParams

    prompt_ids = llm.get_tokenizer()(PROMPT).input_ids
    params = SamplingParams(max_tokens=TOKENS, ignore_eos=True, temperature=0.0, repetition_penalty=1e4)
    tokens = list(llm.generate(PROMPT, params)[0].outputs[0].token_ids)
    # (a seen token's logit is divided by the penalty if positive, multiplied if negative)
    assert len(set(tokens)) == len(tokens)
    assert not set(tokens) & set(prompt_ids)


def _penalized_greedy(model_path: str, prompt_ids: list[int], presence: float, frequency: float) -> list[int]:
    """Greedy decoding on CPU with OpenAI's penalties over the generated tokens (vLLM's
    definition): a token's logit less ``presence`` once it appeared, less ``frequency`` per
    appearance."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    ids, out = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1]
            counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=logits.numel())
            logits = logits - presence * (counts > 0) - frequency * counts
            out.append(int(logits.argmax()))
            ids.append(out[-1])
    return out


def test_presence_and_frequency_penalties_are_openais(llm, model_path):
    prompt_ids = llm.get_tokenizer()(PROMPT).input_ids
    got = _tokens(llm, temperature=0.0, presence_penalty=1.5, frequency_penalty=0.5)
    assert got == _penalized_greedy(model_path, prompt_ids, 1.5, 0.5)


def test_logprobs_are_the_models_log_softmax(llm, model_path, greedy):
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=TOKENS, ignore_eos=True, temperature=0.0, logprobs=1)
    sample = llm.generate(PROMPT, params)[0].outputs[0]
    assert list(sample.token_ids) == greedy
    got = torch.tensor([ranked[t].logprob for t, ranked in zip(sample.token_ids, sample.logprobs)])

    prompt_ids = llm.get_tokenizer()(PROMPT).input_ids
    ids = torch.tensor([prompt_ids + greedy[:-1]])
    rows = torch.arange(len(prompt_ids) - 1, ids.shape[1])

    def log_softmax(dtype: torch.dtype) -> torch.Tensor:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        with torch.no_grad():
            return torch.log_softmax(model(ids).logits[0, rows].double(), -1)

    exact, cpu32 = log_softmax(torch.float64), log_softmax(torch.float32)
    expected = exact[torch.arange(TOKENS), torch.tensor(greedy)]
    # float32's own error on CPU, with a margin for another summation order
    reference_error = float((cpu32 - exact).abs().max())
    torch.testing.assert_close(got.double(), expected, atol=10 * reference_error + 1e-6, rtol=0)
