"""Speculative decoding on tpu: vLLM's n-gram drafts, checked by its rejection sampler, whose four
Triton kernels run as tpu ops (``torch_tpu/integrations/vllm/rejection.py``).

The ops equal vLLM's own CPU kernels (its C++ replacements of the same Triton kernels) on
batches with every case the kernels branch on; and generation with n-gram drafts gives the tokens
of the model's greedy decoding (a model whose greedy tokens are known on CPU and soon repeat),
greedy and sampled through a filter that leaves only the likeliest token, while drafts are both
accepted and rejected."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[serve]', docs/serving.md)")

# 6 requests, up to 4 drafts each (none, a full set, a partial one...), a vocabulary of 37
DRAFTS, SPEC, VOCAB = [0, 4, 2, 3, 1, 4], 4, 37


def _batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    tokens = sum(DRAFTS)
    draft = torch.randint(0, VOCAB, (tokens,), generator=g, dtype=torch.int32)
    # the target agrees with the drafts most of the time, so some requests accept every draft
    argmax = torch.where(
        torch.rand(tokens, generator=g) < 0.7, draft.long(), torch.randint(0, VOCAB, (tokens,), generator=g)
    )
    target = torch.rand(tokens, VOCAB, generator=g).softmax(-1)
    uniform = torch.rand(tokens, generator=g, dtype=torch.float64) ** 3
    # Both branches in every batch: request 2 (greedy) accepts both its drafts and request 5
    # (greedy) rejects its second; request 1 (sampled) accepts its four (uniforms of 0), request
    # 3 (sampled) rejects its second (a uniform no probability ratio reaches).
    argmax[4:6], argmax[11] = draft[4:6], (draft[11] + 1) % VOCAB
    uniform[0:4], uniform[7] = 0.0, 1e30
    return {
        "cu": torch.tensor(DRAFTS, dtype=torch.int32).cumsum(0, dtype=torch.int32),
        "draft": draft,
        "argmax": argmax,
        "bonus": torch.randint(0, VOCAB, (len(DRAFTS), 1), generator=g),
        "greedy": torch.tensor([True, False, True, False, False, True]),
        "draft_probs": torch.rand(tokens, VOCAB, generator=g).softmax(-1),
        "target_probs": target,
        "uniform": uniform,  # (cubed: small enough to accept under some target/draft ratios)
        "recovered": torch.randint(0, VOCAB, (tokens,), generator=g, dtype=torch.int32),
        "inv_q": torch.empty(len(DRAFTS), VOCAB, dtype=torch.float64).exponential_(generator=g).reciprocal(),
    }


@pytest.fixture(scope="module")
def cpu():
    """vLLM's CPU replacements of the kernels (its C++ ops, which ``vllm._C`` registers)."""
    import vllm._C  # noqa: F401
    from vllm.utils import cpu_triton_utils

    return cpu_triton_utils


def _out() -> torch.Tensor:
    return torch.full((len(DRAFTS), SPEC + 1), -1, dtype=torch.int32)


def _accepts_and_rejects(out: torch.Tensor, rows: torch.Tensor) -> None:
    """The batch tests both branches: among ``rows`` with drafts, one accepted them all (its
    bonus token written after them) and one rejected a draft (nothing written after it)."""
    counts = torch.tensor(DRAFTS)
    written, drafted = (out != -1).sum(1), rows & (counts > 0)
    assert (written == counts + 1)[drafted].any() and (written <= counts)[drafted].any(), out


def _both(ours, reference, out: torch.Tensor, *args) -> tuple[torch.Tensor, torch.Tensor]:
    """``ours`` on tpu copies of the tensors, ``reference`` (vLLM's CPU kernel) on the tensors."""
    mine = out.to("tpu")
    ours(mine, *(a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args))
    ref = out.clone()
    reference(ref, *args)
    return mine.cpu(), ref


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("all_greedy", [True, False])
def test_greedy_rejection_equals_vllms_cpu_kernel(seed, all_greedy, cpu):
    from torch_tpu.integrations.vllm import rejection

    b = _batch(seed)
    greedy = None if all_greedy else b["greedy"]
    args = (b["cu"], b["draft"], b["argmax"], b["bonus"], greedy, SPEC, None, None, False)
    mine, ref = _both(
        rejection.rejection_greedy_sample, cpu._rejection_greedy_sample_kernel_impl, _out(), *args
    )
    assert torch.equal(mine, ref), (mine, ref)
    _accepts_and_rejects(ref, torch.ones(len(DRAFTS), dtype=torch.bool) if all_greedy else b["greedy"])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("no_draft_probs", [True, False])
