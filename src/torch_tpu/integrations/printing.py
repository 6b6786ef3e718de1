"""Printing a tpu tensor formats a host copy of it, as PyTorch does for XLA, lazy, IPU and MTIA
tensors (``torch._tensor_str._str_intern`` names those devices; a PrivateUse1 backend cannot
join the list). The formatter runs a dozen ops on the tensor it prints (``masked_select``,
``abs``, ``max``, ``ceil``... of it reshaped, or of its summarized corners): on the device each
would compile a program for the tensor's shape, about 20 for every new shape printed.
"""

from __future__ import annotations

import functools

import torch
import torch._tensor_str as _printing


def install() -> None:
    """Format tpu tensors' contents on the host (the device and dtype suffixes are still read
    from the tpu tensor).

    Example::

        >>> print(torch.arange(3, device="tpu"))
        tensor([0, 1, 2], device='tpu:0')
    """
    contents = _printing._tensor_str
    if getattr(contents, "formats_tpu_on_host", False):
        return

    @functools.wraps(contents)
    def _tensor_str(self: torch.Tensor, indent: int) -> str:
        if self.device.type == "tpu":
            self = self.to("cpu")
        return contents(self, indent)

    _tensor_str.formats_tpu_on_host = True
    _printing._tensor_str = _tensor_str
