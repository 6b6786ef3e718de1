"""Shape lowerings: concatenation and stacking, flips and rolls, padding, triangles, copies of
views, view gradients and scatters, image layouts (pixel/channel shuffles, im2col/col2im) and
the unchecked indexing ops decompositions emit.

Views stay PyTorch's own Meta kernels (ops/core.py); ops PyTorch builds from views and copies
(``tile``, ``clone``, ``expand``...) reach the tpu through its composite kernels. Composite ops
whose decomposition is a chain of copies (``stack``, ``diag_embed``, the ``*_backward`` of
views) are lowered here as one XLA computation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..runtime import tensor
from ..runtime.context import context
from . import indexing
from ._helpers import check_number_fits, converted, result_dtype
from ._nn_helpers import wrap_dim
from .padding import CAT, CONSTANT_PAD, SELECT_BACKWARD, SLICE_BACKWARD, TRIANGLE
from .registry import Layout, Runs, lower

aten = torch.ops.aten


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(message)


def _is_legacy_empty(x: jax.Array) -> bool:
    """``torch.cat`` skips 1-D empty tensors whatever the other inputs' shapes (legacy behaviour)."""
    return x.ndim == 1 and x.shape[0] == 0


#: an append adds at most this share of the sequence it extends (more is an ordinary cat), or
#: one element whatever its length (a token a step after a short prompt)
_APPEND_SHARE = 1 / 8


def _cat_as_append(tensors, dim=0) -> torch.Tensor | None:
    """``torch.cat([sequence, new])`` where ``new`` extends a contiguous ``sequence`` in memory
    (all dims before ``dim`` have size 1: generation's ids and attention mask growing a token a
    step), run as :func:`torch_tpu.runtime.tensor.append`: one storage shape and one executable
    for every length up to the storage's room. None for every other cat."""
    if len(tensors) < 2 or context.trace is not None:
        return None
    head = tensors[0]
    if not (tensor.is_tpu(head) and head.dim() and head.storage_offset() == 0 and head.is_contiguous()):
        return None
    dim = dim + head.dim() if dim < 0 else dim
    if not 0 <= dim < head.dim() or math.prod(head.shape[:dim]) != 1 or head.is_complex():
        return None
    shape, added = list(head.shape), 0
    for t in tensors[1:]:
        if not (
            tensor.is_tpu(t)
            and t.dtype == head.dtype
            and t.dim() == head.dim()
            and t.shape[:dim] == head.shape[:dim]
            and t.shape[dim + 1 :] == head.shape[dim + 1 :]
        ):
            return None
        shape[dim] += t.shape[dim]
        added += t.numel()
    if not 0 < added <= max(_APPEND_SHARE * head.numel(), 1):
        return None
    return tensor.append(head, list(tensors[1:]), shape)


@lower(aten.cat.default, layout=Layout.META, shortcut=_cat_as_append, pad=CAT)
def cat(tensors, dim=0):
    for position, x in enumerate(tensors):
        _require(x.ndim > 0, f"zero-dimensional tensor (at position {position}) cannot be concatenated")
    dtype = result_dtype(*(x.dtype for x in tensors))
    kept = [x.astype(dtype) for x in tensors if not _is_legacy_empty(x)]
    for x in kept[1:]:
        _require(
            x.ndim == kept[0].ndim,
            f"Tensors must have same number of dimensions: got {kept[0].ndim} and {x.ndim}",
        )
    if not kept:
        return jnp.zeros((0,), dtype)
    return jnp.concatenate(kept, axis=dim)


def _flip_canonically(x, dims):
    """``x.flip(dims)`` as the flip of the same elements along its canonical dims (wrapped,
    sorted, those of size 1 dropped), so that ``flip((0, 1))``, ``flip((1, 0))`` and
    ``flip((-2, 1))`` share one program; None where ``dims`` already are. Bad dims raise CPU's
    errors."""
    ndim, bound = x.dim(), max(x.dim(), 1)  # (a 0-d tensor takes dim 0 or -1, as on CPU)
    for d in dims:
        if not -bound <= d < bound:
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], but got {d})"
            )
    wrapped = [d + bound if d < 0 else d for d in dims]
    for i, d in enumerate(wrapped):
        _require(d not in wrapped[:i], f"dim {d} appears multiple times in the list of dims")
    canonical = [d for d in sorted(wrapped) if ndim and x.shape[d] > 1]
    return None if canonical == list(dims) else aten.flip.default(x, canonical)


@lower(aten.flip.default, shortcut=_flip_canonically)
def flip(x, dims):
    axes = [wrap_dim(d, x.ndim) for d in dims]  # a 0-d tensor takes dim 0 or -1, as on CPU
    return jnp.flip(x, axis=axes) if x.ndim else x


@lower(aten.repeat.default)
def repeat(x, repeats):
    return jnp.tile(x, repeats)


