"""``Module.to("tpu")`` keeps parameters that modules share shared, as ``.to("cuda")`` does.

PyTorch moves parameters in place (``param.data = moved``) only between devices it treats as
shallow-copy compatible with CPU, a list PrivateUse1 is not on; otherwise ``Module._apply`` makes
a new Parameter per module, which silently unties tied weights (GPT's embedding and LM head) and
leaves an optimizer built before the move holding stale tensors. For conversions that cross the
tpu boundary we switch ``Module._apply`` to its swap path (``torch.utils.swap_tensors``), which
keeps every Parameter object, and so every tie and outside reference, intact.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
from torch import nn


def _holds_tpu_tensors(module: nn.Module) -> bool:
    return any(t.device.type == "tpu" for t in module.parameters()) or any(
        t.device.type == "tpu" for t in module.buffers()
    )


@contextlib.contextmanager
def _swapping_parameters():
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(previous)


def _crosses_tpu(module: nn.Module, target: torch.device | None) -> bool:
    if target is None:
        return False
    return target.type == "tpu" or (target.type != "tpu" and _holds_tpu_tensors(module))


def _patch(name: str, target_of: Callable) -> None:
    original = getattr(nn.Module, name)

    @functools.wraps(original)
    def convert(self, *args, **kwargs):
        if _crosses_tpu(self, target_of(*args, **kwargs)):
            with _swapping_parameters():
                return original(self, *args, **kwargs)
        return original(self, *args, **kwargs)

    setattr(nn.Module, name, convert)


def _device_of_to(*args, **kwargs) -> torch.device | None:
    return torch._C._nn._parse_to(*args, **kwargs)[0]


def install() -> None:
    _patch("to", _device_of_to)
    _patch("cpu", lambda *args, **kwargs: torch.device("cpu"))
    _patch("tpu", lambda *args, **kwargs: torch.device("tpu"))