def test_random_rejection_equals_vllms_cpu_kernel(seed, no_draft_probs, cpu):
    from torch_tpu.integrations.vllm import rejection

    b = _batch(seed)
    draft_probs = None if no_draft_probs else b["draft_probs"]
    args = (
        b["cu"], b["draft"], draft_probs, b["target_probs"], b["bonus"], b["recovered"], b["uniform"],
        b["greedy"], SPEC, VOCAB, None, no_draft_probs, False,
    )  # fmt: skip
    mine, ref = _both(
        rejection.rejection_random_sample, cpu._rejection_random_sample_kernel_impl, _out(), *args
    )
    assert torch.equal(mine, ref), (mine, ref)
    assert torch.equal(mine[b["greedy"]], _out()[b["greedy"]])  # (greedy requests untouched)
    _accepts_and_rejects(ref, ~b["greedy"])


def test_a_padded_draft_is_rejected():
    """Drafts of -1 (padding some proposers leave) are rejected whatever the probabilities, as
    vLLM's Triton kernel rejects them (its CPU kernel skips them instead)."""
    from torch_tpu.integrations.vllm import rejection

    b = _batch(0)
    padded, uniform = b["draft"].clone(), b["uniform"].clone()
    padded[7], uniform[6:9] = -1, 0.0  # (request 3: its first draft accepted, its second padded)
    cu, target, bonus, recovered, greedy = (
        b[k] for k in ("cu", "target_probs", "bonus", "recovered", "greedy")
    )
    args = [t.to("tpu") for t in (cu, padded, target, bonus, recovered, uniform, greedy)]
    out = _out().to("tpu")
    rejection.rejection_random_sample(out, *args[:2], None, *args[2:], SPEC, VOCAB, None, True, False)
    row = out[3].cpu().tolist()
    assert row == [int(padded[6]), int(b["recovered"][7]), -1, -1, -1], row


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("no_draft_probs", [True, False])
def test_recovered_tokens_equal_vllms_cpu_kernel(seed, no_draft_probs, cpu):
    from torch_tpu.integrations.vllm import rejection

    b = _batch(seed)
    draft_probs = None if no_draft_probs else b["draft_probs"]
    out = torch.full((sum(DRAFTS),), -1, dtype=torch.int32)
    args = (
        b["cu"],
        b["draft"],
        draft_probs,
        b["target_probs"],
        b["inv_q"],
        VOCAB,
        8192,
        no_draft_probs,
        True,
    )
    mine, ref = _both(rejection.sample_recovered_tokens, cpu._sample_recovered_tokens_kernel_impl, out, *args)
    assert torch.equal(mine, ref), (mine, ref)
    if no_draft_probs:
        assert not torch.equal(mine, b["draft"]) and (mine != b["draft"]).all()  # (never the draft itself)


def test_expand_equals_vllms_cpu_kernel(cpu):
    from torch_tpu.integrations.vllm import rejection

    b = _batch(0)
    values = torch.tensor([5, 0, 7, 0, 9, 11])
    out = torch.full((sum(DRAFTS),), -3, dtype=torch.int64)
    mine, ref = _both(rejection.expand, cpu._expand_kernel_impl, out, values, b["cu"], 0, 1, SPEC)
    assert torch.equal(mine, ref), (mine, ref)
    # float values (vLLM expands temperatures): each request's value at its tokens, 0 made 1
    temperatures = torch.tensor([0.5, 0.0, 2.0, 0.0, 0.7, 1.5])
    mine = torch.zeros(sum(DRAFTS), device="tpu")
    rejection.expand(mine, temperatures.to("tpu"), b["cu"].to("tpu"), 0, 1, SPEC)
    want = torch.where(temperatures == 0, 1.0, temperatures).repeat_interleave(torch.tensor(DRAFTS))
    assert torch.equal(mine.cpu(), want)


