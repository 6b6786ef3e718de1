"""A Hugging Face Llama on tpu next to PyTorch CPU: greedy generation and a training step.

Both devices run the same small random Llama (its config is printed with the results). Each case
is first timed once "cold" (its first call: on tpu that includes compiling every op shape not
yet met in the process, so a case reuses what the cases above it compiled), then "warm" as the
median of interleaved rounds, with the timing helpers of ``bench_ops.py``. Ratios are tpu time /
CPU time (below 1: tpu is faster). PyTorch CPU is very sensitive to other load on the machine
(its thread pool waits for descheduled threads), so check the load average printed first.
Usage::

    python bench/bench_hf.py               # default sizes
    python bench/bench_hf.py --quick       # fewer rounds, batch 1 only (smoke run)
    python bench/bench_hf.py --markdown    # the table as Markdown, for the docs
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import time
from collections.abc import Callable

import _docs
import jax
import torch
from bench_ops import compare, no_sync

import torch_tpu  # noqa: F401  (registers the tpu device)
from torch_tpu.testing import hf_zoo

#: Larger than the test zoo's default Llama (hidden 32, vocab 128) so the work per op is not
#: only overhead, small enough for a 2-core CI box.
LLAMA = dict(
    vocab_size=1024,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=128,
)
PROMPT_LENGTH, NEW_TOKENS = 16, 32
TRAIN_BATCH, TRAIN_LENGTH = 8, 64

Contenders = dict[str, tuple[Callable[[], object], Callable[[], None]]]
DEVICES = {"tpu": ("tpu", torch.tpu.synchronize), "cpu": ("cpu", no_sync)}


@dataclasses.dataclass
class Result:
    """Seconds per call of one case, cold and warm, per device; ``tokens`` is the number of
    tokens one call produces (generation) or consumes (training)."""

    name: str
    tokens: int
    cold: dict[str, float]
    warm: dict[str, float]

    def ratio(self, timing: dict[str, float]) -> float:
        return timing["tpu"] / timing["cpu"]


def _measure(name: str, tokens: int, contenders: Contenders, rounds: int) -> Result:
    """The first call of each contender alone (cold), then the warm median over ``rounds``."""
    cold = {}
    for label, (fn, sync) in contenders.items():
        start = time.perf_counter()
        fn()
        sync()
        cold[label] = time.perf_counter() - start
    warm = compare(contenders, calls=1, rounds=rounds)
    return Result(name, tokens, cold, warm)


def _generation_cases(
    model: torch.nn.Module, batch: int, static_cache: bool = False, compile_on_tpu: bool = False
) -> Contenders:
    """Greedy decoding of exactly NEW_TOKENS tokens after a PROMPT_LENGTH-token prompt.

    The default dynamic KV cache grows by one position per token, so every decoding step has new
    shapes (on tpu: new compilations on the cold run). A static cache keeps them fixed.
    ``disable_compile``: with a static cache on tpu, transformers wraps the decoding step in
    ``torch.compile(backend="tpu")``; ``compile_on_tpu=False`` turns that off so both devices
    decode eagerly. CPU always decodes eagerly."""
    generator = torch.Generator().manual_seed(batch)
    prompt = torch.randint(3, LLAMA["vocab_size"], (batch, PROMPT_LENGTH), generator=generator)
    cases = {}
    for label, (device, sync) in DEVICES.items():
        replica = copy.deepcopy(model).to(device)
        ids = prompt.to(device)
        compiled = compile_on_tpu and device == "tpu"
        options = dict(cache_implementation="static", disable_compile=not compiled) if static_cache else {}

        def generate(replica=replica, ids=ids, options=options):
            return replica.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                num_beams=1,
                **options,
            )

        cases[label] = (generate, sync)
    return cases


def _train_step_cases(model: torch.nn.Module) -> Contenders:
    """Forward with labels, backward and an AdamW step on a TRAIN_BATCH x TRAIN_LENGTH batch."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, LLAMA["vocab_size"], (TRAIN_BATCH, TRAIN_LENGTH), generator=generator)
    cases = {}
    for label, (device, sync) in DEVICES.items():
        replica = copy.deepcopy(model).to(device).train()
        optimizer = torch.optim.AdamW(replica.parameters(), lr=1e-3)
        batch = ids.to(device)

        def step(replica=replica, optimizer=optimizer, batch=batch):
            loss = replica(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss

        cases[label] = (step, sync)
    return cases


def _throughput(result: Result, timing: dict[str, float], label: str) -> str:
    return f"{result.tokens / timing[label]:,.0f}"


def text_table(results: list[Result]) -> str:
    header = (
        f"{'case':42s} {'tpu cold':>10s} {'cpu cold':>10s} {'cold ratio':>10s}  "
        f"{'tpu warm':>10s} {'cpu warm':>10s} {'warm ratio':>10s}  "
        f"{'tpu tok/s':>10s} {'cpu tok/s':>10s}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.name:42s} {r.cold['tpu']:9.3f}s {r.cold['cpu']:9.3f}s "
            f"{r.ratio(r.cold):9.2f}x  {r.warm['tpu']:9.3f}s {r.warm['cpu']:9.3f}s "
            f"{r.ratio(r.warm):9.2f}x  {_throughput(r, r.warm, 'tpu'):>10s} "
            f"{_throughput(r, r.warm, 'cpu'):>10s}"
        )
    return "\n".join(lines)


def markdown_table(results: list[Result]) -> str:
    lines = [
        "| case | tpu cold | CPU cold | cold tpu/CPU | tpu warm | CPU warm | warm tpu/CPU "
        "| tpu tokens/s (warm) | CPU tokens/s (warm) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.cold['tpu']:.3f} s | {r.cold['cpu']:.3f} s | "
            f"{r.ratio(r.cold):.2f}x | {r.warm['tpu']:.3f} s | {r.warm['cpu']:.3f} s | "
            f"{r.ratio(r.warm):.2f}x | {_throughput(r, r.warm, 'tpu')} | "
            f"{_throughput(r, r.warm, 'cpu')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, batch 1 only")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    _docs.add_flag(parser)
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else 5
    batches = (1,) if args.quick else (1, 4)

    model = hf_zoo.build("llama", **LLAMA)
    print(
        f"device: {torch.tpu.get_device_name()}  (torch {torch.__version__}, "
        f"jax {jax.__version__}, {torch.get_num_threads()} CPU threads, load average "
        f"{os.getloadavg()[0]:.1f} at start)"
    )
    print(
        f"model: Llama, {model.num_parameters():,} parameters: "
        + ", ".join(f"{k}={v}" for k, v in LLAMA.items())
    )
    print(
        f"generation: greedy, {NEW_TOKENS} new tokens after a {PROMPT_LENGTH}-token prompt; "
        f"training: batch {TRAIN_BATCH} x {TRAIN_LENGTH} tokens, AdamW; warm = median of "
        f"{rounds} rounds; cold = first call (cases run top to bottom, sharing compiled "
        f"kernels); ratio = tpu time / CPU time\n",
        flush=True,
    )

    results = []
    for batch in batches:
        results.append(
            _measure(
                f"generate {NEW_TOKENS} tok, batch {batch}",
                batch * NEW_TOKENS,
                _generation_cases(model, batch),
                rounds,
            )
        )
    results.append(
        _measure(
            f"generate {NEW_TOKENS} tok, batch 1, static cache",
            NEW_TOKENS,
            _generation_cases(model, 1, static_cache=True),
            rounds,
        )
    )
    results.append(
        _measure(
            f"generate {NEW_TOKENS} tok, batch 1, static cache, tpu compiled",
            NEW_TOKENS,
            _generation_cases(model, 1, True, compile_on_tpu=True),
            rounds,
        )
    )
    results.append(
        _measure("train step (fwd+bwd+AdamW)", TRAIN_BATCH * TRAIN_LENGTH, _train_step_cases(model), rounds)
    )
    with _docs.section("hf", args):
        print(markdown_table(results) if args.markdown else text_table(results))


if __name__ == "__main__":
    main()
