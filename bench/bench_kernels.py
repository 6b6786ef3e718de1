"""A custom fused kernel (``torch_tpu.pallas.jax_op``: RMSNorm in one JAX function) next to the
same computation op by op on tpu and PyTorch on CPU, in one run: medians and ratios.

Strict eager runs the op-by-op version as one XLA program per op; the ``jax_op`` is one program
whatever its size. Usage::

    python bench/bench_kernels.py            # all shapes
    python bench/bench_kernels.py --quick    # fewer rounds
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import torch
from bench_ops import compare, no_sync

import torch_tpu
from torch_tpu.pallas import jax_op

EPS = 1e-6


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    rounds = 3 if parser.parse_args().quick else 7
    print(f"device: {torch.tpu.get_device_name()}")
    print(
        f"{'shape':>14} {'jax_op':>10} {'op by op':>10} {'cpu':>10} "
        f"{'op by op/jax_op':>16} {'cpu/jax_op':>11}"
    )
    for shape in ((8, 512), (64, 1024), (512, 4096)):
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
        fused = median["jax_op"]
        print(
            f"{str(shape):>14} {fused * 1e6:>8.0f}us {median['op by op'] * 1e6:>8.0f}us "
            f"{median['cpu'] * 1e6:>8.0f}us {median['op by op'] / fused:>16.2f} "
            f"{median['cpu'] / fused:>11.2f}"
        )


if __name__ == "__main__":
    main()
