"""Indexing lowerings: advanced indexing, gather/scatter, index_* ops, masks, search, unique.

XLA clamps out-of-range indices silently where PyTorch raises, so the ops that take index tensors
check them (:func:`check_bounds`): at once in strict eager (one host sync), with the graph in
fused eager and compiled programs (reported when a value depending on it is read). Ops whose
output shape depends on values (``nonzero``, ``unique``...) run on the host (``Runs.HOST``);
advanced indexing and gather/scatter are ``Runs.EAGER``: only a boolean mask index is read on the
host, every other case records into fused graphs.

Type and shape errors are raised as ``TypeError``; the dispatcher then replays the call on meta
tensors, whose kernels raise PyTorch's own exception and message.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..runtime import buffer, checks, transfer
from ..runtime import padding as padding_state
from ..runtime.buffer import Padded, apply
from ..runtime.dtypes import overflow_error
from ..runtime.host_copies import host_copy, host_range, keep_host_copy
from . import padding as padding_rules
from ._helpers import (
    check_bounds,
    check_number_fits,
    check_values,
    has_values,
    input_dtype,
    report_values,
    result_dtype,
    structured_out,
    type_name,
    warn,
)
from .creation import linear_steps
from .padding import BY_LOWERING, POINTWISE_CHECKED
from .registry import OutDtype, Promote, Runs, lower

aten = torch.ops.aten
# (numpy dtypes: an array's dtype compares with them in C, with JAX's scalar types in Python)
_INDEX_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))
_MASK_DTYPES = (np.dtype(np.bool_), np.dtype(np.uint8))


# ----------------------------------------------------------------------------- validation
def _reject(reason: str):
    """Defer to PyTorch's own error for these arguments (see the module docstring)."""
    raise TypeError(reason)


def _require_index_dtype(index: jax.Array, op: str) -> None:
    if index.dtype not in _INDEX_DTYPES and index.size:
        _reject(f"{op}: index dtype {index.dtype}")


def _require_same_dtype(x: jax.Array, other, op: str) -> None:
    """(``other`` may be a number: a host 0-dim tensor the dispatcher passed by value.)"""
    if hasattr(other, "dtype") and other.dtype != x.dtype:
        _reject(f"{op}: dtype {other.dtype} != {x.dtype}")


def _out_of_bounds(position: int, value: int, size: int) -> Exception:
    return IndexError(f"index {value} is out of bounds for dimension {position} with size {size}")


def _out_of_range_in_self(position: int, value: int, size: int) -> Exception:
    return IndexError("index out of range in self")


def _wrap_dim(dim: int, ndim: int) -> int:
    return dim + max(ndim, 1) if dim < 0 else dim


def _as_1d(x: jax.Array) -> jax.Array:
    """PyTorch treats a 0-dim tensor as one element along dim 0 in the index ops."""
    return x.reshape(1) if x.ndim == 0 else x


def _at_reduce(x: jax.Array, key, values, reduce: str, mode: str | None = None) -> jax.Array:
    """``x`` with ``values`` combined in at ``key`` (``set``/``sum``/``prod``/``amax``/``amin``).

    Booleans combine as torch does (sum and amax are "or", prod and amin "and"), computed in
    int32 since XLA has no boolean add or multiply."""
    work = x.astype(jnp.int32) if x.dtype == jnp.bool_ else x
    target = work.at[key]
    values = jnp.asarray(values).astype(work.dtype)
    combine = {
        "set": target.set,
        "sum": target.add,
        "prod": target.multiply,
        "amax": target.max,
        "amin": target.min,
    }[reduce]
    return combine(values, mode=mode).astype(x.dtype)


# ----------------------------------------------------------------------------- advanced indexing
_UINT8_MASK_DEPRECATED = (
    "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead."
)


def _check_mask(shape: tuple, dim: int, mask) -> None:
    """CPU's warning and errors for a boolean (or uint8) ``mask`` indexing ``shape`` from ``dim``."""
    if mask.dtype == np.uint8:
        warn(_UINT8_MASK_DEPRECATED)
    if mask.ndim == 0:
        _reject("0-dim mask index")
    if shape[dim : dim + mask.ndim] != mask.shape:
        for k, (mask_size, size) in enumerate(zip(mask.shape, shape[dim:])):
            if mask_size != size:
                raise IndexError(
                    f"The shape of the mask {list(mask.shape)} at index {k} does not "
                    f"match the shape of the indexed tensor {list(shape)} at index {dim + k}"
                )
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}")


@jax.jit
def _count_nonzero(x):
    return jnp.count_nonzero(x)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _listed_nonzero(x, count: int, stacked: bool):
    coordinates = jnp.nonzero(x, size=count)
    return jnp.stack(coordinates, axis=1).astype(jnp.int64) if stacked else coordinates


#: The largest input whose nonzero coordinates are listed on the host: reading it costs less
#: than compiling the device's listing, a program per shape and count
HOST_LISTING_BYTES = 1 << 20


def _coordinates(x, stacked: bool = False):
    """The coordinates of ``x``'s nonzero elements, one array per dim (``stacked``: one
    (count, ndim) matrix): a host sync, as on CUDA, whose count sets the result's shape. A
    small ``x`` (its host copy, or its value read back) is listed on the host and the
    coordinates copied over, no program compiled for any count; a large one is counted, then
    listed at that count on the device."""
    host = host_copy(x)
    x = checks.before_host_read(x)  # (a sync point in fused eager)
    if host is None and x.nbytes <= HOST_LISTING_BYTES:
        host = np.asarray(x)
    if host is None:
        return _listed_nonzero(x, int(_count_nonzero(x)), stacked)
    listed = [c.astype(np.int64) for c in np.nonzero(host)]
    listed = [np.stack(listed, axis=1)] if stacked else listed
    device = x.sharding._device
    coordinates = [transfer.put(c, device) for c in listed]
    for array, c in zip(coordinates, listed):
        keep_host_copy(array, c)
    return coordinates[0] if stacked else tuple(coordinates)


