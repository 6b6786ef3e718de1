"""The scripts in examples/ run end to end at their smallest settings and pass their own checks
(each exits non-zero when its tpu-vs-CPU or learning check fails)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

SMALL_TRAINING = ["--steps", "3", "--batch-size", "2", "--block-size", "16"]
#: name -> (script and arguments, lines its output must contain)
CASES = {
    "generate": (["hf_generate.py", "--new-tokens", "4"], ["on tpu:0", "ids identical to CPU: True [ok]"]),
    # The float32 path is the Trainer test's; this also covers Accelerate's bf16 autocast.
    "finetune bf16": (
        ["hf_finetune.py", *SMALL_TRAINING, "--bf16"],
        ["parameters on tpu:0", "Accelerate mixed precision: bf16", "step   3  loss", "[ok]"],
    ),
    # A tiny Qwen2 (Qwen2.5's architecture) through the same Trainer script.
    "finetune qwen": (
        ["hf_finetune.py", "--model", "qwen2", *SMALL_TRAINING],
        ["training Qwen2ForCausalLM:", "parameters on tpu:0", "step   3  loss", "[ok]"],
    ),
    "sentence embeddings": (
        ["sentence_embeddings.py"],
        ["cosine similarities on tpu:0", "min cosine(tpu, cpu)", "[ok]"],
    ),
    "diffusion": (
        ["diffusion.py", "--steps", "6", "--size", "8", "--batch-size", "4", "--sampling-steps", "3"],
        ["parameters on tpu", "images on tpu", "samples equal to CPU's", "[ok]"],
    ),
    "lora sft": (
        ["lora_sft.py", "--steps", "8", "--batch-size", "4", "--max-length", "32"],
        ["adapter parameters on tpu:0", "merged model on tpu:0", "[ok]"],
    ),
    "image classifier resnet": (
        ["image_classifier.py", "--model", "resnet", "--steps", "10", "--batch-size", "8"],
        ["training transformers resnet:", "parameters on tpu", "first step's loss on tpu equal to CPU's"],
    ),
    "image classifier vit": (
        ["image_classifier.py", "--model", "vit", "--steps", "10", "--batch-size", "8"],
        ["training transformers vit:", "parameters on tpu", "first step's loss on tpu equal to CPU's"],
    ),
    "mingpt compile": (
        ["mingpt.py", "--compile", "--steps", "20", "--batch-size", "4", "--block-size", "16"],
        ['parameters on tpu (torch.compile(backend="tpu"))', "sample (prompt|generated)", "[ok]"],
    ),
    # (sets XLA_FLAGS for two host devices itself; the fused run is in tests/runtime/test_devices.py)
    "model parallel": (
        ["model_parallel.py", "--steps", "5"],
        ["parameters on ['tpu:0'] and ['tpu:1'] (strict eager)", "losses equal to CPU over 5 steps [ok]"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_example(case: str, tmp_path: Path) -> None:
    (script, *args), expected_lines = CASES[case]
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{case} failed:\n{done.stdout}\n{done.stderr}"
    for expected in expected_lines:
        assert expected in done.stdout, f"{expected!r} missing from:\n{done.stdout}"