@pytest.fixture(scope="module")
def memoryless(model_path, tmp_path_factory) -> tuple[str, list[int]]:
    """The tiny Llama with every attention and MLP output projection zeroed, saved, and its map of
    tokens: each position's logits then depend on its own token alone, so greedy decoding
    iterates that map (read off Hugging Face on CPU, all tokens in one batch) and soon cycles,
    where an n-gram draft is the model's own continuation."""
    import shutil

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        tokens = torch.arange(model.config.vocab_size)[:, None]
        successor = model(tokens).logits[:, -1].argmax(-1).tolist()
    path = tmp_path_factory.mktemp("memoryless")
    model.save_pretrained(path)
    for name in os.listdir(model_path):
        if name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(model_path, name), path)
    return str(path), successor


def _orbit(successor: list[int], token: int, steps: int) -> list[int]:
    out = []
    for _ in range(steps):
        token = successor[token]
        out.append(token)
    return out


def _prompt(successor: list[int]) -> tuple[list[int], list[int]]:
    """A prompt ending in a token outside its orbit's cycle (the shortest way into a cycle), with
    a wrong continuation of that token's bigram earlier in the prompt; and the greedy tokens."""

    def entry(token: int) -> int:  # (steps before the orbit repeats a token)
        seen = [token]
        while (token := successor[token]) not in seen:
            seen.append(token)
        return len(seen)

    start = min(
        (t for t in range(len(successor)) if t not in _orbit(successor, t, len(successor))), key=entry
    )
    orbit = _orbit(successor, start, TOKENS)
    unused = [t for t in range(len(successor)) if t not in orbit and t != start]
    # [start, next, wrong, other, start]: the first decoding step's bigram [start, next] was
    # followed by ``wrong`` in the prompt, so the first draft is rejected
    return [start, orbit[0], unused[0], unused[1], start], orbit


TOKENS = 24
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


_SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

def drafts(llm):
    counters = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    return [counters.get(f"vllm:spec_decode_num_{k}_tokens", 0) for k in ("draft", "accepted")]

if __name__ == "__main__":
    model, prompt, runs, ngram = (json.loads(a) for a in sys.argv[1:])
    llm = LLM(model=model, dtype="float32", max_model_len=256, kv_cache_memory_bytes=16 << 20,
              seed=0, speculative_config=ngram, disable_log_stats=False)
    for params in runs:
        before = drafts(llm)
        out = llm.generate(TokensPrompt(prompt_token_ids=prompt), SamplingParams(**params))
        after = drafts(llm)
        tokens = list(out[0].outputs[0].token_ids)
        print("RUN", json.dumps([tokens, after[0] - before[0], after[1] - before[1]]), flush=True)
"""

RUNS = {"greedy": {"temperature": 0.0}, "top_k_1": {"temperature": 1.0, "top_k": 1, "seed": 5}}


def test_ngram_drafts_give_the_models_greedy_tokens(plugin_path, memoryless, tmp_path):
    """A plain script at vLLM's defaults (its engine core in a process of its own), greedy and
    sampled through a filter that leaves the likeliest token (vLLM's random rejection kernel,
    its recovered tokens): the model's greedy tokens, with drafts rejected and accepted. (A
    script: an engine in the test's process would, at its shutdown, take down vLLM's
    process-wide parallel state, which the session's in-process ``llm`` still uses.)"""
    import json
    import subprocess
    import sys

    prompt, greedy = _prompt(memoryless[1])
    runs = [{"max_tokens": TOKENS, "ignore_eos": True, **params} for params in RUNS.values()]
    script = tmp_path / "ngram.py"
    script.write_text(_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_ENABLE_V1_MULTIPROCESSING")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (plugin_path, *sys.path)))
    args = [json.dumps(a) for a in (memoryless[0], prompt, runs, NGRAM)]
    done = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=600
    )
    results = [json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("RUN ")]
    assert done.returncode == 0 and len(results) == len(RUNS), done.stderr[-5000:]
    for name, (tokens, proposed, accepted) in zip(RUNS, results):
        assert tokens == greedy, name
        assert 0 < accepted < proposed, (name, proposed, accepted)