def _advanced_indices(x: jax.Array, indices) -> list[jax.Array | None]:
    """``Tensor?[] indices`` with boolean masks replaced by their nonzero coordinates (a host
    sync), validated and bounds-checked like PyTorch CPU."""
    expanded: list[jax.Array | None] = []
    shape = x.shape
    bounds = []  # (index, the size of the dimension it indexes, negative entries allowed)
    for index in indices:
        if index is None:
            expanded.append(None)
            continue
        dtype = index.dtype
        if dtype in _INDEX_DTYPES:
            if len(expanded) < len(shape):
                bounds.append((index, shape[len(expanded)], True))
            expanded.append(index)
        elif dtype in _MASK_DTYPES:
            _check_mask(shape, len(expanded), index)
            expanded.extend(_coordinates(index))  # (in bounds: the mask has the dims' sizes)
        else:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    if len(expanded) > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
    _indexed_shape(shape, expanded)  # (CPU's IndexError for indices that do not broadcast)
    for index, size, _ in bounds:
        if size == 0 and index.size:  # (no value to read: CPU's message for it)
            raise IndexError("index is out of bounds for dimension with size 0")
    check_bounds(bounds, _out_of_bounds)
    return expanded


def _indexed_shape(shape: tuple, indices: list) -> tuple:
    """The shape of ``x[indices]`` (``indices`` as :func:`_advanced_indices` gives them): the
    index tensors' broadcast shape in place of the dims they index where those are adjacent,
    else in front, as NumPy and PyTorch place it."""
    at = [d for d, index in enumerate(indices) if index is not None]
    if not at:
        return tuple(shape)
    given = [tuple(indices[d].shape) for d in at]
    try:
        broadcast = np.broadcast_shapes(*given)
    except ValueError:
        shapes = ", ".join(str(list(g)) for g in given)
        raise IndexError(
            f"shape mismatch: indexing tensors could not be broadcast together with shapes {shapes}"
        ) from None
    kept = [n for d, n in enumerate(shape) if d not in at]
    if at == list(range(at[0], at[-1] + 1)):
        return (*shape[: at[0]], *broadcast, *kept[at[0] :])
    return (*broadcast, *kept)


def _numpy_key(indices) -> tuple:
    return tuple(slice(None) if index is None else index for index in indices)


@jax.jit
def _take_advanced(x, indices):
    return x[_numpy_key(indices)]


@functools.partial(jax.jit, static_argnums=(3,))
def _put_advanced(x, indices, values, accumulate):
    return _at_reduce(x, _numpy_key(indices), values, "sum" if accumulate else "set")


# Runs.EAGER: a boolean mask index is read on the host (its nonzero coordinates set the output's
# shape); with integer indices the jitted pieces record into fused eager's graph like any op.
@lower(aten.index.Tensor, runs=Runs.EAGER, pad=BY_LOWERING)
def index(x, indices):
    if not indices:
        raise IndexError("at least one index must be provided")
    if type(x) is Padded or any(type(i) is Padded for i in indices):
        return _padded_index(x, indices)
    return apply(_take_advanced, x, tuple(_advanced_indices(x, indices)))


def _logical_shape(value) -> tuple:
    return value.layout.shape if type(value) is Padded else tuple(value.shape)


class _PaddedIndices(NamedTuple):
    """Integer indices of a padded call: the dims they index, the indices, and the logical
    lengths of those dims as a device array (the programs' runtime argument)."""

    dims: tuple
    given: list
    sizes: jax.Array


def _checked_padded_indices(x, indices, operands: tuple) -> _PaddedIndices | None:
    """The integer ``indices`` of ``x`` where some of ``operands`` is padded, checked against the
    logical sizes as :func:`_advanced_indices` checks them; None for a call the padded programs
    do not serve (a mask index, an empty one): it is read unpadded."""
    if len(indices) > len(_logical_shape(x)):
        return None
    if any(i is not None and i.dtype not in _INDEX_DTYPES for i in indices):
        return None
    dims = tuple(d for d, i in enumerate(indices) if i is not None)
    given = [indices[d] for d in dims]
    lengths = tuple(_logical_shape(x)[d] for d in dims)
    if not dims or 0 in lengths or any(0 in _logical_shape(i) for i in given):
        return None
    first_padded = next(v for v in operands if type(v) is Padded)
    sizes = padding_state.sizes_array(lengths, buffer.index_of(first_padded.array))
    if not all(_within(i, n) for i, n in zip(given, lengths)):  # (checked first: it taints the op)
        outside = padding_rules.indexed(_indices_outside, x, dims, given, sizes, checking=True)
        if outside is None:
            return None
        report_values(outside, functools.partial(_report_out_of_bounds, lengths))
    return _PaddedIndices(dims, given, sizes)


def _padded_index(x, indices) -> Padded | None:
    """``x[indices]`` where ``x`` or an integer index is padded (``ops.padding.INDEX``)."""
    checked = _checked_padded_indices(x, indices, (x, *indices))
    if checked is None:
        return None
    return padding_rules.indexed(_take_within, x, checked.dims, checked.given, checked.sizes)


