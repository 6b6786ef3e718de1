"""End-to-end demo: train a character-level GPT on the ``tpu`` device, then check it against CPU.

Run it with::

    python -m torch_tpu.demo                 # defaults: 300 steps on tpu
    python -m torch_tpu.demo --steps 100 --parity-steps 5

It trains :class:`~torch_tpu.demo.model.GPT` on the small corpus in ``torch_tpu/demo/data`` with a
progress bar, prints a sampled paragraph, replays the first steps on CPU and on the device from
the same initial weights and batches (dropout off) to compare their losses, and compares
training throughput side by side. The exit status is non-zero when the loss did not fall or the
parity check failed, so the demo doubles as a smoke test.

Neither check sits on a knife edge. "Learned" asks the validation loss to fall well below where
it started (an untrained model sits at ~log(vocabulary size); 150 steps reach 0.55-0.6 of that,
300 steps 0.37), not to cross a value tuned to one run. Parity allows the device's losses to differ
from CPU's by a few times CPU's own float32 rounding error, measured by replaying the same steps
on CPU in float64 (:mod:`torch_tpu.testing.reference`), whatever the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import time
from collections.abc import Callable, Sequence

import torch
from tqdm import tqdm

import torch_tpu  # noqa: F401  (registers the tpu device)
from torch_tpu.testing.reference import derived_tolerance

from .model import GPT, GPTConfig

CORPUS = "tiny_tales.txt"
#: A run passes when the validation loss ends below this fraction of where it started: far from
#: both an untrained model (1.0) and what 150 steps reach (0.55-0.6).
LOSS_DROP_REQUIRED = 0.8

Batch = tuple[torch.Tensor, torch.Tensor]  # (input ids, target ids), each (batch, block_size)


@dataclasses.dataclass
class CharCorpus:
    """The shipped text as a tensor of character ids, split 90/10 into train and validation."""

    chars: str
    train: torch.Tensor
    val: torch.Tensor

    @classmethod
    def load(cls, name: str = CORPUS) -> CharCorpus:
        text = importlib.resources.files(__name__).joinpath("data", name).read_text("ascii")
        chars = "".join(sorted(set(text)))
        ids = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
        split = int(0.9 * len(ids))
        return cls(chars, ids[:split], ids[split:])

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.chars.index(c) for c in text], dtype=torch.long)

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[i] for i in ids)


def batches(data: torch.Tensor, count: int, batch_size: int, block_size: int, seed: int) -> list[Batch]:
    """``count`` (input, target) pairs of random windows, drawn on CPU from a seeded generator so
    every device trains on exactly the same batches."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(len(data) - block_size - 1, (count, batch_size), generator=generator)
    windows = torch.arange(block_size + 1)
    result = []
    for row in starts:
        chunk = data[row[:, None] + windows]
        result.append((chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()))
    return result


def build(config: GPTConfig, state: dict[str, torch.Tensor], device: str) -> GPT:
    """A GPT created directly on ``device`` holding ``state``. Creating it there, instead of
    moving a CPU model with ``.to(device)``, keeps the tied embedding/LM-head weight tied on
    every device (see the tied-weights test in tests/test_training.py)."""
    with torch.device(device):
        model = GPT(config)
    model.load_state_dict(state)
    return model


