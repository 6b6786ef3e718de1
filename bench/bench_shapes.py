"""Shapes that change: time and XLA compiles of workloads whose sizes vary, bucketed and not.

Each case runs in a fresh process with the persistent compile cache off, so every XLA compile
is counted (``torch.tpu.compilation_cache_stats()["xla_compiles"]``); ``TORCH_TPU_BUCKETS=0``
gives the same run without size buckets, side by side:

- **GPT training**: 40 AdamW steps of the demo GPT (2 layers, d=64, batch 8) with sequence
  lengths drawn from 8..64, against the same steps at length 64, on PyTorch CPU, tpu strict,
  tpu fused and ``torch.compile(model, backend="tpu", dynamic=None)`` (the issue's target: the
  variable run within 4.5x the fixed run's time and compiles);
- **Hugging Face Llama fine-tuning**: the test zoo's tiny ``LlamaForCausalLM`` (2 layers, d=32) with AdamW on
  batches of 4 sequences of 8..64 tokens from ``DataCollatorWithPadding``, each batch padded to
  its longest against all padded to 64, strict and fused;
- **new size in a bucket**: ``float((torch.ones(n, 7, device="tpu") * 2).sum())`` for 10 new
  sizes n in 33..60 after two warm-up sizes (36, 40: bucket 64 compiled): compiles and time
  per size, against a repeated size;
- **torch.compile(dynamic=None)**: 11 new lengths in 11..64 after a first call at 8.

Usage: ``python bench/bench_shapes.py [--markdown] [--steps N] [--hf-steps N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import _docs

HERE = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------- the cases (child side)
def _compiles() -> int:
    import torch

    return torch.tpu.compilation_cache_stats()["xla_compiles"]


def _gpt_case(device: str, mode: str, lengths: list[int]) -> dict:
    import torch

    import torch_tpu  # noqa: F401
    from torch_tpu.demo.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=64, n_layer=2, n_head=4, n_embd=64)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [(torch.randint(0, 64, (8, n)), torch.randint(0, 64, (8, n))) for n in lengths]
    context = torch_tpu.eager_mode("fused") if mode == "fused" else _nothing()
    step = torch.compile(model, backend="tpu", dynamic=None) if mode == "compile" else model
    compiles = _compiles() if device == "tpu" else 0
    started = time.perf_counter()
    losses = []
    with context:
        for x, y in batches:
            _, loss = step(x.to(device), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "compiles": _compiles() - compiles if device == "tpu" else 0,
        "last_loss": losses[-1],
    }


def _hf_batches(kind: str, steps: int) -> list:
    """Batches of 4 random token sequences of 8..64 tokens, as ``DataCollatorWithPadding``
    makes them: padded to the batch's longest ("variable") or all to 64 ("fixed"); a word-level
    tokenizer built in memory (nothing downloads)."""
    import random

    from tokenizers import Tokenizer, models
    from transformers import DataCollatorWithPadding, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, **{f"t{i}": i + 2 for i in range(126)}}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        pad_token="<pad>",
        unk_token="<unk>",
    )
    rng = random.Random(0)
    examples = [
        {"input_ids": [rng.randrange(2, 128) for _ in range(rng.randint(8, 64))]} for _ in range(4 * steps)
    ]
    collate = DataCollatorWithPadding(
        tokenizer, padding="max_length" if kind == "fixed" else "longest", max_length=64
    )
    return [collate(examples[i : i + 4]) for i in range(0, len(examples), 4)]


def _hf_case(device: str, mode: str, kind: str, steps: int) -> dict:
    """The test zoo's tiny Hugging Face Llama (2 layers, d=32) fine-tuned with AdamW on
    :func:`_hf_batches`."""
    import torch

    import torch_tpu
    from torch_tpu.testing import hf_zoo

    batches = _hf_batches(kind, steps)
    model = hf_zoo.build("llama").train().to(device)  # (the test zoo's tiny Llama, no dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    context = torch_tpu.eager_mode("fused") if mode == "fused" else _nothing()
    compiles = _compiles() if device == "tpu" else 0
    started, losses = time.perf_counter(), []
    with context:
        for batch in batches:
            ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
            loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    return {
        "seconds": time.perf_counter() - started,
        "compiles": _compiles() - compiles if device == "tpu" else 0,
        "last_loss": losses[-1],
    }


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _bucket_case() -> dict:
    import torch

    import torch_tpu  # noqa: F401

    def run(n: int) -> float:
        return float((torch.ones(n, 7, device="tpu") * 2).sum())

    for n in (36, 40):  # (a site whose size changed once: dynamic from then on; bucket 64)
        run(n)
    sizes = [33, 36, 39, 42, 45, 48, 51, 54, 57, 60]
    per_size = []
    for n in sizes:
        before, started = _compiles(), time.perf_counter()
        assert run(n) == 14 * n
        per_size.append((time.perf_counter() - started, _compiles() - before))
    for _ in range(3):
        run(60)
    started = time.perf_counter()
    for _ in range(20):
        run(60)
    cached = (time.perf_counter() - started) / 20
    return {
        "new_size_seconds": sorted(s for s, _ in per_size)[len(per_size) // 2],  # (the median)
        "new_size_compiles": sum(c for _, c in per_size) / len(per_size),
        "cached_seconds": cached,
    }


def _compile_case() -> dict:
    import torch

    import torch_tpu  # noqa: F401

    def f(x):
        return (x * 2).softmax(-1).sum(0)

    fn = torch.compile(f, backend="tpu", dynamic=None)
    fn(torch.randn(8, 16, device="tpu"))
    before = _compiles()
    for n in range(11, 65, 5):
        x = torch.randn(n, 16)
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), f(x), rtol=1e-5, atol=1e-5)
    return {"compiles": _compiles() - before, "lengths": len(range(11, 65, 5))}


def _child(case: str, args: list[str]) -> None:
    if case == "gpt":
        device, mode, lengths = args[0], args[1], json.loads(args[2])
        result = _gpt_case(device, mode, lengths)
    elif case == "hf":
        result = _hf_case(args[0], args[1], args[2], int(args[3]))
    elif case == "bucket":
        result = _bucket_case()
    else:
        result = _compile_case()
    print("RESULT " + json.dumps(result))


# ----------------------------------------------------------------------------- the table (parent side)
def _run(case: str, *args: str, buckets: bool = True) -> dict:
    env = dict(os.environ, TORCH_TPU_CACHE_DIR="0", TORCH_TPU_BUCKETS="1" if buckets else "0")
    out = subprocess.run(
        [sys.executable, __file__, "--child", case, *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{case} {args} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")


_MODE_NAMES = {"strict": "strict", "fused": "fused", "compile": "torch.compile(dynamic=None)"}


def _lengths(steps: int) -> list[int]:
    import random

    rng = random.Random(0)
    return [rng.randint(8, 64) for _ in range(steps)]


def _hf_rows(steps: int) -> list[tuple]:
    cpu = {kind: _run("hf", "cpu", "strict", kind, str(steps)) for kind in ("variable", "fixed")}
    rows = [
        (
            "HF Llama + DataCollatorWithPadding, PyTorch CPU",
            f"{cpu['variable']['seconds']:.2f} s",
            f"{cpu['fixed']['seconds']:.2f} s",
            "",
            "",
        )
    ]
    for mode in ("strict", "fused"):
        var, fix = (_run("hf", "tpu", mode, kind, str(steps)) for kind in ("variable", "fixed"))
        rows.append(
            (
                f"HF Llama + DataCollatorWithPadding, tpu {mode}",
                f"{var['seconds']:.2f} s, {var['compiles']} compiles",
                f"{fix['seconds']:.2f} s, {fix['compiles']} compiles",
                f"{var['seconds'] / fix['seconds']:.1f}x time, "
                f"{var['compiles'] / max(fix['compiles'], 1):.1f}x compiles",
                f"loss {var['last_loss']:.4f} (CPU {cpu['variable']['last_loss']:.4f})",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true")
    _docs.add_flag(parser)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--hf-steps", type=int, default=20)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        _child(options.child[0], options.child[1:])
        return
    variable, fixed = _lengths(options.steps), [64] * options.steps
    rows = []
    cpu_var = _run("gpt", "cpu", "strict", json.dumps(variable))
    cpu_fixed = _run("gpt", "cpu", "strict", json.dumps(fixed))
    rows.append(("GPT, PyTorch CPU", f"{cpu_var['seconds']:.2f} s", f"{cpu_fixed['seconds']:.2f} s", "", ""))
    for mode in ("strict", "fused", "compile"):
        for buckets in (True, False):
            var = _run("gpt", "tpu", mode, json.dumps(variable), buckets=buckets)
            fix = _run("gpt", "tpu", mode, json.dumps(fixed), buckets=buckets)
            rows.append(
                (
                    f"GPT, tpu {_MODE_NAMES[mode]}" + ("" if buckets else " (TORCH_TPU_BUCKETS=0)"),
                    f"{var['seconds']:.2f} s, {var['compiles']} compiles",
                    f"{fix['seconds']:.2f} s, {fix['compiles']} compiles",
                    f"{var['seconds'] / fix['seconds']:.1f}x time, "
                    f"{var['compiles'] / max(fix['compiles'], 1):.1f}x compiles",
                    f"loss {var['last_loss']:.4f} (CPU {cpu_var['last_loss']:.4f})",
                )
            )
    rows.extend(_hf_rows(options.hf_steps))
    for buckets in (True, False):
        b = _run("bucket", buckets=buckets)
        rows.append(
            (
                "ones(n, 7) * 2 .sum(), new n in a bucket" + ("" if buckets else " (TORCH_TPU_BUCKETS=0)"),
                f"{b['new_size_seconds'] * 1e3:.2f} ms (median), "
                f"{b['new_size_compiles']:.1f} compiles a size",
                f"{b['cached_seconds'] * 1e3:.2f} ms cached",
                f"{b['new_size_seconds'] / b['cached_seconds']:.1f}x a cached call",
                "",
            )
        )
    for buckets in (True, False):
        c = _run("compile", buckets=buckets)
        rows.append(
            (
                "torch.compile(dynamic=None), new lengths" + ("" if buckets else " (TORCH_TPU_BUCKETS=0)"),
                f"{c['compiles']} compiles for {c['lengths']} lengths",
                "",
                "",
                "",
            )
        )
    header = ("case", "variable sizes", "fixed size", "ratio", "note")
    with _docs.section("shapes", options):
        if options.markdown:
            print("| " + " | ".join(header) + " |")
            print("|" + "---|" * len(header))
            for row in rows:
                print("| " + " | ".join(row) + " |")
        else:
            for row in rows:
                print(" | ".join(row))


if __name__ == "__main__":
    main()