def _padded_put(x, indices, values, accumulate: bool) -> Padded | None:
    """``x[indices] = values`` where an operand is padded (``ops.padding.PUT``): CPU's shape and
    dtype errors over the logical shapes, then the put by the bucket's program."""
    checked = _checked_padded_indices(x, indices, (x, values, *indices))
    if checked is None:
        return None
    _check_put_values(x, list(indices), values)
    program = _add_within if accumulate else _set_within
    return padding_rules.put_indexed(program, x, checked.dims, values, checked.given, checked.sizes)


def _within(index, length: int) -> bool:
    """Whether ``index``'s host copy shows every entry inside [-length, length) (a padded one's
    padding holds 0)."""
    known = host_range(index.array if type(index) is Padded else index)
    return known is not None and -length <= known[0] and known[1] < length


def _key_within(x, dims: tuple, given, lengths) -> tuple:
    """The key indexing ``x`` by ``given`` along ``dims``, negative indices wrapped by the
    logical ``lengths``, not the padded ones."""
    key = [slice(None)] * x.ndim
    for k, (d, index) in enumerate(zip(dims, given)):
        n = lengths[k].astype(index.dtype)
        key[d] = jnp.where(index < 0, index + n, index)
    return tuple(key)


def _take_within(x, dims: tuple, *given, lengths):
    """``x`` indexed by ``given`` along ``dims`` (their padding filled with 0)."""
    return x[_key_within(x, dims, given, lengths)]


def _set_within(x, dims: tuple, values, *given, lengths):
    """``x`` with ``values`` put at ``given`` along ``dims`` (their padding filled with a
    position past every dim: dropped)."""
    return _at_reduce(x, _key_within(x, dims, given, lengths), values, "set", mode="drop")


def _add_within(x, dims: tuple, values, *given, lengths):
    """:func:`_set_within`, accumulating."""
    return _at_reduce(x, _key_within(x, dims, given, lengths), values, "sum", mode="drop")


def _indices_outside(x, dims: tuple, *given, lengths):
    """Per index of ``given``: whether an entry lies outside [-length, length), the first such."""
    bad, first = [], []
    for k, index in enumerate(given):
        n = lengths[k].astype(index.dtype)
        outside = ((index < -n) | (index >= n)).reshape(-1)
        bad.append(outside.any())
        first.append(index.reshape(-1)[jnp.argmax(outside)].astype(jnp.int64))
    return jnp.stack(bad), jnp.stack(first)


def _report_out_of_bounds(lengths: tuple, results) -> None:
    bad, first = results
    for k, length in enumerate(lengths):
        if bad[k]:
            raise _out_of_bounds(k, int(first[k]), length)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _put_masked(x, mask, values, dim: int, accumulate: bool):
    where = mask.astype(jnp.bool_).reshape((1,) * dim + mask.shape + (1,) * (x.ndim - dim - mask.ndim))
    return jnp.where(where, x + values if accumulate else values, x)


def _put_by_mask(x, indices, values, accumulate: bool):
    """``x[mask] = values`` where the one index is a mask and ``values`` broadcasts to the dims
    after the mask's (a number, a row): as ``masked_fill``, where PyTorch's own ``index_put_``
    sends a number, one program per shape and no host sync; None for other calls (their
    result's shape, or CPU's error, needs the mask's count)."""
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) != 1 or given[0][1].dtype not in _MASK_DTYPES or len(indices) > x.ndim:
        return None
    dim, mask = given[0]
    after = x.shape[dim + mask.ndim :]
    shape = tuple(getattr(values, "shape", ()))
    fits = len(shape) <= len(after) and all(v in (1, n) for v, n in zip(reversed(shape), reversed(after)))
    if not fits or getattr(values, "dtype", x.dtype) != x.dtype:
        return None
    _check_mask(x.shape, dim, mask)
    return apply(_put_masked, x, mask, values, dim, accumulate)


@lower(aten.index_put.default, runs=Runs.EAGER, pad=BY_LOWERING)
def index_put(x, indices, values, accumulate=False):
    if any(type(v) is Padded for v in (x, values, *indices)):
        return _padded_put(x, indices, values, accumulate)  # (None: called again, unpadded)
    by_mask = _put_by_mask(x, indices, values, accumulate)
    if by_mask is not None:
        return by_mask
    expanded = _advanced_indices(x, indices)
    _check_put_values(x, expanded, values)
    if all(i is None for i in expanded):  # (CPU's kernels fail on it, each its own way)
        raise RuntimeError("index_put: at least one index tensor must be given")
    return apply(_put_advanced, x, tuple(expanded), values, accumulate)


def _check_put_values(x, indices: list, values) -> None:
    """CPU's errors, in its order, for values that cannot go where ``indices`` point."""
    shape = _indexed_shape(x.shape, indices)
    given = tuple(getattr(values, "shape", ()))
    if len(given) > len(shape) or any(v not in (1, n) for v, n in zip(reversed(given), reversed(shape))):
        raise RuntimeError(
            f"shape mismatch: value tensor of shape {list(given)} cannot be broadcast to indexing "
            f"result of shape {list(shape)}"
        )
    if hasattr(values, "dtype") and values.dtype != x.dtype:
        raise RuntimeError(
            f"Index put requires the source and destination dtypes match, got "
            f"{type_name(x.dtype)} for the destination and "
            f"{type_name(values.dtype)} for the source."
        )


