"""The ATen ops a block of code dispatches, as PyTorch counts ops (views included)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpsSeen(TorchDispatchMode):
    """Lists every ATen op (an ``OpOverload``) dispatched inside the block, in order, and runs
    it. A dispatch mode sees the calls the C++ core serves too (the core defers to it).

    >>> import torch, torch_tpu
    >>> from torch_tpu.testing.ops_seen import OpsSeen
    >>> with OpsSeen() as seen:
    ...     _ = torch.ones(2, device="tpu") + 1
    >>> [op.__name__ for op in seen.ops]
    ['ones.default', 'add.Tensor']
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[torch._ops.OpOverload] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None) -> Any:
        self.ops.append(func)
        return func(*args, **(kwargs or {}))
