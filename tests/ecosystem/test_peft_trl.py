"""PEFT 0.21.2 and TRL 1.16.0 on tpu, unmodified: LoRA training, merging and generation of a tiny
Llama, and TRL's ``SFTTrainer`` with a LoRA adapter in float32 and bfloat16 (its device picked
by accelerate: tpu, nothing set). Each against the same run on CPU, tolerances from a float64
CPU run (``testing.reference``)."""

from __future__ import annotations

import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu.testing import hf_zoo, tiny_llama
from torch_tpu.testing.reference import assert_matches_cpu

peft = pytest.importorskip("peft")


def _lora_model(dtype=torch.float32):
    model = hf_zoo.build("llama").to(dtype)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return peft.get_peft_model(model, config)


PROMPT = torch.tensor([[1, 5, 9, 17, 33, 65, 3, 100]])


def _lora_run(device: str, dtype=torch.float32):
    """Three AdamW steps of the adapter (the base frozen), then the merged model's logits and
    greedy tokens."""
    model = _lora_model(dtype).to(device)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = torch.randint(3, 128, (4, 12), generator=torch.Generator().manual_seed(1)).to(device)
    losses = []
    for _ in range(3):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach().cpu())
    merged = model.merge_and_unload().eval()
    with torch.no_grad():
        logits = merged(PROMPT.to(device)).logits.cpu()
        tokens = merged.generate(PROMPT.to(device), max_new_tokens=6, do_sample=False).cpu()
    return torch.stack(losses), logits, tokens


def test_lora_trains_merges_and_generates_as_on_cpu():
    (tpu_losses, tpu_logits, tpu_tokens), (cpu_losses, cpu_logits, cpu_tokens) = (
        _lora_run("tpu"),
        _lora_run("cpu"),
    )
    reference_losses, reference_logits, _ = _lora_run("cpu", torch.float64)
    assert_matches_cpu(tpu_losses, cpu_losses, reference_losses, "losses")
    assert_matches_cpu(tpu_logits, cpu_logits, reference_logits, "merged logits")
    assert torch.equal(tpu_tokens, cpu_tokens)
    assert not torch.equal(cpu_losses[0], cpu_losses[-1])  # (the adapter trained)


TEXTS = [
    "Once upon a time there was a little cat who liked the sea.",
    "The old fisherman went out in his boat every morning.",
    "A small bird sang on the branch of a tall tree.",
    "In the village the children played until the sun went down.",
]


def _sft_run(model_path: str, folder, use_cpu: bool, bf16: bool, dtype=torch.float32):
    """Three steps of ``SFTTrainer`` with a LoRA adapter: its logged losses (rounded to 4 places
    by the Trainer) and the trained adapter's weights."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    args = trl.SFTConfig(
        output_dir=str(folder),
        max_steps=3,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=use_cpu,
        bf16=bf16,
        max_length=32,
        seed=0,
        dataloader_drop_last=True,
    )
    trainer = trl.SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"text": TEXTS}),
        processing_class=AutoTokenizer.from_pretrained(model_path),
        peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    assert trainer.args.device.type == ("cpu" if use_cpu else "tpu")
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    adapter = {name: p.detach().cpu() for name, p in trainer.model.named_parameters() if p.requires_grad}
    return torch.tensor(losses, dtype=torch.float64), adapter


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bfloat16"])
def test_sft_trainer_with_lora_as_on_cpu(tmp_path, bf16):
    model_path = tiny_llama.build(tmp_path / "model")
    tpu, tpu_adapter = _sft_run(model_path, tmp_path / "tpu", use_cpu=False, bf16=bf16)
    cpu, cpu_adapter = _sft_run(model_path, tmp_path / "cpu", use_cpu=True, bf16=bf16)
    _, reference = _sft_run(model_path, tmp_path / "f64", use_cpu=True, bf16=False, dtype=torch.float64)
    assert len(tpu) == len(cpu) == 3
    # (the logged losses are rounded to 4 places: a rounding boundary may fall between them)
    torch.testing.assert_close(tpu, cpu, rtol=0, atol=1.01e-4 if not bf16 else 2e-2)
    assert len(cpu_adapter) == 8 and tpu_adapter.keys() == cpu_adapter.keys()  # (2 layers x q, v x A, B)
    unit = {"atol": 1e-5, "rtol": 1.6e-2} if bf16 else {}  # (bfloat16's plain tolerance)
    for name, weight in tpu_adapter.items():
        assert_matches_cpu(weight, cpu_adapter[name], reference[name], name, **unit)
