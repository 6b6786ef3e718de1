"""``use_flash_attention``: ``F.scaled_dot_product_attention`` on tpu through the flash kernel.

Without the switch, tpu's SDPA is one fused XLA kernel (``ops/nn.py``, chosen through PyTorch's
``_fused_sdp_choice_stub``, which the C++ core registers). The switch registers a kernel of
``aten::scaled_dot_product_attention`` itself for tpu (on the autograd key, and the plain one
for inference mode) while it is on: calls the flash kernel covers go to
:func:`torch_tpu.kernels.flash_attention`, with its own backward; every other call runs
PyTorch's composite (and so the fused XLA kernel) exactly as without the switch. Off, nothing
is registered."""

from __future__ import annotations

import torch

from ..runtime import platform

#: Route on every platform, not only TPUs (tests: the kernels then run interpreted).
_force = False
_library: torch.library.Library | None = None


def enabled() -> bool:
    """Whether the switch is on."""
    return _library is not None


def _routed(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> bool:
    """Whether the flash kernel computes this call as PyTorch would: on a TPU, 4-D
    ``[B, H, L, D]`` operands of one floating dtype, no dropout, key/value heads equal (or
    dividing the query heads with ``enable_gqa``), a boolean mask or one of the queries' dtype
    broadcastable to the scores, not with ``is_causal`` (which PyTorch refuses: its composite
    raises that error)."""
    if not (_force or platform.platform() == "tpu") or dropout_p != 0:
        return False
    if not (query.dim() == key.dim() == value.dim() == 4 and query.dtype == key.dtype == value.dtype):
        return False
    batch, heads, length, dim = query.shape
    if not query.is_floating_point() or key.shape != value.shape or key.shape[::3] != (batch, dim):
        return False
    if key.shape[1] != heads and not (enable_gqa and heads % key.shape[1] == 0):
        return False
    if attn_mask is None:
        return True
    if is_causal or attn_mask.dim() > 4 or attn_mask.dtype not in (torch.bool, query.dtype):
        return False
    scores = (batch, heads, length, key.shape[2])
    try:
        return torch.broadcast_shapes(attn_mask.shape, scores) == scores
    except RuntimeError:
        return False


def _scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    if _routed(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        from . import flash_attention

        return flash_attention(query, key, value, causal=is_causal, mask=attn_mask, scale=scale)
    return torch.ops.aten.scaled_dot_product_attention.default.decompose(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )


def _set(on: bool) -> None:
    global _library
    if on and _library is None:
        library = torch.library.Library("aten", "IMPL")
        for key in ("AutogradPrivateUse1", "PrivateUse1"):
            library.impl("scaled_dot_product_attention", _scaled_dot_product_attention, key)
        _library = library
    elif not on and _library is not None:
        _library._destroy()
        _library = None


class use_flash_attention:
    """Route ``F.scaled_dot_product_attention`` on tpu to the flash kernel
    (:func:`torch_tpu.kernels.flash_attention`, forward and backward) on a TPU, for the calls it
    covers (4-D, no dropout, a boolean or additive mask or ``is_causal``); the others keep
    PyTorch's math path. On other platforms the switch is accepted and every call keeps the math
    path (the kernel would only run interpreted). ``use_flash_attention(False)`` turns it off.

    A call sets it for the process; as a context manager it is restored on exit::

        with torch_tpu.kernels.use_flash_attention():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)

    ``TORCH_TPU_FLASH_ATTENTION=1`` turns it on when the device starts. ``torch.compile`` reads
    the switch when it traces a graph."""

    def __init__(self, enabled: bool = True):
        self._previous = _library is not None
        _set(enabled)

    def __enter__(self) -> use_flash_attention:
        return self

    def __exit__(self, *exc) -> None:
        _set(self._previous)
