"""Padding rules: how a lowering runs on values padded to size buckets (``runtime.padding``).

A lowering with a rule (``Lowering.pad``) whose inputs include padded values runs the program
compiled for their buckets, given their logical sizes at run time, and returns padded outputs:
a new size inside a bucket compiles nothing. The rule says what keeps the result exact: the
value the padding must hold along the dimensions the op reduces or contracts over (zeros for a
sum or a matmul's contraction, -inf for a max or a softmax), and the layout of each output. A
call the rule cannot serve exactly (a padded dimension where the op needs it static) returns
None, and the op reads its inputs unpadded, one program per shape as before buckets.

The rules, like JAX's batching rules beside its primitives, are data: each lowering names its
rule where it is registered (``lower(..., pad=REDUCE_SUM)``); the elementwise families
(``unary``, ``binary``, ``predicate``) are :data:`POINTWISE` by default.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..runtime import padding
from ..runtime.buffer import ARRAY_TYPE, Deferred, Padded, StridedView, apply
from ..runtime.host_copies import host_copy
from ..runtime.lru import Kind, caches
from ..runtime.padding import Factor, Layout, static_dim

__all__ = [
    "Along",
    "Einsum",
    "Pointwise",
    "Positional",
    "Reduce",
    "Rowwise",
    "POINTWISE",
    "POINTWISE_CHECKED",
    "UNREAD",
    "BY_LOWERING",
    "TRIANGLE",
    "SCAN",
    "DRAWN",
    "run",
]


class Plan(NamedTuple):
    """How one call runs padded: operands to pad first (position -> layout), the fill of each
    padded operand's padding (position -> value; absent: left as it is), the layout of each
    output (None: not padded; a single layout: every output's), and arguments given the
    bucket's value instead of the call's (position -> value: a logical length the lowering does
    not read would compile per size)."""

    pad: dict
    fills: dict
    outputs: tuple
    bucketed: dict = {}


def _layout(value) -> Layout | None:
    """A tensor operand's layout (a plain array's: static), None for anything else."""
    kind = type(value)
    if kind is Padded:
        return value.layout
    if kind in (ARRAY_TYPE, StridedView, Deferred):  # (a view its program reads: ``w.t()``)
        return Layout(tuple(static_dim(n) for n in value.shape))
    return None


def _named(values: list, names: Sequence[str], name: str, default=None):
    try:
        value = values[names.index(name)]
    except (ValueError, IndexError):
        return default
    return default if value is None else value


def _wrap_dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _same_extent(a: tuple, b: tuple) -> bool:
    return math.prod(f.size for f in a) == math.prod(f.size for f in b)


def _is_dynamic(dim: tuple) -> bool:
    return any(f.bucket is not None for f in dim)


def _alike(a: tuple, b: tuple) -> bool:
    """Whether two layouts' dims (tuples of dims) are padded alike: equal, or static and of one
    size however their factors split it (``repeat_kv``'s merged heads)."""
    return len(a) == len(b) and all(
        x == y or not (_is_dynamic(x) or _is_dynamic(y)) and _same_extent(x, y) for x, y in zip(a, b)
    )


def _broadcast_dims(layouts: dict) -> tuple | None:
    """The output dims of operands broadcast together (right-aligned), and the operands that
    must be padded to them first (position -> layout): a dynamic dim is the operands' shared
    factors; an operand of that extent without them is padded to them. None where two operands
    are padded differently along one dim."""
    ndim = max(len(lay.dims) for lay in layouts.values())
    out = []
    for k in range(ndim):
        chosen = None
        for lay in layouts.values():
            d = len(lay.dims) - ndim + k
            if d < 0 or lay.shape[d] == 1 and not _is_dynamic(lay.dims[d]):
                continue
            dim = lay.dims[d]
            if chosen is None or (_is_dynamic(dim) and not _is_dynamic(chosen)):
                chosen = dim
            elif _is_dynamic(dim) and dim != chosen:
                return None
        out.append(chosen if chosen is not None else static_dim(1))
    pads = {}
    for position, lay in layouts.items():
        dims = list(lay.dims)
        offset = ndim - len(dims)
        for d, dim in enumerate(dims):
            target = out[offset + d]
            if _is_dynamic(target) and dim != target:
                if not _same_extent(dim, target) or _is_dynamic(dim):
                    if lay.shape[d] == 1 and not _is_dynamic(dim):
                        continue  # (broadcast)
                    return None
                dims[d] = target
        if dims != list(lay.dims):
            pads[position] = Layout(tuple(dims))
    return tuple(out), pads


class Pointwise:
    """Each output element depends on the inputs' elements at its position (broadcast): padding
    is computed along and never read. Every output is laid out as the broadcast inputs.
    ``check_fills``: as :class:`Planned`'s, for an op whose check reads no padded element (a
    fill value's range: ``masked_fill``)."""

    def __init__(self, check_fills: dict | None = None):
        self.check_fills = check_fills

    def plan(self, values: list, names: Sequence[str]) -> Plan | None:
        layouts = {i: lay for i, v in enumerate(values) if (lay := _layout(v)) is not None}
        lists = [i for i, v in enumerate(values) if type(v) is list and any(type(x) is Padded for x in v)]
        if lists or not layouts:
            return None
        broadcast = _broadcast_dims(layouts)
        if broadcast is None:
            return None
        dims, pads = broadcast
        return Plan(pads, {}, (Layout(dims),))


POINTWISE = Pointwise()
#: pointwise, with a check that reads no element of the padded operands
POINTWISE_CHECKED = Pointwise(check_fills={})


class Unread:
    """The lowering reads only its padded operands' shapes and dtypes, never their elements
    (``new_ones``, ``zeros_like``): it is called with them as they are (a factory ``*_like``
    makes its result padded as its operand, :mod:`.creation`)."""

    plan = None


UNREAD = Unread()


class ByLowering:
    """The lowering serves padded operands itself (an eager lowering that checks index values
    against logical sizes: advanced indexing, :func:`indexed`), returning None where it cannot:
    it is called with them as they are."""

    plan = None


BY_LOWERING = ByLowering()


def _identity(kind: str, dtype) -> Any:
    """The value padding must hold for a reduction of ``kind`` to ignore it."""
    dtype = np.dtype(dtype)
    if kind == "sum":
        return 0
    if kind == "prod":
        return 1
    if kind == "all":
        return True
    if kind == "any":
        return False
    if kind in ("max", "min"):
        if dtype == np.bool_:
            return kind == "min"
        if jnp.issubdtype(dtype, jnp.inexact):
            return -np.inf if kind == "max" else np.inf
        info = jnp.iinfo(dtype)
        return info.min if kind == "max" else info.max
    raise ValueError(kind)


class Reduce:
    """A reduction of ``self`` over ``dim`` (all dims for None or an empty list): the padding of
    the reduced dims holds the reduction's identity (``kind``: sum, prod, max, min, any, all).
    ``indices``: the op also returns positions along the reduced dim, exact only where that dim
    is a single factor (padding then follows the tensor's positions). ``kind`` "static": a
    reduction that needs the reduced dims' logical extent (``mean``, ``var``, ``std``), planned
    only where they are static (an RMS norm's hidden dim of padded tokens)."""

    def __init__(self, kind: str, dim: str = "dim", keepdim: str = "keepdim", indices: bool = False):
        self.kind, self.dim, self.keepdim, self.indices = kind, dim, keepdim, indices

    def plan(self, values: list, names: Sequence[str]) -> Plan | None:
        x = values[0]
        if type(x) is not Padded:
            return None
        lay = x.layout
        ndim = len(lay.dims)
        dim = _named(values, names, self.dim)
        if dim is None or (isinstance(dim, (list, tuple)) and not dim):
            if self.indices and ndim > 1:
                return None  # (a flat position over padding is not the tensor's)
            reduced = set(range(ndim))
        else:
            reduced = {_wrap_dim(d, ndim) for d in (dim if isinstance(dim, (list, tuple)) else (dim,))}
        if self.indices and any(len(lay.dims[d]) > 1 and _is_dynamic(lay.dims[d]) for d in reduced):
            return None
        if self.kind == "static" and any(_is_dynamic(lay.dims[d]) for d in reduced):
            return None
        keepdim = bool(_named(values, names, self.keepdim, False))
        dims = tuple(
            (static_dim(1) if keepdim else None) if d in reduced else dim for d, dim in enumerate(lay.dims)
        )
        out = Layout(tuple(d for d in dims if d is not None))
        fills = {0: _identity(self.kind, x.dtype)} if any(_is_dynamic(lay.dims[d]) for d in reduced) else {}
        return Plan({}, fills, (out,))


class Along:
    """An op along one ``dim`` of its operands, each of them laid out alike (softmax and its
    backward): where that dim is dynamic, the padding of operand ``i`` holds ``fills[i]``. The
    outputs are laid out as the first operand."""

    def __init__(self, dim: str = "dim", fills: dict | None = None):
        self.dim, self.fills = dim, fills or {}

    def plan(self, values: list, names: Sequence[str]) -> Plan | None:
        layouts = {i: lay for i, v in enumerate(values) if (lay := _layout(v)) is not None}
        broadcast = _broadcast_dims(layouts)
        if broadcast is None:
            return None
        dims, pads = broadcast
        if any(len(lay.dims) != len(dims) for lay in layouts.values()):
            return None
        d = _wrap_dim(_named(values, names, self.dim, 0), len(dims))
        fills = {i: v for i, v in self.fills.items() if i in layouts} if _is_dynamic(dims[d]) else {}
        return Plan(pads, fills, (Layout(dims),))


class Positional:
    """Each output element depends on the input element at its position and on the position's
    index along ``dims`` (``tril``, ``triu``): exact where those dims are single factors, whose
    padding comes after every logical index. The output is laid out as the input."""

    def __init__(self, dims: Sequence[int]):
        self.dims = tuple(dims)

    def plan(self, values: list, names: Sequence[str]) -> Plan | None:
        x = values[0]
        if type(x) is not Padded or len(x.layout.dims) < len(self.dims):
            return None
        if any(len(x.layout.dims[d]) > 1 and _is_dynamic(x.layout.dims[d]) for d in self.dims):
            return None
        return Plan({}, {}, (x.layout,))


#: ``tril`` and ``triu``: positions in the last two dims
TRIANGLE = Positional((-2, -1))


class Scan:
    """A cumulative op along ``dim`` (``cumsum``): each output element depends on the elements
    before it along that dim, exact where the dim is one factor (its padding after every logical
    position) or static. The output is laid out as the input."""

    def __init__(self, dim: str = "dim"):
        self.dim = dim

    def plan(self, values: list, names: Sequence[str]) -> Plan | None:
        x = values[0]
        if type(x) is not Padded or not x.layout.dims:
            return None
        dims = x.layout.dims
        d = _wrap_dim(_named(values, names, self.dim, 0), len(dims))
        if len(dims[d]) > 1 and _is_dynamic(dims[d]):
            return None
        return Plan({}, {}, (x.layout,))


SCAN = Scan()


class Drawn:
    """A random fill of its first operand's shape (``uniform``, ``normal``), which it never
    reads: exact where that operand is padded along its first dim alone, one factor. JAX's
    counter-based bits at a position depend on its row-major index, which padding after the
    last row leaves as it is, so the padded draw's logical elements are the unpadded draw's
    (the same values for one seed, padded or not). Other layouts are drawn unpadded."""

    @staticmethod
    def plan(values: list, names: Sequence[str]) -> Plan | None:
        x = values[0]
        if type(x) is not Padded or not leading_only(x.layout):
            return None
        return Plan({}, {}, (x.layout,))


def leading_only(layout: Layout) -> bool:
    """Whether ``layout`` pads its first dim alone, as one factor (a draw's exact layouts)."""
    dims = layout.dims
    return bool(dims) and len(dims[0]) == 1 and not any(_is_dynamic(d) for d in dims[1:])


DRAWN = Drawn()


class Rowwise:
    """An op over the last ``len(normalized_shape)`` dims of ``input`` (layer norm), row by row:
    those dims must be static. Output 0 is laid out as the input; the next ``stats`` outputs
    keep the row dims with the normalized ones of size 1; the rest are not padded. ``fills``:
    the padding each operand holds where a row dim is dynamic (a backward's weight gradients
    sum over rows)."""

    def __init__(self, input: int = 0, shape_arg: str = "normalized_shape", stats: int = 2, fills=None):
        self.input, self.shape_arg, self.stats, self.fills = input, shape_arg, stats, fills or {}

    def plan(self, values: list, names: Sequence[str]) -> Plan | None:
        normalized = len(_named(values, names, self.shape_arg, ()))
        layouts = {i: lay for i, v in enumerate(values) if (lay := _layout(v)) is not None}
        broadcast = _broadcast_dims(layouts)  # (statistics broadcast over the normalized dims)
        if broadcast is None or self.input not in layouts:
            return None
        dims, pads = broadcast
        lay = pads.get(self.input, layouts[self.input])
        if len(lay.dims) != len(dims) or normalized > len(dims):
            return None
        rows = lay.dims[: len(lay.dims) - normalized]
        if any(_is_dynamic(d) for d in lay.dims[len(rows) :]):
            return None
        stats = Layout(rows + (static_dim(1),) * normalized)
        fills = dict(self.fills) if any(_is_dynamic(d) for d in rows) else {}
        fills = {i: v for i, v in fills.items() if i in layouts}
        return Plan(pads, fills, (lay,) + (stats,) * self.stats + (None,) * 3)


class Einsum:
    """A contraction written as einsum ``labels`` ("mk,kn->mn"; operands right-aligned, so a
    bias "n" broadcasts): dims of one label are laid out alike in every operand (an operand of
    that extent without the padding is padded first); the padding of every operand along a
    contracted label holds 0. ``operands``: the positions of the labelled operands."""

    def __init__(self, labels: str, operands: Sequence[int]):
        inputs, self.output = labels.split("->")
        self.inputs = inputs.split(",")
        self.operands = tuple(operands)

    def plan(self, values: list, names: Sequence[str]) -> Plan | None:
        by_label: dict[str, tuple] = {}
        seen = {}
        for position, labels in zip(self.operands, self.inputs):
            lay = _layout(values[position])
            if lay is None or len(lay.dims) > len(labels):
                return None
            seen[position] = (lay, labels[len(labels) - len(lay.dims) :])
            for label, dim in zip(seen[position][1], lay.dims):
                if _is_dynamic(dim):
                    if label in by_label and _is_dynamic(by_label[label]) and by_label[label] != dim:
                        return None
                    by_label[label] = dim
                elif label not in by_label and math.prod(f.size for f in dim) != 1:
                    by_label[label] = dim
        pads, fills = {}, {}
        contracted = set("".join(self.inputs)) - set(self.output)
        for position, (lay, labels) in seen.items():
            dims = list(lay.dims)
            for d, label in enumerate(labels):
                target = by_label.get(label)
                if target is not None and _is_dynamic(target) and dims[d] != target:
                    if _is_dynamic(dims[d]) or not _same_extent(dims[d], target):
                        if lay.shape[d] == 1:
                            continue
                        return None
                    dims[d] = target
            if dims != list(lay.dims):
                pads[position] = Layout(tuple(dims))
            if any(label in contracted and _is_dynamic(by_label.get(label, ())) for label in labels):
                fills[position] = 0
        out = Layout(tuple(by_label.get(label, static_dim(1)) for label in self.output))
        return Plan(pads, fills, (out,))


class Planned:
    """A rule written as a function ``plan(values, names) -> Plan | None`` (ops whose padding
    needs saying case by case: a gather's indices, a loss's targets). ``check_fills``: the op's
    check may read its padded operands, given their padding filled as said (position -> value,
    or a function of the call's values)."""

    def __init__(self, plan: Callable, check_fills: dict | None = None):
        self.plan, self.check_fills = plan, check_fills


def _take_plan(values: list, names: Sequence[str]) -> Plan | None:
    """``embedding(weight, indices)``: rows of a static table at padded indices (padding holds 0,
    a row every table has)."""
    weight, indices = _layout(values[0]), _layout(values[1])
    if weight is None or indices is None or any(_is_dynamic(d) for d in weight.dims):
        return None
    out = Layout(indices.dims + weight.dims[1:])
    return Plan({}, {1: 0}, (out,))


TAKE = Planned(_take_plan, check_fills={1: 0})


def _take_backward_plan(values: list, names: Sequence[str]) -> Plan | None:
    """``embedding_dense_backward(grad, indices, ...)``: row sums by index, padding's gradient 0
    (not with ``scale_grad_by_freq``, which counts the indices)."""
    if _named(values, names, "scale_grad_by_freq", False) or type(values[0]) is not Padded:
        return None
    grad, indices = _layout(values[0]), _layout(values[1])
    if indices is None or grad.dims[: len(indices.dims)] != indices.dims:
        return None
    return Plan({}, {0: 0, 1: 0}, (None,))


TAKE_BACKWARD = Planned(_take_backward_plan)


def _ignored(values: list, names: Sequence[str]) -> int:
    return _named(values, names, "ignore_index", -100)


def _nll_plan(values: list, names: Sequence[str], backward: bool = False) -> Plan | None:
    """``nll_loss_forward(self, target, weight, reduction, ignore_index)`` and its backward
    (``grad_output`` first): padded targets are ignored (``ignore_index``), padded rows of
    ``self`` hold 0."""
    first = 1 if backward else 0
    x, target = _layout(values[first]), _layout(values[first + 1])
    if x is None or target is None or len(x.dims) > 1 and any(_is_dynamic(d) for d in x.dims[1:2]):
        return None  # (classes padded)
    pads = {}
    rows = Layout(x.dims[: len(target.dims)])
    if target.dims[: len(x.dims)] != rows.dims:
        if not padding.rebucketable(target, rows):  # (a label shifted by a slice: bucket + 1)
            return None
        pads[first + 1], target = rows, rows
    fills = {first: 0, first + 1: _ignored(values, names)}
    if backward:
        if type(values[0]) is Padded:
            fills[0] = 0
        return Plan(pads, fills, (x,))
    reduction = _named(values, names, "reduction", 1)
    return Plan(pads, fills, (target if reduction == 0 else None, None))


NLL_LOSS = Planned(_nll_plan, check_fills={1: _ignored})
NLL_LOSS_BACKWARD = Planned(functools.partial(_nll_plan, backward=True))


def _cat_plan(values: list, names: Sequence[str]) -> Plan | None:
    """``cat(tensors, dim)``: operands laid out alike but along ``dim``, which none pads; or one
    operand and empty ones (a cache grown from nothing), laid out as that one."""
    tensors = values[0]
    if type(tensors) is not list:
        return None
    layouts = [_layout(t) for t in tensors]
    if any(lay is None for lay in layouts):
        return None
    layouts = [lay for lay in layouts if lay.shape != (0,)] or layouts  # (cat skips these: legacy)
    if len({len(lay.dims) for lay in layouts}) != 1:
        return None
    d = _wrap_dim(_named(values, names, "dim", 0), len(layouts[0].dims))
    filled = [i for i, lay in enumerate(layouts) if lay.shape[d]]
    if len(filled) == 1 and len(layouts) > 1:
        return _cat_onto_empty(layouts, filled[0], d)
    if len(layouts) == 1:  # (with skipped ones only)
        return Plan({}, {}, (layouts[0],))
    rest = {lay.dims[:d] + lay.dims[d + 1 :] for lay in layouts}
    if len(rest) != 1 or any(_is_dynamic(lay.dims[d]) for lay in layouts):
        return None
    dims = list(layouts[0].dims)
    dims[d] = static_dim(sum(lay.shape[d] for lay in layouts))
    return Plan({}, {}, (Layout(tuple(dims)),))


def _cat_onto_empty(layouts: list, kept: int, d: int) -> Plan | None:
    """``cat`` of one operand (``kept``) with empty ones along ``d``, each laid out as it is but
    for its 0 along ``d`` (static elsewhere: an empty cache): the result is laid out as it."""
    out = layouts[kept]
    empty = out.dims[:d] + (static_dim(0),) + out.dims[d + 1 :]
    if any(lay.dims != empty for i, lay in enumerate(layouts) if i != kept):
        return None
    return Plan({}, {}, (out,))


CAT = Planned(_cat_plan)


def _constant_pad_plan(values: list, names: Sequence[str]) -> Plan | None:
    """``constant_pad_nd(x, pad, value)``: what it adds after the end of a dynamic dim (one
    factor) lands on ``x``'s padding, which holds ``value``: the dim keeps its padding, longer by
    as much. Static dims are padded (or cropped) as the lowering pads them."""
    x = values[0]
    if type(x) is not Padded:
        return None
    pad, lay = list(values[1]), x.layout
    dims = list(lay.dims)
    for k in range(len(pad) // 2):
        d = len(dims) - 1 - k
        before, after = pad[2 * k], pad[2 * k + 1]
        if not _is_dynamic(dims[d]):
            dims[d] = static_dim(lay.shape[d] + before + after)
        elif before or after < 0 or len(dims[d]) != 1:
            return None
        else:
            f = dims[d][0]
            dims[d] = (Factor(f.size + after, f.padded + after),)
    value = _named(values, names, "value", 0)
    if not isinstance(value, (bool, int, float)):  # (the number, made a device scalar: read back)
        if type(value) is not ARRAY_TYPE or value.ndim:
            return None
        value = np.asarray(value).item()
    return Plan({}, {0: value}, (Layout(tuple(dims)),))


CONSTANT_PAD = Planned(_constant_pad_plan, check_fills={})  # (its check reads the value only)


def _slice_backward_plan(values: list, names: Sequence[str]) -> Plan | None:
    """``slice_backward(grad, input_sizes, dim, start, end, step)``: the gradient written into
    zeros of the input's shape. Along a static dim, the other dims laid out as the gradient's;
    along a dim of one dynamic factor (``x[:, 1:]``'s, read as ``padding.plan_view`` cuts it),
    from the slice's start to the end of the gradient's bucket, its padding 0."""
    grad, sizes, dim = _layout(values[0]), values[1], values[2]
    if grad is None or type(sizes) not in (list, tuple) or len(sizes) != len(grad.dims):
        return None
    d = _wrap_dim(dim, len(sizes))
    dims = list(grad.dims)
    if not _is_dynamic(grad.dims[d]):
        dims[d] = static_dim(sizes[d])
        out = Layout(tuple(dims))
        return Plan({}, {}, (out,), {1: tuple(out.padded_shape)})
    factor = grad.dims[d][0]
    if len(grad.dims[d]) != 1 or values[5] != 1 or sizes[d] > factor.padded:
        return None
    start = slice(values[3], values[4]).indices(sizes[d])[0]
    dims[d] = (Factor(sizes[d], factor.padded),)
    out = Layout(tuple(dims))
    return Plan({}, {0: 0}, (out,), {1: tuple(out.padded_shape), 3: start, 4: None})


SLICE_BACKWARD = Planned(_slice_backward_plan)


def _select_backward_plan(values: list, names: Sequence[str]) -> Plan | None:
    """``select_backward(grad, input_sizes, dim, index)``: the gradient written into zeros of the
    input's shape, the selected dim static, the others laid out as the gradient's."""
    grad, sizes, dim = _layout(values[0]), values[1], values[2]
    if grad is None or type(sizes) not in (list, tuple) or len(sizes) != len(grad.dims) + 1:
        return None
    d = _wrap_dim(dim, len(sizes))
    out = Layout((*grad.dims[:d], static_dim(sizes[d]), *grad.dims[d:]))
    return Plan({}, {}, (out,), {1: tuple(out.padded_shape)})


SELECT_BACKWARD = Planned(_select_backward_plan)


def _index_plan(values: list, names: Sequence[str], checking: bool = False) -> Plan | None:
    """``x[indices]`` with integer indices (:func:`indexed`: the values are ``x``, the dims
    indexed, then their indices): each indexed dim of ``x`` one factor, so that a logical
    position is its padded one; the indices broadcast together, their padding 0 (a position
    every dim has); the result laid out as NumPy places advanced indices (``checking``: the
    bounds check's outputs, not padded)."""
    x, dims, given = _layout(values[0]), values[1], values[2:]
    if x is None or any(len(x.dims[d]) != 1 for d in dims):
        return None
    broadcast = _broadcast_dims({2 + k: _layout(i) for k, i in enumerate(given)})
    if broadcast is None:
        return None
    index_dims, pads = broadcast
    rest = [x.dims[d] for d in range(len(x.dims)) if d not in dims]
    first = dims[0]
    if dims == tuple(range(first, first + len(dims))):  # (adjacent: in place of the indexed)
        out = (*rest[:first], *index_dims, *rest[first:])
    else:
        out = (*index_dims, *rest)
    fills = {2 + k: 0 for k, i in enumerate(given) if type(i) is Padded or 2 + k in pads}
    return Plan(pads, fills, (None, None) if checking else (Layout(tuple(out)),))


INDEX = Planned(_index_plan)
INDEX_CHECK = Planned(functools.partial(_index_plan, checking=True))


def _put_plan(values: list, names: Sequence[str]) -> Plan | None:
    """``x[indices] = v`` (:func:`put_indexed`: the values are ``x``, the dims indexed, ``v``,
    then the indices): the indices laid out as :data:`INDEX` lays them out, their padding the
    dtype's largest number (a position past every dim, which the put drops), ``v`` padded as
    the indexed result where it is not yet; the output laid out as ``x``."""
    x, dims, given = values[0], values[1], values[3:]
    indexed = _index_plan([x, dims, *given], names)
    v = _layout(values[2])
    if indexed is None or v is None:
        return None
    broadcast = _broadcast_dims({0: indexed.outputs[0], 1: v})
    if broadcast is None or 0 in broadcast[1]:
        return None
    pads = {1 + p: lay for p, lay in indexed.pad.items()}
    if 1 in broadcast[1]:
        pads[2] = broadcast[1][1]
    fills = {1 + p: int(np.iinfo(values[1 + p].dtype).max) for p in indexed.fills}
    return Plan(pads, fills, (_layout(x),))


PUT = Planned(_put_plan)


def put_indexed(program: Callable, x, dims: tuple, v, given: list, lengths: jax.Array):
    """``program(x, dims, v, *given, lengths=)`` run as :data:`PUT` plans it (the padded
    result), or None where it does not serve the call."""
    return run(PUT, program, [x, dims, v, *given], {"lengths": lengths}, ())


def indexed(program: Callable, x, dims: tuple, given: list, lengths: jax.Array, checking: bool = False):
    """``program(x, dims, *given, lengths=)`` run as :data:`INDEX` plans it (the padded result;
    ``checking``: as :data:`INDEX_CHECK`, its bounds check), or None where it does not serve
    the call."""
    return run(INDEX_CHECK if checking else INDEX, program, [x, dims, *given], {"lengths": lengths}, ())


def _attention_backward_plan(values: list, names: Sequence[str]) -> Plan | None:
    """Attention's backward, causal or with a mask (``attn_bias``), without dropout: query, key
    and value padded alike along their length (one factor: positions are the tensor's), their
    padding and the gradient's 0, the mask's False or -inf, so padded keys get no weight from
    real queries and padded queries pass back nothing."""
    bias = _named(values, names, "attn_bias")
    if not (_named(values, names, "is_causal", False) or bias is not None):
        return None  # (padded keys would get weight)
    if _named(values, names, "dropout_p", 0.0):
        return None
    q, k, v, g = (_layout(values[names.index(n)]) for n in ("query", "key", "value", "grad_out"))
    if None in (q, k, v, g) or not _alike(q.dims[:-1], k.dims[:-1]) or not _alike(k.dims[:-1], v.dims[:-1]):
        return None
    pads = {}
    if g.dims != q.dims:  # (a gradient not padded yet: an expanded one, from a sum)
        if any(_is_dynamic(d) for d in g.dims) or g.shape != q.shape:
            return None
        pads[names.index("grad_out")] = q
    if any(len(d) > 1 and _is_dynamic(d) for d in q.dims[-2:-1]) or _is_dynamic(q.dims[-1]):
        return None
    fills = {names.index(n): 0 for n in ("grad_out", "query", "key", "value")}
    if bias is not None and not _mask_plan(bias, q, k, names.index("attn_bias"), pads, fills):
        return None
    lengths = {names.index(n): d.padded_shape[-2] for n, d in (("max_q", q), ("max_k", k)) if n in names}
    outputs = (q, k, v, None if bias is None else _layout(bias))
    return Plan(pads, fills, outputs, lengths)


def _mask_plan(bias, q: Layout, k: Layout, position: int, pads: dict, fills: dict) -> bool:
    """Attention's mask on padded queries and keys: laid out along their lengths in its last two
    dims (broadcast in the others, or along the queries), padded so where it is not yet, its
    padding masking (False, or -inf for an additive mask); False where it cannot be."""
    layout = _layout(bias)
    if layout is None or len(layout.dims) < 2:
        return False
    *lead, rows, columns = layout.dims
    if any(_is_dynamic(d) for d in lead) or not _same_extent(columns, k.dims[-2]):
        return False
    if not (_same_extent(rows, q.dims[-2]) or layout.shape[-2] == 1 and not _is_dynamic(rows)):
        return False
    wanted = Layout((*lead, rows if layout.shape[-2] == 1 else q.dims[-2], k.dims[-2]))
    if wanted != layout:
        if any(_is_dynamic(a) and a != b for a, b in zip(layout.dims, wanted.dims)):
            return False  # (padded otherwise: read unpadded)
        pads[position] = wanted
    dtype = bias.array.dtype if type(bias) is Padded else bias.dtype
    fills[position] = False if dtype == np.bool_ else -math.inf
    return True


ATTENTION_BACKWARD = Planned(_attention_backward_plan)


def _attention_plan(values: list, names: Sequence[str]) -> Plan | None:
    """Attention's forward (``nn._attention``'s arguments), on the backward's terms."""
    renamed = dict(zip(names, values))
    renamed["grad_out"] = renamed["query"]
    order = list(renamed)
    plan = _attention_backward_plan(list(renamed.values()), order)
    if plan is None or len(plan.outputs[0].dims) != 4:
        return None
    q, v = plan.outputs[0], plan.outputs[2]
    fills = {names.index(n): 0 for n in ("query", "key", "value")}
    bias = names.index("attn_bias")
    if bias in plan.fills:
        fills[bias] = plan.fills[bias]
    pads = {p: lay for p, lay in plan.pad.items() if p == bias}
    return Plan(pads, fills, (Layout(q.dims[:-1] + v.dims[-1:]), Layout(q.dims[:-1])))


ATTENTION = Planned(_attention_plan)
_ATTENTION_NAMES = ("query", "key", "value", "attn_bias", "seed", "dropout_p", "is_causal", "scale", "order")


def attention(program: Callable, values: list) -> tuple | None:
    """Causal attention (``nn._attention_forward``'s arguments) on padded operands: (output,
    logsumexp), padded; None where :data:`ATTENTION` does not serve the call."""
    return run(ATTENTION, program, values, {}, _ATTENTION_NAMES)


# ----------------------------------------------------------------------------- running a plan
class _Spec(NamedTuple):
    """The static part of a padded call: the op's program, how its arguments are rebuilt from
    the program's array inputs, the fills and the extra keywords' names."""

    program: Callable
    #: per argument: ("leaf", k), ("padded", k, structure, its first size, fill), ("list",
    #: whether a tuple, items) or ("static", whether a tuple, value)
    values: tuple
    extra: tuple


_NO_FILL = object()


def _describe(value, leaves: list, sizes: list, fill=_NO_FILL):
    kind = type(value)
    if kind is Padded:
        leaves.append(value.array)
        spec = ("padded", len(leaves) - 1, value.layout.structure, len(sizes), fill)
        sizes.extend(value.layout.sizes)
        return spec
    if isinstance(value, jax.Array) or kind is StridedView or kind is Deferred:
        leaves.append(value)
        return ("leaf", len(leaves) - 1)
    if kind is list or kind is tuple:
        if any(isinstance(v, (jax.Array, Padded, StridedView, Deferred)) for v in value):
            return ("list", kind is tuple, tuple(_describe(v, leaves, sizes) for v in value))
        return ("static", kind is tuple, tuple(value)) if kind is list else ("static", None, value)
    hash(value)  # (a TypeError: not a static the program can take)
    return ("static", None, value)


def _rebuild(spec, leaves, sizes):
    kind = spec[0]
    if kind == "leaf":
        return leaves[spec[1]]
    if kind == "padded":
        _, k, structure, first, fill = spec
        x = leaves[k]
        if fill is not _NO_FILL:
            x = padding.filled(x, structure, iter(sizes[first:]), fill)
        return x
    if kind == "list":
        items = [_rebuild(s, leaves, sizes) for s in spec[2]]
        return tuple(items) if spec[1] else items
    _, as_tuple, value = spec
    return list(value) if as_tuple is False else value


def _padded_program(spec: _Spec, sizes: jax.Array, *arrays):
    """The op's program on its arrays (``arrays``: the call's, then its extra keywords'), each
    padded operand's padding filled first as the spec says."""
    count = len(arrays) - len(spec.extra)
    leaves, extra = arrays[:count], arrays[count:]
    args = [_rebuild(s, leaves, list(sizes)) for s in spec.values]
    return spec.program(*args, **dict(zip(spec.extra, extra)))


@functools.lru_cache(maxsize=4096)
def _program_of(spec: _Spec) -> Callable:
    """The padded call's program, one object per spec (a fused graph's node names its program:
    the same one for every call of the same spec), naming the op's own program as the one it
    pads (``padded_from``: a graph starting with it is the graph of the op's other sizes)."""
    program = jax.jit(functools.partial(_padded_program, spec))
    program.padded_from = spec.program
    return program


#: (rule, each value's layout or static value, names) -> the rule's plan: a loop's calls repeat
#: their layouts, and planning costs more than the padded program's own dispatch
_plans = caches.lru("padding.call_plans", Kind.TRACES)
_MISSING = object()


class _Same:
    """A device scalar in a plan's key: equal to the same array only, and kept alive by the key
    (device scalars are kept per number: ``transfer.device_scalar``)."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array

    def __hash__(self) -> int:
        return id(self.array)

    def __eq__(self, other: object) -> bool:
        return type(other) is _Same and other.array is self.array


def _plan_key(rule, values: list, names: Sequence[str]) -> tuple | None:
    """What a rule's plan may read of a call: its operands' layouts and dtypes (never their
    contents) and its static arguments; None where one cannot be a key."""
    key = [rule, tuple(names)]
    for v in values:
        kind = type(v)
        if kind is Padded:
            key.append((kind, v.layout, getattr(v.array, "dtype", None)))
        elif kind is ARRAY_TYPE and not v.ndim:  # (a number made a device scalar: a plan may
            key.append(_Same(v))  # read its value, as constant_pad_nd's does)
        elif kind is ARRAY_TYPE or kind is Deferred:
            key.append((kind, tuple(v.shape), v.dtype))
        elif kind is StridedView:  # (a view its program reads: its shape is what plans see)
            key.append((kind, tuple(v.shape)))
        elif kind is list:
            key.append((kind, tuple(v)))
        else:
            key.append((kind, v))
    try:
        hash(key := tuple(key))
    except TypeError:
        return None
    return key


def _plan(rule, values: list, names: Sequence[str]) -> Plan | None:
    """``rule.plan(values, names)``, remembered by :func:`_plan_key` (plans are read, never
    changed)."""
    key = _plan_key(rule, values, names)
    if key is None:
        return rule.plan(values, names)
    plan = _plans.get(key, _MISSING)
    if plan is _MISSING:
        plan = _plans[key] = rule.plan(values, names)
    return plan


def run(rule, program: Callable, values: list, extra: dict, names: Sequence[str], index: int = 0):
    """The op's outputs for arguments ``values`` (some :class:`Padded`) run padded as ``rule``
    plans it (padded outputs where their layout has a dynamic factor), or None where the rule
    does not serve this call."""
    if rule is UNREAD or rule is BY_LOWERING:
        return program(*values, **extra)
    plan = _plan(rule, values, names)
    if plan is None:
        return None
    values = list(values)
    for position, value in plan.bucketed.items():
        values[position] = value
    for position, layout in plan.pad.items():
        value = values[position]
        if type(value) is StridedView:
            return None  # (a view its program would read: read unpadded instead)
        if type(value) is Padded and padding.rebucketable(value.layout, layout):
            values[position] = padding.rebucketed(value, layout)
        else:
            values[position] = padding.padded(value.unpadded() if type(value) is Padded else value, layout)
    leaves, sizes = [], []
    try:
        specs = tuple(_describe(v, leaves, sizes, plan.fills.get(i, _NO_FILL)) for i, v in enumerate(values))
    except TypeError:
        return None
    spec = _Spec(program, specs, tuple(extra))
    sizes = padding.sizes_array(tuple(sizes) or (0,), index)
    outs = apply(_program_of(spec), sizes, *leaves, *extra.values())
    if not isinstance(outs, (list, tuple)):
        return _output(outs, plan.outputs[0])
    layouts = plan.outputs * len(outs) if len(plan.outputs) == 1 else plan.outputs
    return type(outs)(_output(o, lay) for o, lay in zip(outs, layouts))


@functools.partial(jax.jit, static_argnums=(1, 3))
def _filled_for_check(array: jax.Array, structure: tuple, sizes: jax.Array, fill):
    return padding.filled(array, structure, iter(list(sizes)), fill)


def for_check(rule, values: list, names: Sequence[str], index: int = 0) -> list:
    """The arguments the op's check sees: each padded operand as its padded array, its padding
    holding the value the rule says (``Planned.check_fills``), so a bounds check reads only
    values the op may be given."""
    fills = getattr(rule, "check_fills", None) or {}
    checked = list(values)
    for i, v in enumerate(values):
        if type(v) is Padded:
            fill = fills.get(i, 0)
            fill = fill(values, names) if callable(fill) else fill
            if not v.layout.sizes or host_copy(v.array) is not None:
                checked[i] = v.array  # (copied from the host: its padding holds zeros)
                continue
            sizes = padding.sizes_array(v.layout.sizes, index)
            checked[i] = apply(_filled_for_check, v.array, v.layout.structure, sizes, fill)
    return checked


def _output(array, layout: Layout | None):
    if array is None or layout is None or not any(_is_dynamic(d) for d in layout.dims):
        if layout is not None and array is not None and tuple(array.shape) != layout.shape:
            raise AssertionError(f"tpu padding: an output of shape {array.shape} for {layout.shape}")
        return array
    if tuple(array.shape) != layout.padded_shape:
        raise AssertionError(f"tpu padding: an output of shape {array.shape} for {layout}")
    return padding.made(Padded(array, layout))