@lower(aten._index_put_impl.default, runs=Runs.EAGER)
def index_put_impl(x, indices, values, accumulate=False, unsafe=False):
    return index_put(x, indices, values, accumulate)


# ----------------------------------------------------------------------------- gather / scatter
def _along(index: jax.Array, dim: int) -> tuple:
    """Coordinates selecting ``index``'s entries along ``dim`` and their own position elsewhere."""
    return tuple(
        index if d == dim else lax.broadcasted_iota(jnp.int32, index.shape, d) for d in range(index.ndim)
    )


def _check_along(x: jax.Array, dim: int, index: jax.Array, op: str) -> None:
    _require_index_dtype(index, op)
    if index.size and index.ndim and x.ndim and index.ndim != x.ndim:
        _reject(f"{op}: index rank")
    size = _as_1d(x).shape[_wrap_dim(dim, x.ndim)]
    check_bounds(
        [(index, size, False)],
        lambda _, value, size: RuntimeError(
            f"index {value} is out of bounds for dimension {dim} with size {size}"
        ),
    )


@lower(
    aten.gather.default,
    check=lambda x, dim, index, sparse_grad=False: _check_along(x, dim, index, "gather"),
    out_dtype=structured_out(input_dtype),
)
def gather(x, dim, index, sparse_grad=False):
    if not index.size:  # torch accepts any empty index
        return jnp.zeros(index.shape, x.dtype)
    return _as_1d(x)[_along(_as_1d(index), _wrap_dim(dim, x.ndim))].reshape(index.shape)


def _scatter_reduce_into(x, dim, index, src, reduce: str):
    """``x`` with ``src`` (cropped to ``index``'s shape, or a scalar) combined in along ``dim``."""
    shape = x.shape
    x, index = _as_1d(x), _as_1d(index)
    if jnp.ndim(src):
        src = _as_1d(src)[tuple(slice(0, n) for n in index.shape)]
    return _at_reduce(x, _along(index, dim), src, reduce).reshape(shape)


_LEGACY_REDUCE = {"add": "sum", "multiply": "prod"}


def _check_scatter(x, dim, index, src, reduce=None):
    if jnp.ndim(src):  # a 0-dim src is a value, cast like torch's scatter.value
        _require_same_dtype(x, src, "scatter")
    _check_along(x, dim, index, "scatter")


def _scatter_lowering(reduce_arg: bool):
    def scatter(x, dim, index, src, reduce="set"):
        if not index.size:
            return x
        reduce = _LEGACY_REDUCE[reduce] if reduce_arg else "set"
        return _scatter_reduce_into(x, _wrap_dim(dim, x.ndim), index, src, reduce)

    return scatter


lower(aten.scatter.src, aten.scatter.value, check=_check_scatter)(_scatter_lowering(reduce_arg=False))
lower(aten.scatter.reduce, aten.scatter.value_reduce, check=_check_scatter)(
    _scatter_lowering(reduce_arg=True)
)


@lower(aten.scatter_add.default, check=_check_scatter)
def scatter_add(x, dim, index, src):
    return _scatter_lowering(reduce_arg=True)(x, dim, index, src, "add")


def _identity(reduce: str, dtype) -> jax.Array:
    """The value a position starts from when ``include_self=False`` leaves ``self`` out."""
    if reduce in ("sum", "mean"):
        return jnp.zeros((), dtype)
    if reduce == "prod" or dtype == jnp.bool_:
        return jnp.asarray(reduce in ("prod", "amin"), dtype)
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.asarray(-jnp.inf if reduce == "amax" else jnp.inf, dtype)
    info = jnp.iinfo(dtype)
    return jnp.asarray(info.min if reduce == "amax" else info.max, dtype)


def _scatter_reduce(x, dim, index, src, reduce, include_self):
    hit = _scatter_reduce_into(jnp.zeros(x.shape, jnp.bool_), dim, index, True, "set")
    if not include_self:
        x = jnp.where(hit, _identity(reduce, x.dtype), x)
    if reduce != "mean":
        return _scatter_reduce_into(x, dim, index, src, reduce)
    total = _scatter_reduce_into(x, dim, index, src, "sum")
    start = jnp.ones(x.shape, x.dtype) if include_self else jnp.where(hit, 0, 1).astype(x.dtype)
    count = _scatter_reduce_into(start, dim, index, jnp.ones(src.shape, x.dtype), "sum")
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return total / count
    return jnp.floor_divide(total, count)


def _check_scatter_reduce(x, dim, index, src, reduce, include_self=True):
    _require_same_dtype(x, src, "scatter_reduce")
    _check_along(x, dim, index, "scatter_reduce")


@lower(aten.scatter_reduce.two, check=_check_scatter_reduce)
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    if not index.size:
        return x
    return _scatter_reduce(x, _wrap_dim(dim, x.ndim), index, src, reduce, include_self)


# ----------------------------------------------------------------------------- index_* ops
def _dim_key(dim: int, index) -> tuple:
    return (slice(None),) * dim + (index,)


def _selected_shape(shape, dim, index) -> tuple:
    return shape[:dim] + (index.size,) + shape[dim + 1 :]


