"""Helion kernels (``HELION_BACKEND=pallas``) on tpu tensors, through upstream TorchTPU's
``_internal.pallas`` API: compiled on a TPU, in Pallas' TPU interpret mode elsewhere. Each
kernel has one fixed config (no autotuning) and small shapes."""

from __future__ import annotations

import os

import pytest
import torch

from torch_tpu.testing.reference import assert_matches_cpu

os.environ.setdefault("HELION_BACKEND", "pallas")
os.environ.setdefault("HELION_TPU_COMPILE_CAPTURE", "1")  # (read when helion is imported)
helion = pytest.importorskip("helion")
hl = pytest.importorskip("helion.language")

pytestmark = pytest.mark.skipif(
    os.environ["HELION_BACKEND"] != "pallas" or os.environ.get("HELION_PALLAS_INTERPRET"),
    reason="needs Helion's Pallas backend launching through torch_tpu",
)


@helion.kernel(config=helion.Config(block_sizes=[8, 128]), static_shapes=True)
def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    for tile in hl.tile(out.size()):
        out[tile] = x[tile] + y[tile]
    return out


@helion.kernel(config=helion.Config(block_sizes=[8]), static_shapes=True)
def softmax(x: torch.Tensor) -> torch.Tensor:
    n, _ = x.size()
    out = torch.empty_like(x)
    for tile_n in hl.tile(n):
        out[tile_n, :] = torch.nn.functional.softmax(x[tile_n, :], dim=1)
    return out


@helion.kernel(config=helion.Config(block_sizes=[16, 128, 128]), static_shapes=True)
def matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    m, k = x.size()
    _, n = y.size()
    out = torch.empty([m, n], dtype=x.dtype, device=x.device)
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, x[tile_m, tile_k], y[tile_k, tile_n])
        out[tile_m, tile_n] = acc
    return out


def _inputs(*shapes):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in shapes]


def test_elementwise_add():
    x, y = _inputs((16, 256), (16, 256))
    got = add(x.to("tpu"), y.to("tpu"))
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), x + y)


def test_softmax():
    (x,) = _inputs((16, 128))
    assert_matches_cpu(softmax(x.to("tpu")), torch.softmax(x, dim=1), torch.softmax(x.double(), dim=1))


def test_matmul():
    x, y = _inputs((32, 256), (256, 128))
    # (the kernel sums K in two tiles, CPU's sgemm in its own blocks: rounding apart by a
    # multiple of CPU's own distance from the float64 product)
    assert_matches_cpu(matmul(x.to("tpu"), y.to("tpu")), x @ y, x.double() @ y.double())


def test_compiled_function_calling_a_kernel():
    x, y = _inputs((16, 256), (16, 256))
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: add(a, b).relu() * 2, backend="tpu", fullgraph=True)
    torch.testing.assert_close(compiled(x.to("tpu"), y.to("tpu")).cpu(), (x + y).relu() * 2)
