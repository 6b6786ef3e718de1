"""Fine-tune a causal LM with a LoRA adapter on the tpu device: TRL's ``SFTTrainer`` with PEFT.

A tiny Llama (random weights, a byte-level tokenizer trained on the shipped tales: nothing
downloaded) learns the tales shipped in ``torch_tpu/demo/data``, one sample per line, through a
rank-8 LoRA adapter on its attention projections; only the adapter trains. Nothing
tpu-specific is configured: TRL's Trainer picks ``tpu:0`` by itself. Then the adapter is merged
into the model, which continues a prompt. Run it with::

    python examples/lora_sft.py
    python examples/lora_sft.py --steps 100 --bf16

It prints the loss of every step and the first and last quarters' mean loss; the exit status is non-zero
when the loss did not fall.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence

import peft
import torch
import transformers
import trl
from _common import corpus_text, loss_fell, parse_training_args
from datasets import Dataset
from transformers import AutoTokenizer

from torch_tpu.testing import tiny_llama


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps (30)")
    parser.add_argument("--lr", type=float, default=2e-2, help="learning rate (2e-2)")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per step (8)")
    parser.add_argument("--max-length", type=int, default=64, help="tokens per sample (64)")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision")
    return parse_training_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    lines = [line for line in corpus_text().splitlines() if line.strip()]
    with tempfile.TemporaryDirectory() as folder:
        model_path = tiny_llama.build(f"{folder}/model")
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = trl.SFTConfig(
            output_dir=f"{folder}/out",
            max_steps=args.steps,
            learning_rate=args.lr,
            per_device_train_batch_size=args.batch_size,
            max_length=args.max_length,
            logging_steps=1,
            bf16=args.bf16,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=0,
        )
        adapter = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        trainer = trl.SFTTrainer(
            model=model_path,
            args=config,
            train_dataset=Dataset.from_dict({"text": lines}),
            processing_class=tokenizer,
            peft_config=adapter,
        )
        trainer.remove_callback(transformers.PrinterCallback)  # (the losses are printed below)
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        print(f"training {trainable:,} adapter parameters on {config.device} ({len(lines)} samples)")
        trainer.train()
        losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
        for step, loss in enumerate(losses, 1):
            print(f"step {step:3d}  loss {loss:.4f}")
        merged = trainer.model.merge_and_unload().eval()
        prompt = tokenizer("Once upon a time", return_tensors="pt").input_ids.to(config.device)
        with torch.no_grad():
            out = merged.generate(prompt, max_new_tokens=16, do_sample=False)
        print(f"merged model on {merged.device}: {tokenizer.decode(out[0], skip_special_tokens=True)!r}")
    return loss_fell(losses, max(len(losses) // 4, 1))  # (batches differ: first and last quarters)


if __name__ == "__main__":
    sys.exit(main())
