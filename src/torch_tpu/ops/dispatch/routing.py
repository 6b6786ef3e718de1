"""Kernels of ops taking ``device=``: which tpu a call runs on, and calls for other devices."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...runtime import platform
from ...runtime.context import context
from ...runtime.flags import flags
from ..registry import qualified_name
from .binding import TENSOR, TENSOR_LIST, kind_of

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def routed_by_device(op: torch._ops.OpOverload, kernel: Callable, lowered: bool = True) -> Callable:
    """A kernel taking ``device=``: a tpu device this process does not drive is refused rather
    than served by ``tpu:0``; a factory runs for its device (``tpu:i``; plain ``tpu``: the
    current device), a tensor-taking one given none for its tensor's. A ``lowered``
    tensor-taking factory asked for another device (``zeros_like(t, device="cpu")``,
    ``t.new_ones(3, device="cpu")``) runs PyTorch's own composite kernel, which builds the result
    on that device, instead of the tpu lowering (runtime kernels, ``_to_copy``, handle other
    devices themselves)."""
    schema_args = op._schema.arguments
    names = [a.name for a in schema_args]
    if "device" not in names:
        return kernel
    position = names.index("device")
    composite = lowered and torch._C._dispatch_has_kernel_for_dispatch_key(
        qualified_name(op), "CompositeExplicitAutograd"
    )
    takes_tensor = any(kind_of(a) in (TENSOR, TENSOR_LIST) for a in schema_args)

    def routed(*args, **kwargs):
        device = args[position] if position < len(args) else kwargs.get("device")
        index = None  # (the driven device a "tpu:i" names; None: the current one)
        if device is not None:
            if device.type != "tpu":
                if composite:
                    return op.redispatch(_CPU_KEYS, *args, **kwargs)
            elif device.index is not None:
                index = platform.check_index(device.index)
                platform.use(index)
        if not flags.others_used:
            return kernel(*args, **kwargs)
        if device is not None and device.type == "tpu":
            index = current_device() if index is None else index
        else:  # (a tensor-taking one: its tensor's device)
            index = _first_index(args) if takes_tensor else current_device()
        return _on_device(kernel, index, takes_tensor and lowered, args, kwargs)

    return routed


def _on_device(kernel: Callable, index: int, moves_result: bool, args: tuple, kwargs: dict):
    """``kernel``'s call placed on ``tpu:index``; a result computed elsewhere (on its tensor's
    device) moved there where ``moves_result``."""
    if index == context.index:
        result = kernel(*args, **kwargs)
    else:
        with platform.placing(index):
            result = kernel(*args, **kwargs)
    if moves_result and result.get_device() != index:
        result = result.to(torch.device("tpu", index))
    return result


def _first_index(args: tuple) -> int:
    for x in args:
        if isinstance(x, torch.Tensor) and not x.is_cpu:
            return max(x.get_device(), 0)
    return current_device()


def current_device() -> int:
    """The calling thread's current tpu index (the device guard's)."""
    return torch.accelerator.current_device_index()
