"""A custom fused kernel (``torch_tpu.pallas.jax_op``: RMSNorm in one JAX function) next to the
same computation op by op on tpu and PyTorch on CPU, in one run: medians and ratios.

Strict eager runs the op-by-op version as one XLA program per op; the ``jax_op`` is one program
whatever its size. Usage::

    python bench/bench_kernels.py               # all shapes
    python bench/bench_kernels.py --quick       # fewer rounds
    python bench/bench_kernels.py --markdown    # the table as Markdown, for docs/benchmarks.md
    python bench/bench_kernels.py --write-docs  # ... written into its section there
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import _docs
import jax
import jax.numpy as jnp
import torch
from bench_ops import compare, no_sync

import torch_tpu
from torch_tpu.pallas import jax_op

EPS = 1e-6
SHAPES = ((8, 512), (64, 1024), (512, 4096))


@jax_op("bench_kernels::rms_norm")
def rms_norm(x: jax.Array, weight: jax.Array) -> jax.Array:
    """RMSNorm over the last dimension, in float32, as one JAX function (one fused kernel)."""
    x32 = x.astype(jnp.float32)
    scale = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + EPS)
    return (x32 * scale * weight.astype(jnp.float32)).astype(x.dtype)


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The same computation op by op (what a model written in PyTorch does)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()).to(x.dtype)


class Row(NamedTuple):
    """One shape's median seconds a call, per contender."""

    shape: tuple[int, ...]
    jax_op: float
    op_by_op: float
    cpu: float


def measure(shape: tuple[int, ...], rounds: int) -> Row:
    """Median seconds a call at ``shape``, once the jax_op is checked against CPU's result."""
    x, w = torch.randn(*shape), torch.randn(shape[-1])
    xt, wt = x.to("tpu"), w.to("tpu")
    torch.testing.assert_close(rms_norm(xt, wt).cpu(), rms_norm_torch(x, w))
    last: list = [None]  # (the result is held, so the sync waits for it)

    def held(fn, *args):
        def run():
            last[0] = fn(*args)

        return run

    median = compare(
        {
            "jax_op": (held(rms_norm, xt, wt), torch_tpu.sync),
            "op by op": (held(rms_norm_torch, xt, wt), torch_tpu.sync),
            "cpu": (held(rms_norm_torch, x, w), no_sync),
        },
        calls=20,
        rounds=rounds,
    )
    return Row(shape, median["jax_op"], median["op by op"], median["cpu"])


def table(rows: list[Row], markdown: bool) -> str:
    """The medians and their ratios to the jax_op's, as plain columns or Markdown."""
    if markdown:
        lines = [
            "| shape | jax_op | op by op | cpu | op by op / jax_op | cpu / jax_op |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.shape} | {r.jax_op * 1e6:.0f} us | {r.op_by_op * 1e6:.0f} us | {r.cpu * 1e6:.0f} us "
            f"| {r.op_by_op / r.jax_op:.2f} | {r.cpu / r.jax_op:.2f} |"
            for r in rows
        ]
        return "\n".join(lines)
    lines = [
        f"{'shape':>14} {'jax_op':>10} {'op by op':>10} {'cpu':>10} "
        f"{'op by op/jax_op':>16} {'cpu/jax_op':>11}"
    ]
    lines += [
        f"{str(r.shape):>14} {r.jax_op * 1e6:>8.0f}us {r.op_by_op * 1e6:>8.0f}us {r.cpu * 1e6:>8.0f}us "
        f"{r.op_by_op / r.jax_op:>16.2f} {r.cpu / r.jax_op:>11.2f}"
        for r in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    _docs.add_flag(parser)
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else 7
    print(f"device: {torch.tpu.get_device_name()}")
    rows = [measure(shape, rounds) for shape in SHAPES]
    with _docs.section("kernels", args):
        print(table(rows, args.markdown))


if __name__ == "__main__":
    main()