@lower(aten.rot90.default, layout=Layout.META)
def rot90(x, k=1, dims=(0, 1)):
    return jnp.rot90(x, k, axes=dims)


@lower(aten.roll.default)
def roll(x, shifts, dims=()):
    _require(len(shifts) > 0, "`shifts` required")
    _require(
        len(shifts) == len(dims) or (len(shifts) == 1 and not dims),
        f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}",
    )
    if not dims:  # torch rolls the flattened tensor
        return jnp.roll(x.reshape(-1), shifts).reshape(x.shape)
    return jnp.roll(x, shifts, axis=dims)


@lower(aten.narrow_copy.default)
def narrow_copy(x, dim, start, length):
    _require(x.ndim > 0, "narrow() cannot be applied to a 0-dim tensor.")
    dim = wrap_dim(dim, x.ndim)
    size = x.shape[dim]
    if not -size <= start <= size:
        raise IndexError(
            f"start out of range (expected to be in range of [{-size}, {size}], but got {start})"
        )
    start = start + size if start < 0 else start
    _require(length >= 0, "narrow(): length must be non-negative.")
    _require(length <= size - start, f"start ({start}) + length ({length}) exceeds dimension size ({size}).")
    return lax.slice_in_dim(x, start, start + length, axis=dim)


@lower(aten.tril.default, pad=TRIANGLE)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lower(aten.triu.default, pad=TRIANGLE)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lower(aten.repeat_interleave.Tensor, runs=Runs.HOST)
def repeat_interleave(repeats, output_size=None):
    """Indices ``i`` repeated ``repeats[i]`` times (the output length needs the values)."""
    if repeats.ndim == 0:
        repeats = repeats.reshape(1)
    return jnp.repeat(
        jnp.arange(repeats.shape[0], dtype=repeats.dtype), repeats, total_repeat_length=output_size
    )


# ----------------------------------------------------------------------------- padding
def _pad_widths(ndim: int, padding) -> list[tuple[int, int]]:
    """torch's ``pad`` list (last dimension first, ``(before, after)`` pairs) as per-dim widths."""
    pairs = [(padding[i], padding[i + 1]) for i in range(0, len(padding), 2)]
    return [(0, 0)] * (ndim - len(pairs)) + pairs[::-1]


def _check_pad_value(x, pad, value=0):
    """CPU fills the padded result with ``value``: one its dtype cannot hold is refused (the
    check reads shapes only: the padding rule keeps serving, ``CONSTANT_PAD.check_fills``)."""
    widths = _pad_widths(x.ndim, pad)
    check_number_fits(value, x.dtype, math.prod(max(n + lo + hi, 0) for n, (lo, hi) in zip(x.shape, widths)))


@lower(aten.constant_pad_nd.default, layout=Layout.META, pad=CONSTANT_PAD, check=_check_pad_value)
def constant_pad_nd(x, pad, value=0):
    config = [(lo, hi, 0) for lo, hi in _pad_widths(x.ndim, pad)]  # negative widths crop
    return lax.pad(x, converted(value, x.dtype), config)


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

    lower(*forward_ops, layout=Layout.SUGGESTED)(pad)  # CPU keeps channels-last, meta does not
    lower(*backward_ops, layout=Layout.SUGGESTED)(pad_backward)


_padding_family(
    "reflect",
    (aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d),
    (aten.reflection_pad1d_backward, aten.reflection_pad2d_backward, aten.reflection_pad3d_backward),
)
_padding_family(
    "edge",
    (aten.replication_pad1d, aten.replication_pad2d, aten.replication_pad3d),
    (aten.replication_pad1d_backward, aten.replication_pad2d_backward, aten.replication_pad3d_backward),
)


