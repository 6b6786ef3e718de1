"""A tiny Llama saved as a local Hugging Face checkpoint, for serving tests and benchmarks.

Nothing is downloaded: the weights are random from a fixed seed, the tokenizer is a byte-level BPE
trained with ``tokenizers`` on the demo corpus shipped in the package, and both are written with
``save_pretrained``. The sizes keep a 2-core CI box fast while exercising grouped-query attention
and several layers; ``head_dim`` is 32 so vLLM's own CPU attention kernels accept the model too.

Example::

    >>> from torch_tpu.testing.tiny_llama import build
    >>> path = build("/tmp/tiny-llama")  # config.json, model.safetensors, tokenizer.json ...
"""

from __future__ import annotations

import json
import os
from importlib import resources

#: The context length: vLLM rejects longer prompts with its own error.
MAX_POSITIONS = 256
_VOCAB = 512


def _corpus() -> str:
    return resources.files("torch_tpu.demo").joinpath("data/tiny_tales.txt").read_text()


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus().splitlines(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )


def build(path: str | os.PathLike, seed: int = 0) -> str:
    """Write the checkpoint to ``path`` (once: an existing one is reused) and return the path."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = os.fspath(path)
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    tokenizer = _tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_POSITIONS,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # Random weights at the usual 0.02 scale give nearly flat logits; a larger scale makes greedy
    # decoding's argmax well separated, so tpu and CPU agree on every token for the right reason.
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.2)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}, f)
    return path
