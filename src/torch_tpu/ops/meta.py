"""Meta replays: an op's PyTorch meta kernel run on stand-ins of a tpu call's arguments, to learn
what PyTorch would return (shapes, dtypes, strides) or raise, without computing anything.

Used by :mod:`.layout` (output strides) and :mod:`.meta_check` (``TORCH_TPU_CHECK_META``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["META", "call_quietly", "to_meta"]

META = torch.device("meta")

#: Messages of meta kernels that cannot say what an op returns without the values (a boolean
#: mask's coordinates, ``repeat_interleave``'s total): no argument check of PyTorch's.
NEEDS_VALUES_MESSAGES = ("register_meta function for torch.nonzero", "a meta tensor without output_size")


def to_meta(x: Any, *, tpu_only: bool = False) -> Any:
    """A meta stand-in for a kernel argument: tensors keep shape, strides and dtype (CPU scalars
    stay: they join any device's op, and some arguments must be one, like ``randint_like``'s
    ``high``); devices become meta, so factories build meta tensors; generators are dropped;
    lists, tuples and dicts are converted item by item. ``tpu_only``: only tpu tensors and
    devices become meta, the rest stays as the caller passed it (replaying a call for PyTorch's
    error: a CPU tensor among tpu ones is the mismatch it names)."""
    if isinstance(x, torch.Tensor):
        if x.device.type != "tpu" and (tpu_only or (x.is_cpu and x.dim() == 0)):
            return x
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=META)
    if isinstance(x, (list, tuple)):
        return type(x)(to_meta(v, tpu_only=tpu_only) for v in x)
    if isinstance(x, dict):
        return {k: to_meta(v, tpu_only=tpu_only) for k, v in x.items()}
    if isinstance(x, torch.device):
        return x if tpu_only and x.type != "tpu" else META
    if isinstance(x, torch.Generator):
        return x if tpu_only else None
    return x


def call_quietly(op: Any, args: tuple, kwargs: dict) -> tuple[Any, Exception | None]:
    """``(op(*args, **kwargs), None)``, or ``(None, the exception it raised)``; warnings the
    call gives are dropped (the tpu kernel gives them, once)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return op(*args, **kwargs), None
        except Exception as error:  # noqa: BLE001  (whatever PyTorch raises is the reference)
            return None, error