def _index_dim_check(
    op: str, error, negative_ok: bool = False, same_dtype: bool = False, scalar_value: bool = False
) -> Callable:
    """The ``check=`` of an ``index_*`` op: ``index`` a vector of indices (within bounds) into
    ``x``'s dimension ``dim``; the source (``index_add``...) of ``x``'s dtype; a 0-dim value
    (``index_fill``). ``error(position, value, size)`` is the op's out-of-bounds error."""

    def check(x, dim, index, source=None, *_):
        if same_dtype:
            _require_same_dtype(x, source, op)
        if scalar_value and jnp.ndim(source):
            _reject(f"{op}: value must be 0-dim")
        if scalar_value and jnp.iscomplexobj(source) and not jnp.iscomplexobj(x):
            raise RuntimeError(f"{op}_(): Converting complex Scalar to non-complex type is not supported")
        if scalar_value:  # (converted by the kernel before it reads an index)
            _check_value_fits(source, x.dtype, 2)
        _require_index_dtype(index, op)
        if index.ndim > 1:
            _reject(f"{op}: index must be a vector")
        check_bounds(
            [(index, _as_1d(x).shape[_wrap_dim(dim, x.ndim)], negative_ok)],
            lambda position, value, size: error(dim, value, size),
        )

    return check


def _out_of_bounds_for_dim(prefix: str = "") -> Callable:
    return lambda dim, value, size: IndexError(
        f"{prefix}index {value} is out of bounds for dimension {dim} with size {size}"
    )


@lower(aten.index_select.default, check=_index_dim_check("index_select", _out_of_range_in_self))
def index_select(x, dim, index):
    selected = jnp.take(_as_1d(x), _as_1d(index), axis=_wrap_dim(dim, x.ndim))
    return selected.reshape(()) if x.ndim == 0 else selected


def _index_update(x, dim, index, source, reduce):
    dim = _wrap_dim(dim, x.ndim)
    flat, index = _as_1d(x), _as_1d(index)
    if jnp.ndim(source):
        source = source.reshape(_selected_shape(flat.shape, dim, index))
    return _at_reduce(flat, _dim_key(dim, index), source, reduce).reshape(x.shape)


@lower(aten.index_add.default, check=_index_dim_check("index_add", _out_of_range_in_self, same_dtype=True))
def index_add(x, dim, index, source, alpha=1):
    return _index_update(x, dim, index, source * jnp.asarray(alpha, x.dtype), "sum")


@lower(
    aten.index_copy.default,
    check=_index_dim_check("index_copy", _out_of_bounds_for_dim("index_copy_(): "), same_dtype=True),
)
def index_copy(x, dim, index, source):
    return _index_update(x, dim, index, source, "set")


@lower(
    aten.index_fill.int_Scalar,
    aten.index_fill.int_Tensor,
    check=_index_dim_check("index_fill", _out_of_bounds_for_dim(), negative_ok=True, scalar_value=True),
)
def index_fill(x, dim, index, value):
    return _index_update(x, dim, index, value, "set")


def _flat_index_check(op: str, same_dtype: bool = False) -> Callable:
    def check(x, index, source=None, *_):
        if same_dtype:
            _require_same_dtype(x, source, op)
        _require_index_dtype(index, op)
        check_bounds(
            [(index, x.size, True)],
            lambda _, value, size: IndexError(
                f"out of range: tried to access index {value} on a tensor of {size} elements."
            ),
        )

    return check


@lower(aten.take.default, check=_flat_index_check("take"))
def take(x, index):
    return _take_advanced(x.reshape(-1), (index,))


@lower(aten.put.default, check=_flat_index_check("put", same_dtype=True))
def put(x, index, source, accumulate=False):
    return _put_advanced(x.reshape(-1), (index.reshape(-1),), source.reshape(-1), accumulate).reshape(x.shape)


@lower(
    aten.index_reduce.default, check=_index_dim_check("index_reduce", _out_of_range_in_self, same_dtype=True)
)
def index_reduce(x, dim, index, source, reduce, include_self=True):
    """``scatter_reduce`` with ``index`` spread over ``source``'s other dimensions."""
    dim = _wrap_dim(dim, x.ndim)
    source = _as_1d(source)
    along = [1] * source.ndim
    along[dim] = -1
    spread = jnp.broadcast_to(_as_1d(index).reshape(along), source.shape)
    return _scatter_reduce(x, dim, spread, source, reduce, include_self)


# ----------------------------------------------------------------------------- masks
def _require_bool_mask(mask, op: str) -> None:
    if mask.dtype != jnp.bool_:
        _reject(f"{op}: mask must be bool")


@functools.cache
def _fits(dtype: np.dtype) -> Callable:
    """A jitted test of whether a 0-dim value converts to ``dtype`` without CPU's overflow error
    (c10's ``overflows``: an imaginary part, an integer out of range, a finite float past the
    largest ``dtype`` holds)."""

    @jax.jit
    def fits(value):
        if jnp.issubdtype(dtype, jnp.complexfloating) or dtype == jnp.bool_ or value.dtype == jnp.bool_:
            return jnp.array(True)
        ok = jnp.imag(value) == 0 if jnp.iscomplexobj(value) else jnp.array(True)
        real = jnp.real(value)
        if jnp.issubdtype(dtype, jnp.integer):
            info = jnp.iinfo(dtype)
            if jnp.issubdtype(real.dtype, jnp.integer):
                return ok & (real.astype(jnp.int64) >= info.min) & (real.astype(jnp.int64) <= info.max)
            wide = real.astype(jnp.float64)
            return ok & (wide >= float(info.min)) & (wide <= float(info.max))
        if dtype == jnp.float64:
            return ok
        wide = real.astype(jnp.float64)
        return ok & ~(jnp.isfinite(wide) & (jnp.abs(wide) > float(jnp.finfo(dtype).max)))

    return fits


