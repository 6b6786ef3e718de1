"""Greedy text generation with a Hugging Face model loaded straight onto the tpu device.

A tiny random Llama is saved as a checkpoint next to the MiniLM tokenizer, loaded back with
``from_pretrained(directory, device_map="tpu")`` and asked to continue a few prompts with greedy
``generate()``. The same generation on CPU must give the same token ids (checked in float32, where
the exit status is non-zero if they differ; in bfloat16 rounding may legitimately flip a tie)::

    python examples/hf_generate.py
    python examples/hf_generate.py --new-tokens 32 --dtype bfloat16

The weights are random, so the text is gibberish; what matters is that it is the same gibberish.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence

import torch
import transformers
from _common import minilm_tokenizer, report, tiny_causal_lm

PROMPTS = ["Once upon a time, there was a little turtle", "The lesson:"]


def generate(
    model: transformers.PreTrainedModel, batch: transformers.BatchEncoding, new_tokens: int
) -> torch.Tensor:
    """Exactly ``new_tokens`` greedy tokens after each prompt, returned on CPU."""
    output = model.generate(
        **batch.to(model.device),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        num_beams=1,
    )
    return output.cpu()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens to generate (16)")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="dtype the checkpoint is loaded in (float32)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    dtype = getattr(torch, args.dtype)
    tokenizer = minilm_tokenizer()
    tokenizer.padding_side = "left"  # a decoder continues from the prompt's last token
    # The tokenizer is a BERT one: no [CLS]/[SEP] around a prompt the model should continue, and
    # no segment ids, which Llama does not take.
    batch = tokenizer(
        PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False, return_token_type_ids=False
    )

    with tempfile.TemporaryDirectory() as checkpoint:
        tiny_causal_lm(tokenizer).save_pretrained(checkpoint)
        model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, device_map="tpu", dtype=dtype)
        cpu_model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype)
    print(
        f"loaded {type(model).__name__} ({model.num_parameters():,} parameters, {model.dtype}) "
        f"on {model.device}"
    )

    ids = generate(model, batch, args.new_tokens)
    prompt_length = batch["input_ids"].shape[1]
    for prompt, row in zip(PROMPTS, ids):
        continuation = tokenizer.decode(row[prompt_length:], skip_special_tokens=True)
        print(f"{prompt!r} -> {continuation!r}")

    identical = torch.equal(ids, generate(cpu_model, batch, args.new_tokens))
    if dtype != torch.float32:
        print(f"ids identical to CPU: {identical} (not enforced in {args.dtype})")
        return 0
    return report(identical, f"ids identical to CPU: {identical}")


if __name__ == "__main__":
    sys.exit(main())
