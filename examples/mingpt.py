"""Train the demo's minGPT-style GPT on the tpu device, eagerly or under ``torch.compile``.

The character-level GPT of ``python -m torch_tpu.demo`` (``torch_tpu.demo.model.GPT``: GPT-2's
layout, pre-norm) learns the tales shipped in ``torch_tpu/demo/data`` with AdamW, in plain
PyTorch; ``--compile`` wraps it in ``torch.compile(backend="tpu")``. The first step's loss is also
computed on CPU, in float32 and float64, from the same weights and batch. Run it with::

    python examples/mingpt.py
    python examples/mingpt.py --compile
    python examples/mingpt.py --steps 2000 --batch-size 64 --block-size 256 --n-layer 6 \\
        --n-head 6 --n-embd 384 --lr 1e-3 --compile

(the last is nanoGPT's Shakespeare-character size, 10.8M parameters.) It prints the loss every
few steps and a sample; the exit status is non-zero when the loss did not fall or the first
step's loss on tpu differs from CPU's by more than float32 rounding.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch
from _common import loss_fell, matches_cpu, parse_training_args

from torch_tpu.demo import CharCorpus, batches, build, train
from torch_tpu.demo.model import GPT, GPTConfig

DEVICE = "tpu"


def first_loss_on_cpu(config: GPTConfig, state: dict, batch: tuple, dtype: torch.dtype) -> torch.Tensor:
    """The first step's loss, computed by a CPU GPT holding ``state`` in ``dtype``."""
    inputs, targets = batch
    return build(config, state, "cpu").to(dtype)(inputs, targets)[1].detach()


def sample(model: GPT, corpus: CharCorpus, characters: int) -> str:
    """``characters`` characters the trained model writes after the start of the validation text."""
    prompt = corpus.val[: model.config.block_size]
    torch.manual_seed(0)
    generated = model.eval().generate(prompt[None].to(DEVICE), characters, temperature=0.8)
    return corpus.decode(prompt.tolist()) + "|" + corpus.decode(generated[0, len(prompt) :].tolist())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps (200)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step (16)")
    parser.add_argument("--block-size", type=int, default=64, help="characters of context (64)")
    parser.add_argument("--n-layer", type=int, default=2, help="transformer blocks (2)")
    parser.add_argument("--n-head", type=int, default=4, help="attention heads (4)")
    parser.add_argument("--n-embd", type=int, default=64, help="embedding width (64)")
    parser.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate (2e-3)")
    parser.add_argument("--compile", action="store_true", help='torch.compile(backend="tpu")')
    parser.add_argument("--sample-chars", type=int, default=80, help="characters to generate (80)")
    return parse_training_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    corpus = CharCorpus.load()
    config = GPTConfig(
        vocab_size=len(corpus.chars),
        block_size=args.block_size,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
    )
    torch.manual_seed(0)
    state = GPT(config).state_dict()  # (drawn on CPU: the same weights for the CPU check)
    model = build(config, state, DEVICE)
    data = batches(corpus.train, args.steps, args.batch_size, args.block_size, seed=0)
    on_cpu = [first_loss_on_cpu(config, state, data[0], dtype) for dtype in (torch.float32, torch.float64)]
    mode = 'torch.compile(backend="tpu")' if args.compile else "eager"
    print(f"training {sum(p.numel() for p in model.parameters()):,} parameters on {DEVICE} ({mode})")
    every = max(args.steps // 10, 1)

    def show(step: int, loss: torch.Tensor) -> None:
        if step == 0 or (step + 1) % every == 0:
            print(f"step {step + 1:4d}  loss {loss.item():.4f}", flush=True)

    trained = torch.compile(model, backend="tpu") if args.compile else model
    losses = train(trained, data, DEVICE, args.lr, on_step=show)
    print(f"sample (prompt|generated): {sample(model, corpus, args.sample_chars)!r}")
    learned = loss_fell(losses.tolist(), max(args.steps // 5, 1))  # (batches differ: first and last fifths)
    alike = matches_cpu("first step's loss", losses[0], *on_cpu)
    return learned or alike


if __name__ == "__main__":
    sys.exit(main())