def _check_value_fits(value, dtype: np.dtype, numel: int) -> None:
    """CPU converts a fill value (a number, or a 0-dim tensor's) to ``dtype`` on the host,
    refusing one it cannot hold (``numel``: the filled tensor's, see ``check_scalar``)."""
    if not check_number_fits(value, dtype, numel) and jnp.ndim(value) == 0:
        check_values(_fits(np.dtype(dtype)), [value], lambda: overflow_error(dtype))


def _check_fill_value(x, mask, value):
    _check_value_fits(value, x.dtype, x.size)


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor, check=_check_fill_value, pad=POINTWISE_CHECKED)
def masked_fill(x, mask, value):
    _require_bool_mask(mask, "masked_fill")
    if jnp.ndim(value):
        _reject("masked_fill: value must be 0-dim")
    return jnp.where(mask, jnp.asarray(value).astype(x.dtype), x)


@lower(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    _require_bool_mask(mask, "masked_scatter")
    _require_same_dtype(x, source, "masked_scatter")
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    mask = jnp.broadcast_to(mask, shape)
    if source.size == 0:  # nothing to take (CPU requires an all-False mask then)
        return jnp.broadcast_to(x, shape)
    # the k-th True position (row-major) takes source's k-th element
    position = jnp.cumsum(mask.reshape(-1)) - 1
    taken = source.reshape(-1)[jnp.clip(position, 0, max(source.size - 1, 0))].reshape(shape)
    return jnp.where(mask, taken, x)


@lower(aten.masked_select.default, runs=Runs.HOST)
def masked_select(x, mask):
    _require_bool_mask(mask, "masked_select")
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    return jnp.broadcast_to(x, shape)[jnp.broadcast_to(mask, shape)]


@lower(
    aten.nonzero.default,
    runs=Runs.HOST,
    out_dtype=OutDtype(
        lambda *_: torch.int64,
        lambda want, got: (
            f"nonzero: Expected out tensor to have scalar type Long but got scalar type{type_name(got)}"
        ),
    ),
)
def nonzero(x):
    if x.ndim == 0:
        return jnp.zeros((int(bool(x)), 0), jnp.int64)
    return _coordinates(x, stacked=True)


@lower(aten.nonzero_static.default)
def nonzero_static(x, size, fill_value=-1):
    coordinates = jnp.nonzero(_as_1d(x), size=size, fill_value=fill_value)
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    return jnp.stack(coordinates, axis=1).astype(jnp.int64)


# ----------------------------------------------------------------------------- search
def _searchsorted(boundaries, values, out_int32, right, side=None, sorter=None):
    if sorter is not None:
        boundaries = jnp.take_along_axis(boundaries, sorter, axis=-1)
    dtype = result_dtype(boundaries.dtype, jnp.asarray(values).dtype)
    boundaries, values = boundaries.astype(dtype), jnp.asarray(values, dtype)
    side = "right" if right or side == "right" else "left"
    if boundaries.ndim <= 1:
        found = jnp.searchsorted(boundaries, values, side=side)
    else:
        rows = boundaries.reshape(-1, boundaries.shape[-1])
        found = jax.vmap(lambda row, v: jnp.searchsorted(row, v, side=side))(
            rows, values.reshape(rows.shape[0], -1)
        ).reshape(values.shape)
    return found.astype(jnp.int32 if out_int32 else jnp.int64)


lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar)(_searchsorted)


def _require_vector(boundaries) -> None:
    if boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")


@lower(aten.bucketize.Tensor)
def bucketize(x, boundaries, out_int32=False, right=False):
    _require_vector(boundaries)
    return _searchsorted(boundaries, x, out_int32, right)


@lower(aten.bucketize.Scalar)
def bucketize_scalar(x, boundaries, out_int32=False, right=False):
    _require_vector(boundaries)
    return _searchsorted(boundaries, x, out_int32, right)


# ----------------------------------------------------------------------------- unique & counts
_NOTHING = jnp.zeros((0,), jnp.int64)  # PyTorch returns empty tensors for outputs not asked for


def _unique_outputs(values, inverse, counts, return_inverse, return_counts):
    return (
        values,
        inverse.astype(jnp.int64) if return_inverse else _NOTHING,
        counts.astype(jnp.int64) if return_counts else _NOTHING,
    )


@lower(aten._unique2.default, runs=Runs.HOST)
def unique2(x, sorted=True, return_inverse=False, return_counts=False):
    values, inverse, counts = jnp.unique(x.reshape(-1), return_inverse=True, return_counts=True)
    return _unique_outputs(values, inverse.reshape(x.shape), counts, return_inverse, return_counts)


@lower(aten._unique.default, runs=Runs.HOST)
def unique(x, sorted=True, return_inverse=False):
    return unique2(x, sorted, return_inverse)[:2]


@lower(aten.unique_dim.default, runs=Runs.HOST)
def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    values, inverse, counts = jnp.unique(x, axis=dim, return_inverse=True, return_counts=True)
    return _unique_outputs(values, inverse.reshape(-1), counts, return_inverse, return_counts)