def train(
    model: GPT,
    data: list[Batch],
    device: str,
    lr: float,
    on_step: Callable[[int, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """AdamW on ``model`` (already on ``device``) over ``data``; returns the per-step losses.

    Losses stay on the device until the end: reading one back every step would make each step
    wait for the previous one, hiding the asynchronous execution the device relies on."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    losses = []
    for step, (inputs, targets) in enumerate(data):
        _, loss = model(inputs.to(device), targets.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if on_step is not None:
            on_step(step, loss)
    return torch.stack(losses).cpu()


@torch.no_grad()
def evaluate(model: GPT, data: list[Batch], device: str) -> float:
    model.eval()
    losses = [model(inputs.to(device), targets.to(device))[1] for inputs, targets in data]
    model.train()
    return torch.stack(losses).mean().item()


def tokens_per_second(model: GPT, data: list[Batch], device: str, lr: float) -> float:
    """Training throughput on ``device``, timed after one untimed step (compilation, warm caches)."""
    train(model, data[:1], device, lr)
    synchronize(device)
    start = time.perf_counter()
    train(model, data[1:], device, lr)  # ends with a .cpu() of the losses, i.e. a full sync
    elapsed = time.perf_counter() - start
    inputs = data[0][0]
    return (len(data) - 1) * inputs.numel() / elapsed


def synchronize(device: str) -> None:
    if torch.device(device).type == "tpu":
        torch.tpu.synchronize()


def losses_match(
    device_losses: torch.Tensor, cpu_losses: torch.Tensor, float64_losses: torch.Tensor
) -> tuple[bool, float, float]:
    """Whether the device's per-step losses match CPU's within a few times CPU's own distance
    from the float64 run of the same steps; also the largest difference and what was allowed."""
    tolerance = derived_tolerance(cpu_losses, float64_losses)
    difference = (device_losses - cpu_losses).abs()
    allowed = tolerance["atol"] + tolerance["rtol"] * cpu_losses.abs()
    return bool((difference <= allowed).all()), difference.max().item(), allowed.min().item()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m torch_tpu.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument("--device", default="tpu", help="device to train on (default tpu)")
    parser.add_argument(
        "--parity-steps",
        type=int,
        default=10,
        help="steps replayed on CPU and the device for the parity check",
    )
    parser.add_argument(
        "--throughput-steps",
        type=int,
        default=10,
        help="steps timed on each device for the throughput comparison",
    )
    parser.add_argument("--sample-chars", type=int, default=200, help="characters to generate")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("steps", "parity_steps", "throughput_steps"):
        if getattr(args, name) < 2:
            parser.error(f"--{name.replace('_', '-')} must be at least 2")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Train, sample, check parity with CPU and compare throughput; 0 where the loss fell and
    matched CPU's."""
    args = parse_args(argv)
    device = args.device
    corpus = CharCorpus.load()
    config = GPTConfig(
        vocab_size=len(corpus.chars), block_size=64, n_layer=2, n_head=4, n_embd=64, dropout=0.0
    )
    print(
        f"torch_tpu demo: character-level GPT on {device} "
        f"({torch.tpu.get_device_name() if torch.device(device).type == 'tpu' else 'host CPU'})"
    )
    torch.manual_seed(args.seed)
    initial_state = GPT(config).state_dict()  # initialized on CPU: the same weights for every device
    model = build(config, initial_state, device)
    print(
        f"model: {sum(p.numel() for p in model.parameters()):,} parameters, vocab "
        f"{config.vocab_size}, context {config.block_size}; corpus {len(corpus.train):,} characters"
    )
    train_data = batches(corpus.train, args.steps, _BATCH_SIZE, config.block_size, seed=args.seed)
    learned = _train_and_validate(model, corpus, train_data, args)
    _sample(model, corpus, args)
    parity = _parity_and_throughput(config, initial_state, train_data, args)
    return 0 if learned and parity else 1


_BATCH_SIZE, _LR = 32, 6e-3


def _train_and_validate(model, corpus: CharCorpus, train_data, args: argparse.Namespace) -> bool:
    """Train on ``train_data``, showing the loss; whether the validation loss fell enough."""
    device = args.device
    val_data = batches(corpus.val, 4, _BATCH_SIZE, model.config.block_size, seed=args.seed + 1)
    val_before = evaluate(model, val_data, device)
    with tqdm(total=args.steps, desc="training", unit="step") as bar:

        def show(step: int, loss: torch.Tensor) -> None:
            if step % 10 == 0 or step == args.steps - 1:
                bar.set_postfix(loss=f"{loss.item():.3f}")  # an occasional sync only
            bar.update()

        losses = train(model, train_data, device, _LR, on_step=show)
    val_after = evaluate(model, val_data, device)
    learned = val_after < LOSS_DROP_REQUIRED * val_before
    print(
        f"train loss {losses[:10].mean():.3f} -> {losses[-10:].mean():.3f}; "
        f"validation loss {val_before:.3f} -> {val_after:.3f} "
        f"[{'ok' if learned else 'FAILED: the loss did not fall enough'}]"
    )
    return learned


def _sample(model, corpus: CharCorpus, args: argparse.Namespace) -> None:
    """Print a sample continuing a validation prompt. A prompt of exactly block_size characters
    keeps every forward pass the same shape, so the device compiles each op once instead of
    once per prompt length."""
    block_size = model.config.block_size
    prompt = corpus.decode(corpus.val[:block_size].tolist())
    torch.manual_seed(args.seed)
    model.eval()
    generated = model.generate(
        corpus.encode(prompt)[None].to(args.device), args.sample_chars, temperature=0.8
    )
    print("\n--- sample (prompt, then generated) " + "-" * 40)
    print(prompt + "|" + corpus.decode(generated[0, block_size:].tolist()))
    print("-" * 76 + "\n")


def _parity_and_throughput(
    config: GPTConfig, initial_state: dict, train_data, args: argparse.Namespace
) -> bool:
    """The same steps from the same weights on the device, CPU and CPU in float64 (config.dropout
    is 0: the devices draw different random streams, so dropout would differ), then throughput
    side by side; whether the device's losses match CPU's within float64's tolerance."""
    device = args.device
    cpu_model = build(config, initial_state, "cpu")
    device_model = build(config, initial_state, device)
    parity_data = train_data[: args.parity_steps]
    cpu_losses = train(cpu_model, parity_data, "cpu", _LR)
    device_losses = train(device_model, parity_data, device, _LR)
    float64_losses = train(build(config, initial_state, "cpu").double(), parity_data, "cpu", _LR)
    parity, difference, allowed = losses_match(device_losses, cpu_losses, float64_losses)
    print(
        f"parity over {args.parity_steps} steps (same init, same batches): max loss difference "
        f"{device} vs cpu {difference:.1e}, allowed {allowed:.1e} (cpu float32 vs float64 "
        f"{(cpu_losses - float64_losses).abs().max().item():.1e}) "
        f"[{'ok' if parity else 'FAILED'}]"
    )
    speed_data = train_data[: args.throughput_steps]
    device_speed = tokens_per_second(device_model, speed_data, device, _LR)
    cpu_speed = tokens_per_second(cpu_model, speed_data, "cpu", _LR)
    print(
        f"throughput: {device} {device_speed:,.0f} tokens/s, cpu {cpu_speed:,.0f} tokens/s, "
        f"ratio {device_speed / cpu_speed:.2f}x (measured side by side)"
    )
    return parity
