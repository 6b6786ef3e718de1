"""Shape lowerings: concatenation, flips and rolls, padding, triangles, copies of views.

Ops PyTorch already builds from views and copies (``stack``, ``tile``,
``diag_embed``, ``clone``, ``expand``...) reach the tpu through its composite kernels and are
not lowered here; only what PyTorch implements per backend is.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .._registry import lower
from ._helpers import result_dtype

aten = torch.ops.aten


def _is_legacy_empty(x: jax.Array) -> bool:
    """``torch.cat`` skips 1-D empty tensors whatever the other inputs' shapes (legacy behaviour)."""
    return x.ndim == 1 and x.shape[0] == 0


@lower(aten.cat.default)
def cat(tensors, dim=0):
    dtype = result_dtype(*(x.dtype for x in tensors))
    kept = [x.astype(dtype) for x in tensors if not _is_legacy_empty(x)]
    if not kept:
        return jnp.zeros((0,), dtype)
    return jnp.concatenate(kept, axis=dim)


@lower(aten.flip.default)
def flip(x, dims):
    return jnp.flip(x, axis=dims)


@lower(aten.repeat.default)
def repeat(x, repeats):
    return jnp.tile(x, repeats)


@lower(aten.rot90.default)
def rot90(x, k=1, dims=(0, 1)):
    return jnp.rot90(x, k, axes=dims)


@lower(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:  # torch rolls the flattened tensor
        return jnp.roll(x.reshape(-1), shifts).reshape(x.shape)
    return jnp.roll(x, shifts, axis=dims)


@lower(aten.narrow_copy.default)
def narrow_copy(x, dim, start, length):
    start = start + x.shape[dim] if start < 0 else start
    return lax.slice_in_dim(x, start, start + length, axis=dim)


@lower(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lower(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lower(aten.repeat_interleave.Tensor, jit=False)
def repeat_interleave(repeats, output_size=None):
    """Indices ``i`` repeated ``repeats[i]`` times (the output length needs the values)."""
    if repeats.ndim == 0:
        repeats = repeats.reshape(1)
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=repeats.dtype), repeats,
                      total_repeat_length=output_size)


# ----------------------------------------------------------------------------- padding
def _pad_widths(ndim: int, padding) -> list[tuple[int, int]]:
    """torch's ``pad`` list (last dimension first, ``(before, after)`` pairs) as per-dim widths."""
    pairs = [(padding[i], padding[i + 1]) for i in range(0, len(padding), 2)]
    return [(0, 0)] * (ndim - len(pairs)) + pairs[::-1]


@lower(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    config = [(lo, hi, 0) for lo, hi in _pad_widths(x.ndim, pad)]  # negative widths crop
    return lax.pad(x, jnp.asarray(value, x.dtype), config)


def _padding_family(mode: str, forward_ops, backward_ops) -> None:
    """``<mode>_pad{1,2,3}d`` and their backward ops (the VJP of the forward pad)."""
    def pad(x, padding):
        widths = _pad_widths(x.ndim, padding)
        padded = jnp.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi in widths], mode=mode)
        crop = [(min(lo, 0), min(hi, 0), 0) for lo, hi in widths]  # torch crops on negatives
        return lax.pad(padded, jnp.zeros((), x.dtype), crop)

    def pad_backward(grad_output, x, padding):
        _, vjp = jax.vjp(lambda value: pad(value, padding), x)
        return vjp(grad_output.astype(x.dtype))[0]

    lower(*forward_ops)(pad)
    lower(*backward_ops)(pad_backward)


_padding_family("reflect",
                (aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d),
                (aten.reflection_pad1d_backward, aten.reflection_pad2d_backward,
                 aten.reflection_pad3d_backward))
_padding_family("edge",
                (aten.replication_pad1d, aten.replication_pad2d, aten.replication_pad3d),
                (aten.replication_pad1d_backward, aten.replication_pad2d_backward,
                 aten.replication_pad3d_backward))


# ----------------------------------------------------------------------------- view scatters
@lower(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    key = (slice(None),) * (dim % x.ndim) + (slice(start, end, step),)
    return x.at[key].set(src.astype(x.dtype))


@lower(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    key = (slice(None),) * (dim % x.ndim) + (index,)
    return x.at[key].set(src.astype(x.dtype))