def _unique_consecutive(x, return_inverse, return_counts, dim):
    if dim is None:
        values, inverse, counts = _unique_consecutive(x.reshape(-1), True, True, 0)
        return _unique_outputs(values, inverse.reshape(x.shape), counts, return_inverse, return_counts)
    moved = jnp.moveaxis(x, dim, 0)
    if moved.shape[0] == 0:
        return _unique_outputs(x, _NOTHING, _NOTHING, return_inverse, return_counts)
    rows = (moved[1:] != moved[:-1]).reshape(moved.shape[0] - 1, math.prod(moved.shape[1:]))
    changed = jnp.any(rows, axis=1)
    starts = jnp.concatenate([jnp.array([True]), changed])
    first = np.flatnonzero(np.asarray(starts))
    counts = np.diff(np.append(first, moved.shape[0]))
    values = jnp.moveaxis(moved[first], 0, dim)
    return _unique_outputs(values, jnp.cumsum(starts) - 1, jnp.asarray(counts), return_inverse, return_counts)


lower(aten.unique_consecutive.default, runs=Runs.HOST)(_unique_consecutive)


@lower(aten.unique_dim_consecutive.default, runs=Runs.HOST)
def unique_dim_consecutive(x, dim, return_inverse=False, return_counts=False):
    return _unique_consecutive(x, return_inverse, return_counts, dim)


@lower(aten.bincount.default, runs=Runs.HOST)
def bincount(x, weights=None, minlength=0):
    if x.ndim != 1 or not jnp.issubdtype(x.dtype, jnp.integer) or (x.size and int(x.min()) < 0):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and weights.shape != x.shape:
        raise RuntimeError("weights should be 1-d and have the same length as input")
    length = max(int(x.max()) + 1 if x.size else 0, minlength)
    if weights is None:
        return jnp.bincount(x, length=length).astype(jnp.int64)
    dtype = jnp.float32 if weights.dtype == jnp.float32 else jnp.float64  # as torch CPU
    return jnp.bincount(x, weights.astype(dtype), length=length)


@lower(aten.histc.default, promote=Promote.DEFAULT, promote_args=("self",), pad=None)
def histc(x, bins=100, min=0, max=0, *, types):
    """Equal-width bins over [min, max] (the data's range when min == max), like torch CPU:
    bin = int((x - min) * bins / (max - min)); x == max goes to the last bin. Integer input (which
    CUDA accepts, and Transformers' MoE routing passes to non-CPU devices) is binned as float32."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    low, high = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    data_range = low == high
    low = jnp.where(data_range, jnp.min(x, initial=jnp.inf, where=~jnp.isnan(x)), low)
    high = jnp.where(data_range, jnp.max(x, initial=-jnp.inf, where=~jnp.isnan(x)), high)
    degenerate = low == high
    low, high = jnp.where(degenerate, low - 1, low), jnp.where(degenerate, high + 1, high)
    inside = (x >= low) & (x <= high)
    position = ((x - low) * bins / (high - low)).astype(jnp.int64)
    position = jnp.clip(position, 0, bins - 1)
    counts = (
        jnp.zeros((bins,), x.dtype).at[jnp.where(inside, position, bins)].add(jnp.ones_like(x), mode="drop")
    )
    return counts.astype(types.result)


# ----------------------------------------------------------------------------- histograms
# torch.histogram is histogramdd of the flattened input as one column. Edges come from a bin
# count and a range (the data's own, min to max, when none is given), or are given as tensors.
# An element lands in the last edge at or below it (the rightmost bin includes its right edge);
# elements outside [first edge, last edge] and NaNs are dropped, as CPU does. The checks raise
# CPU's errors (these ops have no meta kernel to replay).
_TYPE_META_NAMES = {
    "float32": "float",
    "float64": "double",
    "float16": "c10::Half",
    "bfloat16": "c10::BFloat16",
}


def _dtype_name(dtype) -> str:
    """A dtype as PyTorch prints a tensor's (``float``), which these messages use."""
    return _TYPE_META_NAMES.get(jnp.dtype(dtype).name) or type_name(dtype)


def _fail(message: str):
    raise RuntimeError(f"torch.histogramdd: {message}")


def _check_histogram_input(x, weight):
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise NotImplementedError(f"\"histogramdd\" not implemented for '{type_name(x.dtype)}'")
    if x.ndim < 2:
        _fail("input tensor should have at least 2 dimensions")
    if weight is not None:
        if weight.dtype != x.dtype:
            _fail(
                "if weight tensor is provided, input tensor and weight tensor should have the same dtype, "
                f"but got input({_dtype_name(x.dtype)}), and weight({_dtype_name(weight.dtype)})"
            )
        if weight.shape != x.shape[:-1]:
            _fail(
                "if weight tensor is provided it should have the same shape as the input tensor excluding "
                f"its innermost dimension, but got input with shape {list(x.shape)} and weight with shape "
                f"{list(weight.shape)}"
            )


def _check_bin_counts(x, bins, range_, weight):
    _check_histogram_input(x, weight)
    dims = x.shape[-1]
    if len(bins) != dims:
        raise RuntimeError(
            "histogramdd: The size of bins must be equal to the innermost dimension of the input."
        )
    for dim, count in enumerate(bins):
        if count <= 0:
            raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {count} for dimension {dim}")
    if range_ is None:
        _check_data_range(x)
        return
    if len(range_) != 2 * dims:
        _fail(
            f"for a {dims}-dimensional histogram range should have {2 * dims} elements, but got {len(range_)}"
        )
    for dim in range(dims):
        _check_range(dim, range_[2 * dim], range_[2 * dim + 1])


