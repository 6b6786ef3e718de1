"""Sentence embeddings with a real pretrained model (all-MiniLM-L6-v2) on the tpu device.

The sentence-transformers recipe by hand with plain ``transformers``: encode, average the token
embeddings under the attention mask, L2-normalize. The same runs on CPU; every sentence's tpu
embedding must have cosine similarity >= 0.9999 with its CPU one (else the exit status is
non-zero). Then, when the ``sentence_transformers`` package is installed, the same model through
``SentenceTransformer(path, device="tpu")``. Run it with::

    python examples/sentence_embeddings.py
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch
import transformers
from _common import minilm_dir, minilm_tokenizer, report

SENTENCES = [
    "Once upon a time, there was a little turtle named Moss.",
    "A small tortoise lived near the river long ago.",
    "Slow and steady wins the race.",
    "The stock market fell sharply on Monday.",
    "Shares dropped at the start of the week.",
]
#: Minimum cosine similarity between a sentence's tpu and CPU embeddings.
MIN_AGREEMENT = 0.9999


def embed(model: transformers.PreTrainedModel, batch: transformers.BatchEncoding) -> torch.Tensor:
    """Unit-length sentence embeddings (mean of the unpadded token embeddings), on CPU."""
    batch = batch.to(model.device)
    with torch.no_grad():
        tokens = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)
    mean = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1e-9)
    return torch.nn.functional.normalize(mean, dim=-1).cpu()


def print_similarities(embeddings: torch.Tensor) -> None:
    similarity = embeddings @ embeddings.T
    print("      " + " ".join(f"{j:6d}" for j in range(len(similarity))))
    for i, row in enumerate(similarity):
        print(f"{i:4d}  " + " ".join(f"{value:6.3f}" for value in row.tolist()))


def sentence_transformers_embeddings(path: str) -> torch.Tensor | None:
    """The same embeddings through ``sentence_transformers`` on tpu; None if not installed."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    model = SentenceTransformer(path, device="tpu")
    print(f"SentenceTransformer on {model.device}: {[type(m).__name__ for m in model]}")
    return model.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=True).cpu()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--skip-sentence-transformers", action="store_true", help="only the plain transformers part"
    )
    args = parser.parse_args(argv)
    path = minilm_dir()
    tokenizer = minilm_tokenizer()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    tpu_model = transformers.AutoModel.from_pretrained(path).to("tpu").eval()
    cpu_model = transformers.AutoModel.from_pretrained(path).eval()

    tpu_embeddings = embed(tpu_model, batch)
    for i, sentence in enumerate(SENTENCES):
        print(f"{i:4d}  {sentence}")
    print(f"cosine similarities on {tpu_model.device}:")
    print_similarities(tpu_embeddings)

    agreement = (tpu_embeddings * embed(cpu_model, batch)).sum(dim=-1)
    print("cosine(tpu, cpu) per sentence: " + " ".join(f"{v:.6f}" for v in agreement.tolist()))
    status = report(
        bool((agreement >= MIN_AGREEMENT).all()),
        f"min cosine(tpu, cpu) = {agreement.min():.6f} (need >= {MIN_AGREEMENT})",
    )

    if not args.skip_sentence_transformers:
        library = sentence_transformers_embeddings(path)
        if library is None:
            print("sentence_transformers is not installed; skipped")
        else:
            agreement = (library * tpu_embeddings).sum(dim=-1)
            status |= report(
                bool((agreement >= MIN_AGREEMENT).all()),
                f"SentenceTransformer(device='tpu') vs the recipe above: min cosine {agreement.min():.6f}",
            )
    return status


if __name__ == "__main__":
    sys.exit(main())
