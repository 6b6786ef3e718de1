"""No leaks: device buffers die with the last tensor that uses them."""

from __future__ import annotations

import gc

import jax
import torch


def _live_buffers() -> int:
    gc.collect()
    return len(jax.live_arrays())


def test_ten_thousand_ops_keep_live_buffers_bounded():
    x = torch.randn(32, device="tpu")
    w = torch.randn(32, device="tpu", requires_grad=True)
    for _ in range(50):  # warm up caches (scalar constants, compiled ops)
        x = (x * 0.5 + w).tanh().detach()
    baseline = _live_buffers()
    for _ in range(2500):  # 4 ops per step
        x = (x * 0.5 + w).tanh().detach()
    assert _live_buffers() <= baseline + 8


def test_views_and_inplace_writes_do_not_leak():
    base = torch.zeros(16, 16, device="tpu")

    def writes(count: int) -> None:
        for i in range(count):
            base[i % 16].add_(1)
            base.t()[3].mul_(1.0)

    writes(16)  # the view offsets' device scalars are cached from the first round on
    baseline = _live_buffers()
    writes(500)
    assert _live_buffers() <= baseline + 8
    assert base.sum().item() == 516 * 16


def test_autograd_graphs_are_freed():
    w = torch.randn(8, 8, device="tpu", requires_grad=True)
    for _ in range(5):
        (w @ w).sum().backward()
    baseline = _live_buffers()
    for _ in range(200):
        w.grad = None
        (w @ w).relu().sum().backward()
    assert _live_buffers() <= baseline + 8
