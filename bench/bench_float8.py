"""Low-precision matmuls on tpu next to PyTorch CPU and ``jax.jit``, in one run: a float32 and a
bfloat16 product, a float8 ``torch._scaled_mm`` (tensor-wise scales, bfloat16 result) and
torchao's int8 weight-only linear (bfloat16 activations) at a few sizes.

On the CPU stand-in this measures overhead and correctness, not float8's speed: XLA:CPU and
ATen both widen float8 and int8 to float32 to multiply (a TPU v6e/v7x multiplies float8 in its
matrix units). The error column is tpu's largest deviation from the float64 product of the same
(quantized) operands, relative to the largest product: the cost of the precision itself.

Usage::

    python bench/bench_float8.py              # the table
    python bench/bench_float8.py --markdown   # as Markdown, for docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import _docs
import jax
import jax.numpy as jnp
import torch
from bench_ops import compare, no_sync

import torch_tpu

#: (rows of activations, inner size, output features): a decoding step's, a prefill's
SIZES = [(16, 1024, 1024), (256, 1024, 1024)]
KINDS = ["float32", "bfloat16", "float8 _scaled_mm", "int8 weight-only"]


@dataclass
class Case:
    """One product's contenders (torch on tpu and on CPU, ``jax.jit`` where it applies) and the
    float64 result their error is measured against."""

    tpu: Callable[[], torch.Tensor]
    cpu: Callable[[], torch.Tensor]
    jax: Callable[[], jax.Array] | None
    exact: torch.Tensor


def _scaled(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` as float8_e4m3fn with a tensor-wise scale (torchao's recipe), and 1/scale."""
    scale = 448.0 / x.abs().max().float()
    return (x * scale).to(torch.float8_e4m3fn), scale.reciprocal()


def _plain_case(a: torch.Tensor, w: torch.Tensor, dtype: torch.dtype) -> Case:
    a, w = a.to(dtype), w.to(dtype)
    ta, tw = a.to("tpu"), w.to("tpu")
    ja, jw = torch_tpu.to_jax(ta), torch_tpu.to_jax(tw)
    dot = jax.jit(lambda x, y: x @ y.T)
    return Case(lambda: ta @ tw.t(), lambda: a @ w.t(), lambda: dot(ja, jw), a.double() @ w.double().t())


def _float8_case(a: torch.Tensor, w: torch.Tensor) -> Case:
    (a8, sa), (w8, sw) = _scaled(a), _scaled(w)
    t = [x.to("tpu") for x in (a8, w8, sa, sw)]
    j = [torch_tpu.to_jax(x) for x in t]

    def dot(x, y, sx, sy):
        product = jnp.dot(x, y.T, preferred_element_type=jnp.float32)
        return (product * sx * sy).astype(jnp.bfloat16)

    dot = jax.jit(dot)
    exact = (a8.double() * sa.double()) @ (w8.double() * sw.double()).t()
    return Case(
        lambda: torch._scaled_mm(t[0], t[1].t(), t[2], t[3], out_dtype=torch.bfloat16),
        lambda: torch._scaled_mm(a8, w8.t(), sa, sw, out_dtype=torch.bfloat16),
        lambda: dot(*j),
        exact,
    )


def _int8_linear(w: torch.Tensor) -> torch.nn.Module:
    """torchao's int8 weight-only linear of weight ``w`` (bfloat16 activations)."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(w)
    quantize_(linear, Int8WeightOnlyConfig())
    return linear


def _int8_case(a: torch.Tensor, w: torch.Tensor) -> Case:
    linear, on_tpu = _int8_linear(w), _int8_linear(w).to("tpu")  # (quantized alike)
    exact = a.bfloat16().double() @ linear.weight.dequantize().double().t()
    ta, ca = a.bfloat16().to("tpu"), a.bfloat16()
    weight = on_tpu.weight
    j = [torch_tpu.to_jax(x) for x in (ta, weight.qdata, weight.scale)]

    def dot(x, q, scale):  # torchao's: the int8 weight widened, the product, the row scales
        return (x @ q.astype(x.dtype).T) * scale.reshape(1, -1).astype(x.dtype)

    dot = jax.jit(dot)
    return Case(lambda: on_tpu(ta), lambda: linear(ca), lambda: dot(*j), exact)


def _case(kind: str, rows: int, inner: int, cols: int) -> Case:
    generator = torch.Generator().manual_seed(0)
    a, w = torch.randn(rows, inner, generator=generator), torch.randn(cols, inner, generator=generator)
    if kind == "float32":
        return _plain_case(a, w, torch.float32)
    if kind == "bfloat16":
        return _plain_case(a, w, torch.bfloat16)
    return _float8_case(a, w) if kind.startswith("float8") else _int8_case(a, w)


def _error(case: Case) -> float:
    with torch.no_grad():
        got = case.tpu().cpu().double()
    return float((got - case.exact).abs().max() / case.exact.abs().max())


def measure(kind: str, size: tuple[int, int, int], rounds: int) -> dict[str, float]:
    case = _case(kind, *size)
    last: list = [None]

    def keep(fn):
        def run():
            last[0] = fn()

        return run

    contenders = {
        "tpu": (keep(case.tpu), torch.tpu.synchronize),
        "torch cpu": (case.cpu, no_sync),
    }
    if case.jax is not None:
        contenders["jax.jit"] = (keep(case.jax), lambda: jax.block_until_ready(last[0]))
    with torch.no_grad():
        seconds = compare(contenders, calls=10, rounds=rounds)
    return {**seconds, "error": _error(case)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--markdown", action="store_true")
    _docs.add_flag(parser)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)  # (torchao's notes on its CUDA kernels)
    torch_tpu._initialize()
    header = ["size (m x k x n)", "product", "tpu ms", "torch cpu ms", "jax.jit ms", "tpu / cpu", "tpu / jit"]
    header.append("tpu error")
    with _docs.section("float8", args):
        _print_rows(header, args)


def _print_rows(header: list[str], args: argparse.Namespace) -> None:
    if args.markdown:
        print("| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
    for size in SIZES:
        for kind in KINDS:
            t = measure(kind, size, args.rounds)
            jit = t.get("jax.jit")
            cells = [
                "x".join(map(str, size)),
                kind,
                f"{t['tpu'] * 1e3:.3f}",
                f"{t['torch cpu'] * 1e3:.3f}",
                "-" if jit is None else f"{jit * 1e3:.3f}",
                f"{t['tpu'] / t['torch cpu']:.2f}x",
                "-" if jit is None else f"{t['tpu'] / jit:.2f}x",
                f"{t['error']:.1e}",
            ]
            print(("| " + " | ".join(cells) + " |") if args.markdown else "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
