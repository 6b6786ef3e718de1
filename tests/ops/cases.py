"""Shared pieces of the direct overload tests: seeded inputs, and the two CPU comparisons
(a call built for a device, and a gradient through a function)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def seeded(*shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    """A standard-normal CPU tensor, the same for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(dtype)


def _host(value: Any) -> Any:
    return value.cpu() if isinstance(value, torch.Tensor) else value


def assert_build_matches_cpu(build: Callable[[str], Any], **tolerance) -> None:
    """``build(device)`` gives the same result (tensors, tuples, numbers) on tpu as on CPU."""
    expected = build("cpu")
    actual = torch.utils._pytree.tree_map(_host, build("tpu"))
    torch.testing.assert_close(actual, expected, equal_nan=True, **tolerance)


def assert_gradient_matches_cpu(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """The gradient of ``fn`` at ``x`` under a fixed non-uniform cotangent matches CPU's."""
    grads = []
    for device in ("cpu", "tpu"):
        leaf = x.to(device).requires_grad_()
        out = fn(leaf)
        cotangent = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device)
        (grad,) = torch.autograd.grad(out, leaf, cotangent)
        grads.append(grad.cpu())
    torch.testing.assert_close(grads[1], grads[0])