def _check_bin_edges(x, bins, weight):
    _check_histogram_input(x, weight)
    dims = x.shape[-1]
    if len(bins) != dims:
        _fail(
            f"expected {dims} sequences of bin edges for a {dims}-dimensional histogram but got {len(bins)}"
        )
    for dim, edge in enumerate(bins):
        if edge.dtype != x.dtype:
            _fail(
                "input tensor and bins tensors should have the same dtype, but got input with dtype "
                f"{_dtype_name(x.dtype)} and bins for dimension {dim} with dtype {_dtype_name(edge.dtype)}"
            )
        if edge.ndim != 1:
            _fail(
                f"bins tensor should have one dimension, but got {edge.ndim} dimensions in the bins tensor "
                f"for dimension {dim}"
            )
        if edge.size == 0:
            _fail(
                "bins tensor should have at least 1 element, but got 0 elements in the bins tensor for "
                f"dimension {dim}"
            )


def _check_range(dim: int, low: float, high: float):
    if not (math.isfinite(low) and math.isfinite(high)):
        _fail(f"dimension {dim}'s range [{low:g}, {high:g}] is not finite")
    if low > high:
        _fail(f"min should not exceed max, but got min {low:g} max {high:g} for dimension {dim}")


@jax.jit
def _data_range(x):
    return jnp.min(x, axis=0), jnp.max(x, axis=0)


def _check_data_range(x):
    """A range taken from the data must be finite (an inf or NaN in the input is an error)."""
    points = x.reshape(-1, x.shape[-1])
    if not points.size or not has_values(points):
        return

    def report(bounds):
        for dim, (low, high) in enumerate(zip(*(np.asarray(b).tolist() for b in bounds))):
            _check_range(dim, low, high)

    report_values(apply(_data_range, points), report)


def _edges_from_counts(x, bins, range_):
    """Each dimension's ``bins + 1`` equally spaced edges over its range (ends widened by 0.5
    when equal, as numpy does), spaced as CPU's linspace spaces them."""
    points = x.reshape(-1, x.shape[-1])
    edges = []
    for dim, count in enumerate(bins):
        if range_ is not None:
            low, high = jnp.float64(range_[2 * dim]), jnp.float64(range_[2 * dim + 1])
        elif points.shape[0]:
            low, high = (
                jnp.min(points[:, dim]).astype(jnp.float64),
                jnp.max(points[:, dim]).astype(jnp.float64),
            )
        else:
            low, high = jnp.float64(0), jnp.float64(1)
        degenerate = low == high
        low, high = jnp.where(degenerate, low - 0.5, low), jnp.where(degenerate, high + 0.5, high)
        edges.append(linear_steps(low, high, count + 1, x.dtype).astype(x.dtype))
    return edges


def _histogramdd(x, edges, weight, density):
    points = x.reshape(-1, x.shape[-1])
    shape = tuple(edge.shape[0] - 1 for edge in edges)
    inside = jnp.ones(points.shape[0], bool)
    flat = jnp.zeros(points.shape[0], jnp.int64)
    for column, edge, bins in zip(points.T, edges, shape):
        inside &= (column >= edge[0]) & (column <= edge[-1])
        position = jnp.searchsorted(edge, column, side="right") - 1
        flat = flat * bins + jnp.clip(position, 0, bins - 1)
    counts = jnp.ones(points.shape[0], x.dtype) if weight is None else weight.reshape(-1)
    size = math.prod(shape)
    hist = jnp.zeros(size, x.dtype).at[jnp.where(inside, flat, size)].add(counts, mode="drop").reshape(shape)
    if density:
        hist = hist / hist.sum()
        for dim, edge in enumerate(edges):
            hist = hist / jnp.diff(edge).reshape([-1 if d == dim else 1 for d in range(len(edges))])
    return hist


@lower(
    aten._histogramdd_from_bin_tensors.default,
    check=lambda x, bins, weight=None, density=False: _check_bin_edges(x, bins, weight),
)
def histogramdd_from_bin_tensors(x, bins, weight=None, density=False):
    return _histogramdd(x, bins, weight, density)


def _check_bin_cts(x, bins, range=None, weight=None, density=False):
    _check_bin_counts(x, bins, range, weight)


@lower(aten._histogramdd_from_bin_cts.default, check=_check_bin_cts)
def histogramdd_from_bin_cts(x, bins, range=None, weight=None, density=False):
    return _histogramdd(x, _edges_from_counts(x, bins, range), weight, density)


@lower(aten._histogramdd_bin_edges.default, check=_check_bin_cts)
def histogramdd_bin_edges(x, bins, range=None, weight=None, density=False):
    return _edges_from_counts(x, bins, range)


def _column(x, weight):
    """torch.histogram's input as histogramdd's: one column (and the weights flattened)."""
    return x.reshape(-1, 1), None if weight is None else weight.reshape(-1)


def _check_histogram_edges(x, bins, weight=None, density=False):
    column, weight = _column(x, weight)
    _check_bin_edges(column, [bins], weight)


def _check_histogram_count(x, bins=100, range=None, weight=None, density=False):
    if weight is not None and weight.shape != x.shape:  # CPU reports the flattened shapes
        _check_histogram_input(x.reshape(-1, 1), weight)
    column, weight = _column(x, weight)
    _check_bin_counts(column, [bins], range, weight)


@lower(aten.histogram.bins_tensor, check=_check_histogram_edges)
def histogram_bins_tensor(x, bins, weight=None, density=False):
    column, weight = _column(x, weight)
    return _histogramdd(column, [bins], weight, density), bins


@lower(aten.histogram.bin_ct, check=_check_histogram_count)
def histogram_bin_ct(x, bins=100, range=None, weight=None, density=False):
    column, weight = _column(x, weight)
    (edges,) = _edges_from_counts(column, [bins], range)
    return _histogramdd(column, [edges], weight, density), edges
