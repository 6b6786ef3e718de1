"""Model parallelism without DDP: half of a network's layers on ``tpu:0``, half on ``tpu:1``.

One process drives both devices. The activations move between them with ``.to("tpu:1")`` (and
their gradients back, through autograd), each half's parameters and optimizer state stay on
their device, and one optimizer steps both. The same model trains on CPU from the same initial
weights; every step's tpu loss must match CPU's within the tolerance a float64 run derives
(``torch_tpu.testing.reference``), else the exit status is non-zero.

On a host with one device (the XLA:CPU stand-in) the script asks JAX for two host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=2``, set before the device starts; the flag
only affects XLA's CPU platform). Run it with::

    python examples/model_parallel.py [--steps 20] [--mode strict|fused]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Sequence

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"

import torch  # noqa: E402  (after XLA_FLAGS: read when the device starts)
from torch import nn  # noqa: E402

import torch_tpu  # noqa: E402
from torch_tpu.testing.reference import assert_matches_cpu  # noqa: E402


def half(width: int, depth: int) -> nn.Sequential:
    return nn.Sequential(*(layer for _ in range(depth) for layer in (nn.Linear(width, width), nn.GELU())))


class TwoDeviceMLP(nn.Module):
    """``first`` runs on one device, ``second`` (and the head) on another."""

    def __init__(self, width: int = 32, depth: int = 2, classes: int = 5):
        super().__init__()
        self.first = half(width, depth)
        self.second = nn.Sequential(half(width, depth), nn.Linear(width, classes))

    def place(self, first: str | torch.device, second: str | torch.device) -> TwoDeviceMLP:
        self.first.to(first)
        self.second.to(second)
        self.devices = (torch.device(first), torch.device(second))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x.to(self.devices[0]))
        return self.second(hidden.to(self.devices[1]))  # the activations cross devices here


def train(model: TwoDeviceMLP, batches: list, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Losses of each step (on CPU); the model's parameters are trained in place."""
    model.to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in batches:
        logits = model(x.to(dtype))
        loss = nn.functional.cross_entropy(logits, y.to(logits.device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach().cpu())
    return torch.stack(losses)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--mode", choices=["strict", "fused"], default="strict")
    args = parser.parse_args(argv)
    if torch.tpu.device_count() < 2:
        print(f"needs two tpu devices, this host has {torch.tpu.device_count()}")
        return 1

    torch.manual_seed(0)
    initial = TwoDeviceMLP()
    batches = [
        (torch.randn(args.batch_size, 32), torch.randint(0, 5, (args.batch_size,))) for _ in range(args.steps)
    ]
    cpu = train(copy.deepcopy(initial).place("cpu", "cpu"), batches)
    reference = train(copy.deepcopy(initial).place("cpu", "cpu"), batches, torch.float64)
    model = copy.deepcopy(initial).place("tpu:0", "tpu:1")
    with torch_tpu.eager_mode(args.mode):
        tpu = train(model, batches)
    first, second = (
        {p.device for p in model.first.parameters()},
        {p.device for p in model.second.parameters()},
    )
    print(f"parameters on {sorted(map(str, first))} and {sorted(map(str, second))} ({args.mode} eager)")
    for step in range(0, args.steps, max(args.steps // 5, 1)):
        print(f"step {step + 1:3d}  loss tpu {tpu[step].item():.6f}  cpu {cpu[step].item():.6f}")
    try:
        assert_matches_cpu(tpu, cpu, reference, "losses")
        ok = first == {torch.device("tpu:0")} and second == {torch.device("tpu:1")}
    except AssertionError as error:
        print(error)
        ok = False
    print(f"losses equal to CPU over {args.steps} steps [{'ok' if ok else 'FAILED'}]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