# ----------------------------------------------------------------------------- view scatters
@lower(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    key = (slice(None),) * (dim % x.ndim) + (slice(start, end, step),)
    return x.at[key].set(src.astype(x.dtype))


@lower(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    key = (slice(None),) * (dim % x.ndim) + (index,)
    return x.at[key].set(src.astype(x.dtype))


def _zeros_scattered(scatter: Callable, grad_output, input_sizes, *where) -> jax.Array:
    """The gradient of a view: ``grad_output`` written into zeros of the viewed tensor's shape."""
    return scatter(jnp.zeros(input_sizes, grad_output.dtype), grad_output, *where)


@lower(aten.slice_backward.default, pad=SLICE_BACKWARD)
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    d = dim % len(input_sizes)
    # (the slice's extent: the gradient's own, or its padded one cut to what the slice holds)
    extent = len(range(*slice(start, end, step).indices(input_sizes[d])))
    grad = lax.slice_in_dim(grad_output, 0, extent, axis=d)
    return _zeros_scattered(slice_scatter, grad, input_sizes, dim, start, end, step)


@lower(aten.select_backward.default, pad=SELECT_BACKWARD)
def select_backward(grad_output, input_sizes, dim, index):
    return _zeros_scattered(select_scatter, grad_output, input_sizes, dim, index)


@lower(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    """``src`` written on the diagonal ``x.diagonal(offset, dim1, dim2)`` (last dim of ``src``)."""
    dim1, dim2 = dim1 % x.ndim, dim2 % x.ndim
    steps = jnp.arange(src.shape[-1])
    moved = jnp.moveaxis(x, (dim1, dim2), (-2, -1))
    moved = moved.at[..., steps + max(-offset, 0), steps + max(offset, 0)].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (dim1, dim2))


@lower(aten.diagonal_backward.default)
def diagonal_backward(grad_output, input_sizes, offset, dim1, dim2):
    return _zeros_scattered(diagonal_scatter, grad_output, input_sizes, offset, dim1, dim2)


@lower(aten.diag_embed.default)
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    """A tensor with one more dim whose (dim1, dim2) diagonals hold ``x``'s last dim."""
    ndim = x.ndim + 1
    dim1, dim2 = wrap_dim(dim1, ndim), wrap_dim(dim2, ndim)
    _require(dim1 != dim2, f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    side = x.shape[-1] + abs(offset)
    others = iter(x.shape[:-1])
    shape = [side if d in (dim1, dim2) else next(others) for d in range(ndim)]
    return diagonal_scatter(jnp.zeros(shape, x.dtype), x, offset, dim1, dim2)


@lower(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    """``src`` written where ``as_strided(size, stride, storage_offset)`` of a contiguous copy
    of ``x`` points."""
    offset, itemsize = storage_offset or 0, x.dtype.itemsize
    needed = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1 if all(size) else 0
    _require(
        needed <= x.size,
        f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and itemsize "
        f"{itemsize} requiring a storage size of {needed * itemsize} are out of bounds for storage of size "
        f"{x.size * itemsize}",
    )
    position = np.full(size, offset, np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        position = position + (np.arange(n) * s).reshape((n,) + (1,) * (len(size) - d - 1))
    return x.reshape(-1).at[position].set(src.astype(x.dtype)).reshape(x.shape)


@lower(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad_output, mask, sizes):
    """``grad_output[mask]`` packed at the front of a zero tensor of ``sizes``."""
    mask = jnp.broadcast_to(mask, grad_output.shape).reshape(-1)
    total = math.prod(sizes)
    target = jnp.where(mask, jnp.cumsum(mask) - 1, total)  # total: dropped
    packed = jnp.zeros(total, grad_output.dtype).at[target].set(grad_output.reshape(-1), mode="drop")
    return packed.reshape(sizes)


# ----------------------------------------------------------------------------- stacking
@lower(aten.stack.default)
def stack(tensors, dim=0):
    _require(len(tensors) > 0, "stack expects a non-empty TensorList")
    for entry, x in enumerate(tensors):
        _require(
            x.shape == tensors[0].shape,
            f"stack expects each tensor to be equal size, but got {list(tensors[0].shape)} "
            f"at entry 0 and {list(x.shape)} at entry {entry}",
        )
    dtype = result_dtype(*(x.dtype for x in tensors))
    return jnp.stack([x.astype(dtype) for x in tensors], axis=dim)


@lower(aten._chunk_cat.default)
def chunk_cat(tensors, dim, num_chunks):
    """Each tensor split into ``num_chunks`` chunks along ``dim`` (zero-padded to equal sizes),
    flattened from ``dim`` on, and the chunks concatenated: (*leading, num_chunks, total)."""
    _require(
        all(x.dtype == tensors[0].dtype for x in tensors),
        "_chunk_cat expects all input tensors with the same dtype",
    )
    _require(all(x.size for x in tensors), "_chunk_cat expects non-empty tensor")
    _require(num_chunks >= 1, "_chunk_cat expects positive num_chunks")
    _require(
        dim >= 0 or all(x.ndim == tensors[0].ndim for x in tensors),
        "_chunk_cat expects non-negative dim when input tensors have different ndims",
    )
    dim = wrap_dim(dim, tensors[0].ndim)
    _require(all(dim < x.ndim for x in tensors), "_chunk_cat expects dim < ndim for all input tensors")

    def chunks(x):
        size = x.shape[dim]
        padding = [(0, 0)] * x.ndim
        padding[dim] = (0, -size % num_chunks)
        chunk = (size + padding[dim][1]) // num_chunks * math.prod(x.shape[dim + 1 :])
        return jnp.pad(x, padding).reshape(*x.shape[:dim], num_chunks, chunk)

    return jnp.concatenate([chunks(x) for x in tensors], axis=dim + 1)


# ----------------------------------------------------------------------------- image layouts
@lower(aten.pixel_shuffle.default, layout=Layout.SUGGESTED)
def pixel_shuffle(x, upscale_factor):
    """(*, C*r*r, H, W) -> (*, C, H*r, W*r)."""
    r, lead = upscale_factor, x.shape[:-3]
    channels, height, width = x.shape[-3:]
    n = len(lead)
    blocks = x.reshape(*lead, channels // (r * r), r, r, height, width)
    return blocks.transpose(*range(n), n, n + 3, n + 1, n + 4, n + 2).reshape(
        *lead, channels // (r * r), height * r, width * r
    )


@lower(aten.pixel_unshuffle.default, layout=Layout.META)
def pixel_unshuffle(x, downscale_factor):
    """(*, C, H*r, W*r) -> (*, C*r*r, H, W)."""
    r, lead = downscale_factor, x.shape[:-3]
    channels, height, width = x.shape[-3:]
    n = len(lead)
    blocks = x.reshape(*lead, channels, height // r, r, width // r, r)
    return blocks.transpose(*range(n), n, n + 2, n + 4, n + 1, n + 3).reshape(
        *lead, channels * r * r, height // r, width // r
    )


@lower(aten.channel_shuffle.default)
def channel_shuffle(x, groups):
    """(N, g*k, *) -> (N, k*g, *): channel ``i*k + j`` moves to ``j*g + i``."""
    batch, channels, *rest = x.shape
    return jnp.swapaxes(x.reshape(batch, groups, channels // groups, *rest), 1, 2).reshape(x.shape)


def _patch_grid(size, kernel, dilation, padding, stride) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _patch_slices(blocks, kernel_size, dilation, stride):
    """For each kernel tap (row-major), the strided window of the padded image it reads."""
    for taps in itertools.product(*(range(k) for k in kernel_size)):
        yield (Ellipsis,) + tuple(
            slice(t * d, t * d + s * (n - 1) + 1, s) for t, d, s, n in zip(taps, dilation, stride, blocks)
        )


@lower(aten.im2col.default)
def im2col(x, kernel_size, dilation, padding, stride):
    """(N, C, H, W) -> (N, C*kh*kw, L): every sliding block's values as a column."""
    blocks = [
        _patch_grid(n, *args) for n, args in zip(x.shape[-2:], zip(kernel_size, dilation, padding, stride))
    ]
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(p, p) for p in padding])
    columns = jnp.stack(
        [padded[key] for key in _patch_slices(blocks, kernel_size, dilation, stride)], axis=-3
    )
    return columns.reshape(*x.shape[:-3], x.shape[-3] * math.prod(kernel_size), math.prod(blocks))


@lower(aten.col2im.default)
def col2im(x, output_size, kernel_size, dilation, padding, stride):
    """The adjoint of im2col: each column's values added back where its block was read, tap by
    tap in CPU's order and dtype (so overlapping sums round as CPU's do)."""
    blocks = [
        _patch_grid(n, *args) for n, args in zip(output_size, zip(kernel_size, dilation, padding, stride))
    ]
    lead = x.shape[:-2]
    taps = math.prod(kernel_size)
    columns = x.reshape(*lead, x.shape[-2] // taps, taps, *blocks)
    image = jnp.zeros((*lead, columns.shape[-4], *(n + 2 * p for n, p in zip(output_size, padding))), x.dtype)
    for tap, key in enumerate(_patch_slices(blocks, kernel_size, dilation, stride)):
        image = image.at[key].add(columns[..., tap, :, :])
    height, width = output_size
    return image[..., padding[0] : padding[0] + height, padding[1] : padding[1] + width]


# ----------------------------------------------------------------------------- unchecked indexing
# What decompositions (upsampling, padding...) emit instead of index/index_put; tpu checks their
# indices all the same.
lower(aten._unsafe_index.Tensor, runs=Runs.EAGER)(indexing.index)
lower(aten._unsafe_index_put.default, runs=Runs.EAGER)(indexing.index_put)


def _clamped_key(x, indices) -> tuple:
    """The indices clamped into range: masked-off positions may hold any index."""
    return tuple(
        slice(None) if index is None else jnp.clip(index, -size, size - 1)
        for index, size in zip(indices, x.shape)
    )


@lower(aten._unsafe_masked_index.default)
def unsafe_masked_index(x, mask, indices, fill):
    """``where(mask, x[indices], fill)``, never reading ``x`` where ``mask`` is off."""
    return jnp.where(mask, x[_clamped_key(x, indices)], jnp.asarray(fill, x.dtype))


@lower(aten._unsafe_masked_index_put_accumulate.default)
def unsafe_masked_index_put_accumulate(x, mask, indices, values):
    """``x[indices] += values`` where ``mask`` is on."""
    masked = jnp.where(mask, values, jnp.zeros((), values.dtype))
    return indexing._at_reduce(x, _clamped_key(x, indices), masked, "sum")  # bool: "or"
