"""Fine-tune a Hugging Face causal LM on the tpu device with ``transformers.Trainer``.

A tiny random Llama (or Qwen2, Qwen3: any causal LM of the test zoo, ``--model qwen3``) learns the
short tales shipped in ``torch_tpu/demo/data`` (tokenized with the MiniLM WordPiece tokenizer)
for a few steps: built from a config, nothing downloaded. ``--model`` also takes a checkpoint, a
hub id or a folder, trained with its own tokenizer. Nothing tpu-specific is configured: with
torch_tpu imported, ``TrainingArguments`` picks ``tpu:0`` by itself. Run it with::

    python examples/hf_finetune.py
    python examples/hf_finetune.py --model qwen2 --steps 50 --bf16
    python examples/hf_finetune.py --model Qwen/Qwen2.5-0.5B --steps 200 --batch-size 8 \
        --block-size 512 --lr 2e-5 --bf16

(the last downloads Qwen2.5-0.5B, 494M parameters, and trains it in float32 with bfloat16
autocast: about 8 GB of device memory for the weights, gradients and AdamW's state.)

It prints the loss of every step and ``loss first -> last``; the exit status is non-zero when the
loss did not fall.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence

import torch
import transformers
from _common import corpus_text, loss_fell, minilm_tokenizer, parse_training_args, tiny_causal_lm

from torch_tpu.testing import hf_zoo

#: The test zoo's causal LMs, built tiny from their configs.
TINY = [name for name, architecture in hf_zoo.ARCHITECTURES.items() if architecture.task == "causal-lm"]


class TokenBlocks(torch.utils.data.Dataset):
    """Consecutive ``block_size``-token windows of a text, each its own causal-LM target."""

    def __init__(self, tokenizer: transformers.PreTrainedTokenizerBase, text: str, block_size: int) -> None:
        # verbose=False: the text is one long stream, longer than the model's limit by design;
        # it is cut into blocks below.
        ids = torch.tensor(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
        self.blocks = ids[: len(ids) // block_size * block_size].view(-1, block_size)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        block = self.blocks[index]
        return {"input_ids": block, "labels": block}


class PrintLoss(transformers.TrainerCallback):
    """Prints each logged training loss and keeps them for the summary."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])
            print(f"step {state.global_step:3d}  loss {logs['loss']:.4f}", flush=True)


def model_and_tokenizer(
    name: str,
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """The tiny zoo model ``name`` with MiniLM's tokenizer, or the checkpoint ``name`` (a hub id or
    a folder) with its own, its weights in float32 (``--bf16`` autocasts)."""
    if name in TINY:
        tokenizer = minilm_tokenizer()
        return tiny_causal_lm(tokenizer, name), tokenizer
    model = transformers.AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
    return model, transformers.AutoTokenizer.from_pretrained(name)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default="llama",
        help=f"a tiny test-zoo model ({', '.join(TINY[:3])}, ...) or a checkpoint such as "
        "Qwen/Qwen2.5-0.5B (llama)",
    )
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps (20)")
    parser.add_argument("--lr", type=float, default=5e-3, help="peak learning rate (5e-3)")
    parser.add_argument("--batch-size", type=int, default=8, help="blocks per step (8)")
    parser.add_argument("--block-size", type=int, default=32, help="tokens per block (32)")
    parser.add_argument(
        "--bf16", action="store_true", help="bfloat16 mixed precision (TrainingArguments(bf16=True))"
    )
    return parse_training_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    model, tokenizer = model_and_tokenizer(args.model)
    dataset = TokenBlocks(tokenizer, corpus_text(), args.block_size)
    progress = PrintLoss()
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = transformers.TrainingArguments(
            output_dir=output_dir,
            max_steps=args.steps,
            learning_rate=args.lr,
            per_device_train_batch_size=args.batch_size,
            warmup_steps=args.steps // 10,
            logging_steps=1,
            bf16=args.bf16,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=0,
        )
        trainer = transformers.Trainer(
            model=model, args=training_args, train_dataset=dataset, callbacks=[progress]
        )
        trainer.remove_callback(transformers.PrinterCallback)  # PrintLoss says it shorter
        print(
            f"training {type(model).__name__}: {model.num_parameters():,} parameters on "
            f"{training_args.device} ({len(dataset)} blocks of {args.block_size} tokens, "
            f"Accelerate mixed precision: {trainer.accelerator.mixed_precision})"
        )
        trainer.train()
    return loss_fell(progress.losses)


if __name__ == "__main__":
    sys.exit(main())
