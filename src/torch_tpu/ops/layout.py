"""Output layouts of ops whose results PyTorch does not lay out row-major.

A lowering returns arrays, which the dispatcher wraps as contiguous tensors. Most ops' outputs
are contiguous in PyTorch too (elementwise ops follow their inputs: ``tensor.wrap_elementwise``),
but some are not, and code can see the difference (``stride()``, ``is_contiguous()``, whether
``view`` works):

- ``Layout.META``: as PyTorch's meta kernel lays them out, which is what CPU does for these ops
  (LAPACK factorizations are column-major per matrix, ``rot90`` is a transposed flip, FFTs
  follow the transformed dimensions). The meta replay is cached per argument signature
  (in a bounded :class:`~torch_tpu.runtime.lru.LRU`).
- ``Layout.LIKE``: as ``torch.empty_like(input, memory_format=...)``: ``zeros_like`` of a
  transposed tensor is transposed, as PyTorch's ``*_like`` factories preserve the layout.
- ``Layout.COLUMN_MAJOR``: outputs of the input's rank (its matrices) column-major per matrix,
  the LAPACK convention, for ops whose meta kernel differs from CPU (``_linalg_svd``'s ``Vh``).
- ``Layout.SUGGESTED`` and ``Layout.CONVOLUTION``: outputs of the input's rank in the memory
  format the input suggests (``channels_last`` for an NHWC input, ``channels_last_3d`` for
  NDHWC), for the ops whose CPU kernels keep channels-last while their meta kernels do not
  (reflection/replication padding, group norm, pixel shuffle, unpooling, convolution).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import torch
from torch._prims_common import suggest_memory_format

from ..runtime import tensor
from ..runtime.buffer import Padded
from ..runtime.lru import Kind, cached, caches
from .meta import call_quietly, to_meta
from .registry import Layout

__all__ = ["Layout", "MetaLayout", "meta_layout", "meta_strides", "wrap", "wrap_in_order"]


def wrap(
    op: torch._ops.OpOverload, layout: Layout, outputs: Any, args: tuple, kwargs: dict
) -> list[torch.Tensor | None]:
    """``outputs`` (an array, or a tuple of arrays and Nones) as tensors laid out as ``layout``
    says for ``op`` called with ``args``/``kwargs``; a list, one per output."""
    arrays = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    if layout is Layout.LIKE:
        strides = [tensor.like_strides(args[0], kwargs.get("memory_format"))]
    elif layout in (Layout.SUGGESTED, Layout.CONVOLUTION):
        strides = _suggested_strides(op, layout, arrays, args, kwargs)
    elif layout is Layout.COLUMN_MAJOR:
        rank = args[0].dim()  # outputs of the input's rank are its matrices; others, vectors
        strides = [_column_major(a.shape) if a is not None and a.ndim == rank else None for a in arrays]
    else:
        strides = meta_strides(op, args, kwargs) or [None] * len(arrays)
    return [_wrap_one(a, s) for a, s in zip(arrays, strides)]


def _wrap_one(array: jax.Array | None, strides: tuple | None) -> torch.Tensor | None:
    if array is None:
        return None
    if strides is None or tensor.is_row_major(array.shape, strides):
        return tensor.wrap(array)
    try:
        return tensor.wrap_strided(array, strides)
    except ValueError:  # not a permutation of a dense layout: keep it contiguous
        return tensor.wrap(array)


def _column_major(shape: tuple) -> tuple | None:
    if len(shape) < 2:
        return None
    rows, columns = shape[-2], shape[-1]
    strides, step = [1, rows], rows * columns
    for n in reversed(shape[:-2]):
        strides.insert(0, step)
        step *= n
    return tuple(strides)


_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _suggested_strides(op, layout: Layout, arrays: list, args: tuple, kwargs: dict) -> list:
    """Channels-last strides for the outputs of the input's rank when the deciding arguments
    (the input; for a convolution also the weight) suggest that format, else None (row-major)."""
    named = dict(zip((a.name for a in op._schema.arguments), args)) | kwargs
    x = named.get("input", named.get("self"))
    deciding = [x, named.get("weight")] if layout is Layout.CONVOLUTION else [x]
    memory_format = _CHANNELS_LAST.get(x.dim())
    if (
        memory_format is None
        or not any(_suggests(t, memory_format) for t in deciding if isinstance(t, torch.Tensor))
        or (layout is Layout.CONVOLUTION and x.dim() == 5 and x.dtype == torch.float64)
    ):
        return [None] * len(arrays)
    return [
        _format_strides(a.shape, memory_format) if a is not None and a.ndim == x.dim() else None
        for a in arrays
    ]


def _suggests(t: torch.Tensor, memory_format: torch.memory_format) -> bool:
    """Whether ``t.suggest_memory_format()`` is ``memory_format`` (PyTorch's own test)."""
    return _CHANNELS_LAST.get(t.dim()) == memory_format and suggest_memory_format(t) == memory_format


@cached
def _format_strides(shape: tuple, memory_format: torch.memory_format) -> tuple:
    return torch.empty(shape, memory_format=memory_format, device="meta").stride()


def meta_strides(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list | None:
    """The strides of each tensor ``op`` returns for these arguments, per PyTorch's meta kernel
    (None for a non-tensor output), or None if the meta kernel cannot say."""
    return meta_layout(op, args, kwargs).strides


class MetaLayout(NamedTuple):
    """How PyTorch's meta kernel lays out an op's outputs for some arguments."""

    #: per output, its strides (None: not a tensor); None if the meta kernel cannot say
    strides: list | None
    #: per output, its shape (None: not a tensor)
    shapes: list | None
    #: per output, its memory order (``tensor.memory_order``) where its strides are a dense
    #: layout other than row-major, else None; None when no output has one. The op's program
    #: returns those outputs so transposed (``wrap_in_order``): no transpose after it
    orders: tuple | None


def meta_layout(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> MetaLayout:
    """:class:`MetaLayout` of ``op`` called with these arguments (cached per their signature)."""
    key = (op, _signature(args), _signature(tuple(sorted(kwargs.items()))))
    try:
        replayed = _replays.get(key, _MISSING)
    except TypeError:  # an unhashable argument: replay without caching
        return _replay(op, args, kwargs)
    if replayed is _MISSING:
        replayed = _replays[key] = _replay(op, args, kwargs)
    return replayed


def wrap_in_order(outputs: Any, laid: MetaLayout) -> list[torch.Tensor | None]:
    """``outputs`` of a program that returned those of ``laid.orders`` transposed into their
    memory order, as tensors laid out as ``laid`` says (``wrap``'s ``Layout.META`` for an op
    whose layout is already read); a list, one per output."""
    arrays = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    unknown = [None] * len(arrays)
    wrapped = []
    for array, strides, shape, order in zip(
        arrays, laid.strides or unknown, laid.shapes or unknown, laid.orders or unknown
    ):
        if type(array) is Padded:  # (computed in the tensor's order: laid out as it is stored)
            wrapped.append(tensor.wrap_padded(array, strides))
        elif array is None or order is None:
            wrapped.append(_wrap_one(array, strides))
        elif tuple(array.shape) == tuple(shape[d] for d in order):
            wrapped.append(tensor.wrap_stored(array, shape, strides))
        else:  # (the program's output is not the meta kernel's shape: kept as it came)
            wrapped.append(tensor.wrap(array))
    return wrapped


_replays = caches.lru("layout.replays", Kind.TRACES)
_MISSING = object()


def _signature(x: Any) -> Any:
    """What of an argument decides the meta kernel's strides, hashable (lists become tuples:
    ``int[]`` takes either)."""
    if isinstance(x, torch.Tensor):
        cpu_value = x.item() if x.is_cpu and x.dim() == 0 else None
        return (tuple(x.shape), x.stride(), x.dtype, cpu_value)
    if isinstance(x, (list, tuple)):
        return tuple(_signature(v) for v in x)
    if isinstance(x, (torch.device, torch.Generator)):
        return None
    return x


def _replay(op, args: tuple, kwargs: dict) -> MetaLayout:
    result, error = call_quietly(op, to_meta(args), to_meta(kwargs))
    if error is not None:  # the tpu kernel raises its own error, or stays contiguous
        return _UNKNOWN
    leaves = result if isinstance(result, (tuple, list)) else [result]
    tensors = [t if isinstance(t, torch.Tensor) else None for t in leaves]
    strides = [None if t is None else tuple(t.stride()) for t in tensors]
    shapes = [None if t is None else tuple(t.shape) for t in tensors]
    orders = tuple(_order(shape, s) for shape, s in zip(shapes, strides))
    return MetaLayout(strides, shapes, orders if any(o is not None for o in orders) else None)


def _order(shape: tuple | None, strides: tuple | None) -> tuple | None:
    if shape is None or tensor.is_row_major(shape, strides):
        return None
    try:
        return tensor.memory_order(shape, strides)
    except ValueError:  # not a dense layout: wrapped contiguous (_wrap_one)
        return None


_UNKNOWN = MetaLayout(None, None, None)
