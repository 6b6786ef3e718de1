"""``Module.to("tpu")`` and ``.cpu()`` move parameters in place (``param.data = moved``), as
``.to("cuda")`` does.

``Module._apply`` and ``Tensor.data = ...`` move a tensor in place only when
``aten::_has_compatible_shallow_copy_type`` says its TensorImpl may take the other's metadata.
PyTorch's own rule lists the dense backends it knows (CPU, CUDA, MPS, HIP, XPU, HPU, MTIA) and
leaves PrivateUse1 to the backend's kernel for the op. Without one, ``_apply`` makes a new
Parameter per module, which unties tied weights and leaves an optimizer holding stale tensors;
forcing ``torch.utils.swap_tensors`` instead keeps the objects but refuses while a live autograd
graph holds a parameter (a forward whose output is still alive). A tpu tensor is a plain dense
TensorImpl, so it joins the dense backends here and every move takes CUDA's path: same
Parameter objects (ties, optimizers, outside references kept), ``.grad`` moved with them, and a
live graph left as CUDA leaves it.
"""

from __future__ import annotations

import torch

# TensorImpl::has_compatible_shallow_copy_type's dense backends, plus tpu
_DENSE_BACKENDS = frozenset({"cpu", "cuda", "mps", "hip", "xpu", "hpu", "mtia", "tpu"})
_library: torch.library.Library | None = None


def _is_dense(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and not t.is_quantized and t.device.type in _DENSE_BACKENDS


def _has_compatible_shallow_copy_type(self: torch.Tensor, src: torch.Tensor) -> bool:
    """Called when either tensor is on tpu; PyTorch's rule (same dispatch keys, or both dense)."""
    same_keys = torch._C._dispatch_keys(self) == torch._C._dispatch_keys(src)
    return same_keys or (_is_dense(self) and _is_dense(src))


def install() -> None:
    global _library
    _library = torch.library.Library("aten", "IMPL")
    _library.impl("_has_compatible_shallow_copy_type", _has_compatible_shallow_copy_type, "PrivateUse1")
