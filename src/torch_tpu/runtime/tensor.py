"""tpu tensors <-> JAX arrays: wrap results, read (possibly strided) views, write in place.

Views are PyTorch's own (sizes/strides/offset computed by the Meta kernels over the shared
storage), so reading a tensor means taking its region out of the storage value, and writing one
means a functional update of that value. Both are jitted per view geometry.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import buffer, checks, memory, native, padding, platform
from .buffer import Deferred, Padded, apply
from .context import context
from .dtypes import JAX_TO_TORCH, TORCH_TO_JAX, cast, to_jax, unsupported
from .flags import flags
from .host_copies import (
    host_copy,
    host_view,
    keep_reshape,
    keep_view_of_host_copy,
    kept_reshape,
    view_on_host,
)
from .lru import cached
from .transfer import device_scalar, first_fill_on_host, small_fill_on_host

_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset
_set_storage_meta = _set_storage._handle.redispatch_boxed


def is_tpu(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "tpu"


def _python_empty(shape, strides, dtype: torch.dtype, nbytes: int, index: int) -> torch.Tensor:
    """``native._C.empty`` without the C++ runtime core: a storage with no handle (null), on
    tpu:0 (the only device without the core)."""
    t = torch._C._acc.create_empty_tensor(shape, dtype)
    if nbytes:
        # The StorageImpl must know its byte size: PyTorch's C++ reads it directly (view bound
        # checks, clone_preserve_strides, serialization). Meta's set_ records it, no allocation.
        storage = t.untyped_storage()
        _set_storage_meta(_META, t, storage, 0, shape, t.stride() if strides is None else strides)
        if storage.nbytes() < nbytes:  # a storage with room beyond the tensor (an append's)
            ensure_storage_nbytes(storage, nbytes)
    return t


#: A tpu tensor of this geometry over a new storage of ``nbytes`` (its value attached after).
_empty = native._C.empty if native.available() else _python_empty


def _no_shortcut(*args: object) -> None:
    return None


if native.available():
    native._C.configure_values(
        buffer.STORAGE_ATTR, buffer.ARRAY_TYPE, Deferred, buffer.StridedView, TORCH_TO_JAX, JAX_TO_TORCH
    )
#: The value of a tensor that is its whole storage in order (contiguous, at offset 0, of the
#: value's shape and dtype; a concrete array or a pending deferred one), else None: the common
#: read of every op in one C++ call (:func:`_view` handles the rest, to the same answer).
whole_value = native._C.whole_value if native.available() else _no_shortcut
#: :func:`read_in_program` while a fused graph records, for a tensor that is its whole storage
#: or a view the core reads (not complex, tpu:0), in one C++ call; else None
_read_recorded = native._C.read_recorded if native.available() else _no_shortcut
#: :func:`wrap` of a committed array or pending deferred value on tpu:0 in one C++ call, else
#: None; ``_wrap_value(value, inputs)``: also None unless every tensor in the tuple ``inputs``
#: is contiguous (:func:`wrap_elementwise`'s common case).
_wrap_value = native._C.wrap_value if native.available() else _no_shortcut
#: ``whole_operands(args, views_read_in_program)``: ``(key, values)`` for an op's positional
#: arguments: a key of each one's dtype, 0-dim-ness and whether it is its whole storage, or its
#: whole storage with axes permuted (or its type, for anything but a tensor), and the arguments
#: with each whole tensor replaced by :func:`whole_value` and, at the positions whose bit is set
#: in ``views_read_in_program``, each permuted one by the StridedView :func:`read_in_program`
#: makes of it; None for more than 8 (the per-op fast path, ``ops/dispatch/kernel.py``)
whole_operands = native._C.whole_operands if native.available() else _no_shortcut


def _create(shape, dtype: torch.dtype, index: int = 0) -> torch.Tensor:
    return _empty(shape, None, dtype, 0, index)


def _new_tensor(shape, dtype: torch.dtype, value: buffer.Value, strides=None) -> torch.Tensor:
    """A tensor over a new storage holding ``value``, on the device that holds the value."""
    index = buffer.index_of(value) if flags.others_used else 0
    t = _empty(shape, strides, dtype, buffer.nbytes(value), index)
    buffer.put(t.untyped_storage(), value)
    return t


def device_index(t: torch.Tensor) -> int:
    """The index of a tpu tensor's device (0 while no other device was used: not asked)."""
    return t.get_device() if flags.others_used else 0


def over_storage(storage, shape, strides, offset: int, dtype: torch.dtype) -> torch.Tensor:
    """A tpu tensor over an existing storage with this geometry: a view PyTorch's own view ops
    did not make (a compiled program's inputs inside its trace, its outputs that alias an input)."""
    t = _create([0], dtype, storage.device.index if flags.others_used else 0)
    _set_storage_meta(_META, t, storage, offset, list(shape), list(strides))
    return t


def wrap(value: jax.Array) -> torch.Tensor:
    """A new contiguous tpu tensor owning a fresh storage that holds ``value``."""
    if type(value) is Padded:
        return wrap_padded(value)
    if not flags.others_used:
        t = _wrap_value(value)
        if t is not None:
            return t
    try:
        dtype = JAX_TO_TORCH[value.dtype]
    except KeyError:
        raise unsupported(value.dtype) from None
    return _new_tensor(value.shape, dtype, value)


def wrap_padded(value: Padded, strides=None) -> torch.Tensor:
    """A new tpu tensor of ``value``'s logical shape over a storage holding the padded value;
    with ``strides`` (a permutation of a dense layout), the storage holds it in that memory
    order, as :func:`wrap_strided` lays out an array."""
    shape = value.layout.shape
    try:
        dtype = JAX_TO_TORCH[value.array.dtype]
    except KeyError:
        raise unsupported(value.array.dtype) from None
    if strides is not None and tuple(strides) != row_major_strides(shape):
        order = memory_order(shape, strides)
        value = padding.permuted(value, order)
    else:
        strides = None
    index = buffer.index_of(value) if flags.others_used else 0
    t = _empty(shape, strides, dtype, math.prod(shape) * value.array.dtype.itemsize, index)
    buffer.put(t.untyped_storage(), padding.made(value))
    return t


def read_keeping_padding(t: torch.Tensor) -> jax.Array | Padded:
    """:func:`read_resolved`, or the padded value of a tensor whose storage holds one (a copy of
    it keeps the padding)."""
    value = buffer.peek(t.untyped_storage())
    if type(value) is Padded and context.trace is None:
        view = read_padded(t, value)
        if view is not None:
            return view
    return read_resolved(t)


def read_padded(t: torch.Tensor, value: Padded) -> Padded | None:
    """Tensor ``t`` of a storage holding padded ``value``, as a padded value (its view read from
    the padded array); None where it must be read unpadded (``padding.plan_view``)."""
    if t.is_conj() or t.is_neg() or value.array.dtype != TORCH_TO_JAX.get(t.dtype):
        return None
    return padding.read_padded(value, tuple(t.shape), t.stride(), t.storage_offset())


def wrap_strided(value: jax.Array, strides) -> torch.Tensor:
    """``wrap(value)`` as a tensor with these strides, a permutation of a dense row-major layout:
    the storage holds ``value`` in memory order (:func:`read` transposes it back)."""
    if type(value) is Padded:
        return wrap_padded(value, strides)
    if 0 in value.shape:  # (no elements: any strides are a layout, as CPU keeps them)
        return wrap_stored(value, value.shape, strides)
    order = memory_order(value.shape, strides)
    return wrap_stored(apply(_transpose, value, order), value.shape, strides)


def memory_order(shape, strides) -> tuple:
    """The dimensions of ``shape`` from the outermost in memory to the innermost, for these
    strides (a permutation of a dense row-major layout): the order a tensor's storage holds its
    elements in (``value.transpose(order)``)."""
    order = _permutation_of_dense(tuple(shape), tuple(strides))
    if order is None:
        raise ValueError(f"strides {tuple(strides)} are not a dense layout of {tuple(shape)}")
    return tuple(order)


def wrap_stored(stored: jax.Array, shape, strides) -> torch.Tensor:
    """A new tpu tensor of ``shape`` and ``strides`` (a permutation of a dense layout) over a
    fresh storage holding ``stored``: its elements already in memory order, as
    :func:`memory_order` transposes them (a program that returns its output so saves the
    transpose :func:`wrap_strided` records)."""
    try:
        dtype = JAX_TO_TORCH[stored.dtype]
    except KeyError:
        raise unsupported(stored.dtype) from None
    return _new_tensor(list(shape), dtype, stored, list(strides))


_transpose = jax.jit(jnp.transpose, static_argnums=1)


def wrap_elementwise(value: jax.Array, inputs) -> torch.Tensor:
    """``wrap(value)`` laid out as PyTorch lays out an elementwise op's output: like its tensor
    ``inputs`` (``x.t() + 1`` is transposed, a channels-last input gives a channels-last output);
    contiguous when they all are. Other values in ``inputs`` are ignored."""
    if not flags.others_used:
        t = _wrap_value(value, inputs)  # (the common case in one call: contiguous inputs)
        if t is not None:
            return t
    for x in inputs:
        if isinstance(x, torch.Tensor) and not x.is_contiguous():
            break
    else:
        return wrap(value)
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    strides = _elementwise_strides(
        tuple(value.shape), tuple((tuple(t.shape), t.stride(), t.element_size()) for t in tensors)
    )
    return wrap(value) if strides is None else wrap_strided(value, strides)


def like_strides(t: torch.Tensor, memory_format=None) -> tuple | None:
    """The strides of ``torch.empty_like(t, memory_format=memory_format)`` on CPU (``None``
    means preserve: a dense ``t``'s own strides, else dense ones in ``t``'s order of strides),
    or None for contiguous."""
    return strides_like(tuple(t.shape), t.stride(), memory_format)


def strides_like(shape: tuple, strides: tuple, memory_format=None) -> tuple | None:
    """:func:`like_strides` of a tensor of this ``shape`` and ``strides``."""
    preserved = memory_format in (None, torch.preserve_format, torch.contiguous_format)
    if preserved and is_row_major(shape, strides):
        return None
    return _like_strides(shape, strides, memory_format or torch.preserve_format)


@cached
def _like_strides(shape: tuple, strides: tuple, memory_format) -> tuple | None:
    # (computed here as CPU's C++ computes it: the Meta kernel of empty_like is a Python
    # reference whose first call imports sympy, half a second)
    if memory_format is not torch.preserve_format:
        like = torch.empty(shape, device="meta", memory_format=memory_format).stride()
    elif _non_overlapping_and_dense(shape, strides):
        like = strides
    else:  # dense strides in the tensor's order (``at::infer_dense_strides``, TensorIterator's)
        like = _elementwise_strides(shape, ((shape, strides, 1),))
        if like is None:
            return None
    return None if is_row_major(shape, like) else tuple(like)


def _non_overlapping_and_dense(shape: tuple, strides: tuple) -> bool:
    """``TensorImpl::compute_non_overlapping_and_dense``: the elements fill a block of memory
    exactly once, in some order of dimensions (an empty tensor does)."""
    return 0 in shape or _permutation_of_dense(shape, strides) is not None


def is_row_major(shape: tuple, strides: tuple) -> bool:
    """Exactly PyTorch's contiguous strides, those of length-1 dimensions included: they decide
    the format a later kernel suggests (a 1-channel NHWC tensor stays channels-last)."""
    step = 1
    for n, stride in zip(reversed(shape), reversed(strides)):
        if stride != step:
            return False
        step *= max(n, 1)
    return True


def wrap_like(value: jax.Array, t: torch.Tensor, memory_format=None) -> torch.Tensor:
    """``wrap(value)`` laid out as ``torch.empty_like(t, memory_format=memory_format)`` would be."""
    strides = like_strides(t, memory_format)
    return wrap(value) if strides is None else wrap_strided(value, strides)


@cached
def _elementwise_strides(shape: tuple, operands: tuple) -> tuple | None:
    """The strides TensorIterator gives the output of ``shape`` computed from ``operands``
    ((shape, strides, itemsize) each; those that do not broadcast to ``shape`` take no part), or
    None for contiguous. Mirrors ``TensorIteratorBase``'s fast setup (inputs of the output's
    shape all contiguous, all channels-last, or all dense with equal strides), else
    ``compute_strides`` + ``reorder_dimensions`` + ``allocate_or_resize_outputs``."""
    ndim = len(shape)
    operands = [o for o in operands if _broadcasts_to(o[0], shape)]
    if ndim <= 1 or not operands:
        return None
    if all(o[0] == shape for o in operands):
        strides = _fast_setup_strides(shape, operands)
        if strides is not _NO_FAST_SETUP:
            return strides
    perm = _dimension_order(shape, [_broadcast_byte_strides(shape, *o) for o in operands])
    return None if perm == list(reversed(range(ndim))) else _dense_strides(shape, perm)


def _broadcasts_to(op_shape: tuple, shape: tuple) -> bool:
    ndim = len(shape)
    return len(op_shape) <= ndim and all(n in (1, m) for n, m in zip(op_shape, shape[ndim - len(op_shape) :]))


#: :func:`_fast_setup_strides`'s answer when no fast setup applies
_NO_FAST_SETUP = object()


def _fast_setup_strides(shape: tuple, operands: list):
    """TensorIterator's fast setup for operands all of the output's ``shape``: None when all
    are contiguous, channels-last strides when all are channels-last, their strides when all
    share one dense layout, else :data:`_NO_FAST_SETUP`."""
    layouts = [torch.empty_strided(o[0], o[1], device="meta") for o in operands]
    if all(t.is_contiguous() for t in layouts):
        return None
    if all(t.is_contiguous(memory_format=torch.channels_last) for t in layouts):
        return torch.empty(shape, device="meta", memory_format=torch.channels_last).stride()
    if len({o[1] for o in operands}) == 1 and _permutation_of_dense(shape, operands[0][1]):
        return operands[0][1]
    return _NO_FAST_SETUP


def _broadcast_byte_strides(shape: tuple, op_shape: tuple, op_strides: tuple, itemsize: int) -> list:
    """An operand's strides in bytes over the output's dimensions (a broadcast dimension's is
    0: it orders nothing)."""
    offset = len(shape) - len(op_shape)
    return [0] * offset + [
        0 if n == 1 and shape[offset + i] != 1 else s * itemsize
        for i, (n, s) in enumerate(zip(op_shape, op_strides))
    ]


def _dimension_order(shape: tuple, byte_strides: list) -> list:
    """The output's dimensions, fastest-moving first (``reorder_dimensions``): an insertion sort
    by the operands' strides that tolerates ambiguous comparisons."""
    perm = list(reversed(range(len(shape))))
    for i in range(1, len(shape)):
        dim1 = i
        for dim0 in reversed(range(i)):
            comparison = _compare_dims(shape, byte_strides, perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    return perm


def _compare_dims(shape: tuple, byte_strides: list, dim0: int, dim1: int) -> int:
    """1 when ``dim0`` moves slower than ``dim1`` (swap them), -1 when faster, 0 when no
    operand tells them apart (the first operand that does, with nonzero strides on both, decides)."""
    for strides in byte_strides:
        s0, s1 = strides[dim0], strides[dim1]
        if s0 == 0 or s1 == 0:
            continue
        if s0 != s1:
            return -1 if s0 < s1 else 1
        if shape[dim0] > shape[dim1]:
            return 1
    return 0


def _dense_strides(shape: tuple, perm: list) -> tuple:
    """Dense strides laying out the dimensions in ``perm`` order, the first the fastest."""
    strides, step = [0] * len(shape), 1
    for d in perm:
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


def empty(shape, dtype: torch.dtype, strides=None, index: int | None = None) -> torch.Tensor:
    """A tpu tensor on ``tpu:index`` (default: the factory's, ``platform.placing``) whose
    storage is not allocated until something reads it."""
    jdtype = to_jax(dtype)
    shape = tuple(shape)
    if any(s < 0 for s in shape):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(shape)}")
    if strides is None:
        size = math.prod(shape)
    else:
        size = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, strides))
        strides = list(strides)
    memory.check_allocation(size * jdtype.itemsize)  # here, not at the first use
    if index is None:
        index = context.index
    elif index:
        platform.use(index)
    return _new_tensor(list(shape), dtype, buffer.Uninitialized(size, jdtype, index), strides)


def ensure_nbytes(t: torch.Tensor) -> None:
    """Make the StorageImpl report the value's size after the value grew (``resize_``)."""
    ensure_storage_nbytes(t.untyped_storage())


def ensure_storage_nbytes(storage, need: int | None = None) -> None:
    if need is None:
        need = buffer.nbytes(buffer.get(storage))
    if storage.nbytes() < need:
        if native.available():  # a new handle spanning the new size (the value already has it)
            storage.resize_(need)
            return
        scratch = _create([0], torch.uint8)
        _set_storage.redispatch(_META, scratch, storage, 0, [need], [1])


def resize_storage(storage, nbytes: int) -> None:
    """``storage.resize_(nbytes)`` on the value: its first bytes are kept (as CPU keeps them),
    new ones are zeros; an empty or unwritten storage stays unwritten (no buffer is made)."""
    value = buffer.get(storage)
    if buffer.nbytes(value) == nbytes:
        return
    dtype = np.dtype(value.dtype)
    if nbytes % dtype.itemsize:
        dtype = np.dtype(np.uint8)
    size = nbytes // dtype.itemsize
    if type(value) is buffer.Uninitialized or buffer.nbytes(value) == 0 or nbytes == 0:
        buffer.put(storage, buffer.Uninitialized(size, dtype))
    else:
        buffer.put(storage, apply(_resized, storage_array(storage, dtype), size))


@functools.partial(jax.jit, static_argnums=1)
def _resized(flat: jax.Array, size: int) -> jax.Array:
    flat = flat.reshape(-1)
    if size <= flat.size:
        return flat[:size]
    return jnp.concatenate([flat, jnp.zeros((size - flat.size,), flat.dtype)])


# ----------------------------------------------------------------------------- reads
def _bit_carrier(dtype: np.dtype) -> np.dtype:
    """The dtype whose bits ``lax.bitcast_convert_type`` moves for ``dtype`` (it refuses bool and
    complex): bytes for bool, the real part's type for complex (stored as interleaved pairs)."""
    if dtype == jnp.bool_:
        return np.dtype(jnp.uint8)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return np.dtype(jnp.finfo(dtype).dtype)
    return np.dtype(dtype)


@functools.partial(jax.jit, static_argnums=(1,))
def _reinterpret(flat: jax.Array, dtype: np.dtype) -> jax.Array:
    """Flat array with the same bytes as ``flat``, seen as ``dtype`` (``x.view(dtype)``)."""
    flat = flat.reshape(-1)
    if flat.dtype == jnp.bool_:
        flat = flat.astype(jnp.uint8)
    elif jnp.issubdtype(flat.dtype, jnp.complexfloating):
        flat = jnp.stack([flat.real, flat.imag], axis=-1).reshape(-1)
    target = _bit_carrier(dtype)
    src, dst = flat.dtype.itemsize, target.itemsize
    if src > dst:
        out = lax.bitcast_convert_type(flat, target).reshape(-1)
    elif src < dst:
        out = lax.bitcast_convert_type(flat.reshape(-1, dst // src), target)
    else:
        out = lax.bitcast_convert_type(flat, target)
    if dtype == jnp.bool_:
        return out.astype(jnp.bool_)
    if target != dtype:  # complex: interleaved (real, imag) pairs
        return lax.complex(out[0::2], out[1::2])
    return out


def _stored_array(storage, reader: tuple | None = None) -> jax.Array | Deferred:
    """``buffer.get_array``, with an unwritten storage's zeros built on the host where they are
    small (``small_fill_on_host``), or while storages of its size are one-offs (the fills'
    rule, ``first_fill_on_host``): a program compiled per size otherwise, for
    ``torch.empty(n).uniform_()`` at each new ``n``. The zeros take the shape ``reader`` (the
    first reader's, when it reads the whole storage in order, as that ``uniform_`` does),
    which then reads them as they are: no view program per shape."""
    value = buffer.peek(storage)
    if type(value) is buffer.Uninitialized:
        if reader is None or math.prod(reader) != value.size:
            reader = (value.size,)
        zeros = small_fill_on_host(reader, 0, value.dtype, value.index)
        if zeros is None:
            zeros = first_fill_on_host(reader, 0, value.dtype, value.index)
        if zeros is not None:
            buffer.put(storage, zeros)
    return buffer.get_array(storage, reader)


def storage_array(storage, dtype: np.dtype, reader: tuple | None = None) -> jax.Array:
    """The storage value as elements of ``dtype`` (reinterpreting bytes if a view changed dtype);
    ``reader``: the shape of a tensor reading all of it in order (:func:`_stored_array`)."""
    value = _stored_array(storage, reader)
    if value.dtype != dtype:
        if (value.size * value.dtype.itemsize) % dtype.itemsize:
            raise RuntimeError("tpu: storage size is not a multiple of the viewed dtype's size")
        value = apply(_reinterpret, value, dtype)
        buffer.put(storage, value)  # the next reader most likely uses the same dtype
    return value


def _permutation_of_dense(shape, strides):
    """Axis order if (shape, strides) is a permutation of a dense row-major layout, else None."""
    order = sorted(range(len(shape)), key=lambda d: -strides[d])
    expected = 1
    for d in reversed(order):
        if shape[d] != 1 and strides[d] != expected:
            return None
        expected *= shape[d]
    return order


def _flat_indices(shape, strides, offset):
    index = jnp.full(shape, offset, dtype=jnp.int64)
    for d, (n, s) in enumerate(zip(shape, strides)):
        if n > 1 and s:
            index = index + lax.broadcasted_iota(jnp.int64, shape, d) * s
    return index


def _read_view(buf: jax.Array, shape, strides, offset) -> jax.Array:
    """The elements of a view (``shape``, ``strides``, starting at ``offset`` or 0 for None) of
    the flat storage array ``buf``."""
    offset = 0 if offset is None else offset
    flat = buf.reshape(-1)
    numel = math.prod(shape)
    if numel == 0:
        return jnp.zeros(shape, buf.dtype)
    order = _permutation_of_dense(shape, strides)
    if order is not None:
        dense = lax.dynamic_slice(flat, (offset,), (numel,))
        permuted = dense.reshape([shape[d] for d in order])
        return permuted.transpose(np.argsort(order))
    return flat[_flat_indices(shape, strides, offset)]


def reading_views(fn: Callable, positions: Sequence[int] | None = None) -> Callable:
    """``fn`` (a function traced into a program) first reading the views
    (:func:`read_in_program`) among its positional arguments (those at ``positions``; None:
    any), and in lists of them (``cat``'s tensors)."""

    def run(*values, **kwargs):
        values = list(values)
        for i in range(len(values)) if positions is None else positions:
            value = values[i]
            if type(value) is _STRIDED:
                values[i] = _read_strided(value)
            elif type(value) is list and _STRIDED in map(type, value):
                values[i] = [_read_strided(v) if type(v) is _STRIDED else v for v in value]
        return fn(*values, **kwargs)

    return functools.wraps(fn)(run)


_STRIDED = buffer.StridedView


def _read_strided(view: _STRIDED) -> jax.Array:
    return _read_view(view.buf, view.shape, view.strides, view.start)


# The storage offset is a runtime argument, not part of the compiled program: views that differ
# only in where they start (``x[i]``, a KV cache read at each position) share one executable.
# Views at the start (None) need no offset input: most are (reshapes, transposes).
_strided_read = jax.jit(_read_view, static_argnums=(1, 2))


def _view(t: torch.Tensor) -> tuple:
    """(storage array, None) for a tensor that is its whole storage in order, else (storage
    array, (shape, strides, start)): the read a view needs."""
    buf = whole_value(t)
    if buf is not None:
        return buf, None
    storage = t.untyped_storage()
    buf = getattr(storage, buffer.STORAGE_ATTR)
    if type(buf) is Padded and context.padding_reads:  # (an op with a padding rule reading it)
        view = read_padded(t, buf)
        if view is not None:
            return view, None
    # the common case first: an array of the tensor's dtype (``aval``: what its properties read)
    if type(buf) is not buffer.ARRAY_TYPE or buf.aval.dtype != TORCH_TO_JAX.get(t.dtype):
        buf = storage_array(storage, to_jax(t.dtype), _unwritten_reader(t, buf))
    shape = t.shape
    offset = t.storage_offset()
    if offset == 0 and buf.shape == shape and t.is_contiguous():
        return buf, None
    shape, strides = tuple(shape), t.stride()
    if 1 in shape:
        strides = _addressing_strides(shape, strides)
    return buf, (shape, strides, device_scalar(offset, device_index(t)) if offset else None)


def _unwritten_reader(t: torch.Tensor, stored: buffer.Value) -> tuple | None:
    """``t``'s shape where its storage's value ``stored`` is unwritten and ``t`` reads it from
    the start in order (the zeros are then made in that shape), else None: a cheap test first,
    as fused eager reads every recorded value through here."""
    if type(stored) is not buffer.Uninitialized or t.storage_offset() or not t.is_contiguous():
        return None
    return tuple(t.shape)


def read(t: torch.Tensor) -> jax.Array:
    """The value of a tpu tensor (any view of any storage) as a JAX array."""
    buf, view = _view(t)
    return buf if view is None else _read_apart(t, buf, view)


def _read_apart(t: torch.Tensor, buf: buffer.Value, view: tuple) -> jax.Array:
    """View ``t`` of storage array ``buf`` read by a program of its own (one executable per view
    geometry); a view of a value with a host copy keeps its own (bounds checks read it)."""
    host = host_copy(buf)
    whole = _reshapes_whole(t, buf, view)
    if host is not None and whole:
        # a reshape of indices from the host, read again at every step (a loss's flattened
        # targets): computed once, now (its input is ready), and kept with the immutable array
        value = kept_reshape(buf, view[0])
        if value is None:
            value = _strided_read(buf, *view)
            keep_view_of_host_copy(value, host, t)
            keep_reshape(buf, view[0], value)
        return value
    value = apply(_strided_read, buf, *view)
    if host is not None:  # (the storage keeps its array, which has the host copy)
        keep_view_of_host_copy(value, host, t)
    elif whole and type(value) in _STORABLE:
        buffer.put(t.untyped_storage(), value)  # (the next reads of this shape: no program)
    return value


_STORABLE = (buffer.ARRAY_TYPE, Deferred)  # (not a compiled program's tracer)


def _reshapes_whole(t: torch.Tensor, buf: buffer.Value, view: tuple) -> bool:
    """Whether ``t`` is its whole storage's concrete array in another shape (a bias's gradient,
    summed with keepdim then viewed flat, read by every optimizer op): the storage may then keep
    the value in ``t``'s shape. (A value a graph still computes keeps its producer's shape: the
    graph reads it in place, and its structure must not depend on which views were read.)"""
    whole = view[2] is None and math.prod(view[0]) == buf.size
    return whole and type(buf) is buffer.ARRAY_TYPE and t.is_contiguous()


def host_value(t: torch.Tensor) -> np.ndarray | None:
    """The value of tpu tensor ``t`` (any view) from its storage's host copy
    (``host_copies.host_copy``: read-only, no device read), or None where its storage has none."""
    buf = whole_value(t)
    if buf is not None:
        return host_copy(buf)
    storage = t.untyped_storage()
    buf = buffer.get(storage)
    host = host_copy(buf)
    if host is None or host.dtype != TORCH_TO_JAX.get(t.dtype) or host.nbytes != storage.nbytes():
        return None  # (a storage read in another dtype than its value's)
    return host_view(host, t)


#: The largest storage a view is read through on the host (:func:`read_on_host`): reading it on
#: the device compiles a program per view geometry (a generated sequence of each new length in
#: its bucket, ``x[:n]`` for each ``n``), and copying this much costs less than one compile.
WHOLE_HOST_READ_BYTES = 1 << 20


def read_on_host(t: torch.Tensor) -> np.ndarray | None:
    """The value of tpu view ``t`` for a copy to the host, read through its whole storage (its
    host copy, else the storage's array copied whole) and viewed there, so that no program is
    compiled for the view; None where the device reads it instead (:func:`read_resolved`): ``t``
    is all of its storage in order and in its value's dtype (:func:`_is_whole_reshape`), has lazy
    conjugate/negative bits, or its storage is larger than :data:`WHOLE_HOST_READ_BYTES`. (A view
    in another dtype, such as the bytes ``torch.save`` writes, is reinterpreted on the host.)

    Example::

        >>> x = torch.arange(6, device="tpu")
        >>> read_on_host(x[1:4])
        array([1, 2, 3])
    """
    storage = t.untyped_storage()
    stored = buffer.peek(storage)
    if type(stored) is Padded and not (t.is_conj() or t.is_neg()):
        return view_on_host(_padded_on_host(stored), t)  # (any size: cut on the host)
    if storage.nbytes() > WHOLE_HOST_READ_BYTES or t.is_conj() or t.is_neg():
        return None
    value, dtype = _stored_array(storage, _unwritten_reader(t, stored)), TORCH_TO_JAX.get(t.dtype)
    if dtype is None or (value.dtype == dtype and _is_whole_reshape(t, storage)):
        return None  # (a dtype tpu has no storage for: the device read raises PyTorch's error)
    array = checks.before_host_read(value)  # (runs a pending graph)
    host = host_copy(array)
    return view_on_host((np.asarray(array) if host is None else host).reshape(-1), t)


def _padded_on_host(value: Padded) -> np.ndarray:
    """The logical elements of padded ``value``, flat, on the host: its host copy, or the padded
    array copied over, cut there (no program for any size)."""
    if value.host is not None:
        return value.host.reshape(-1)
    array = checks.before_host_read(value.array)
    host = host_copy(array)
    return padding.unpad_host(np.asarray(array) if host is None else host, value.layout).reshape(-1)


def _is_whole_reshape(t: torch.Tensor, storage) -> bool:
    """Whether ``t`` is all of its storage in order (in its value's shape or another): the
    device reads such a view once and the storage keeps it in ``t``'s shape for the ops that
    read it next (:func:`_read_apart`)."""
    return t.is_contiguous() and not t.storage_offset() and t.numel() * t.element_size() == storage.nbytes()


def read_in_program(t: torch.Tensor) -> jax.Array | buffer.StridedView:
    """:func:`read` for the program of the op that takes ``t``: a view may come as a
    :class:`~torch_tpu.runtime.buffer.StridedView` that the op's program reads itself
    (:func:`reading_views`), costing no program or graph node of its own:

    - while a fused graph records, every view;
    - in strict eager, its whole storage with axes permuted (``w.t()``, ``x.transpose(1, 2)``):
      the op reads it transposed (a matmul of ``w.t()`` needs no copy of ``w``), and there are
      few such geometries per shape. Other views (reshapes, slices) are read apart, by one
      executable per view geometry shared by every op that takes such a view (reading each
      inside every op's program would compile one per op and geometry).

    A compiled program's trace reads every view inline."""
    if context.recorder is not None and context.trace is None:
        value = _read_recorded(t)
        if value is not None:
            return value
    buf, view = _view(t)
    if view is None:
        return buf
    shape, strides, start = view
    if context.trace is None and (
        context.recorder is not None or (start is None and _is_whole_permutation(buf.shape, shape, strides))
    ):
        return buffer.StridedView(buf, start, shape, strides)
    return _read_apart(t, buf, view)


@cached
def _is_whole_permutation(storage_shape: tuple, shape: tuple, strides: tuple) -> bool:
    """Whether the view is its whole storage with axes permuted, not merely reshaped (reshapes
    are read apart: one executable per shape, shared by every op)."""
    if math.prod(storage_shape) != math.prod(shape):
        return False
    order = _permutation_of_dense(shape, strides)
    return order is not None and order != sorted(order)


@cached
def _addressing_strides(shape: tuple, strides: tuple) -> tuple:
    """``strides`` with those of size-1 dims, which address nothing, made row-major's: the last
    token of a growing sequence, ``ids[:, -1:]``, is then one view geometry at every length."""
    return tuple(r if n == 1 else s for n, s, r in zip(shape, strides, row_major_strides(shape)))


# ----------------------------------------------------------------------------- appends
#: the smallest capacity an append gives its result's storage, in elements
SMALLEST_CAPACITY = 64


@functools.partial(jax.jit, static_argnums=1)
def _append(buf: jax.Array, capacity: int, length: jax.Array, *tails: jax.Array) -> jax.Array:
    flat = _resized(buf, capacity)
    tail = jnp.concatenate([cast(t, flat.dtype).reshape(-1) for t in tails])
    return lax.dynamic_update_slice(flat, tail, (length,))


def append(head: torch.Tensor, tails: list[torch.Tensor], shape: list[int]) -> torch.Tensor:
    """A new contiguous tensor of ``shape`` holding ``head``'s elements (a contiguous tensor at
    the start of its storage) followed by ``tails``'. Its storage gets room to grow (the next
    power of two of elements), and ``head``'s length is a runtime value: a sequence that grows a
    few elements at a time keeps one storage shape and one executable until it fills that room.
    """
    numel = math.prod(shape)
    capacity = max(SMALLEST_CAPACITY, 1 << (numel - 1).bit_length())
    dtype = to_jax(head.dtype)
    buf = storage_array(head.untyped_storage(), dtype)
    length = device_scalar(head.numel(), device_index(head))
    value = apply(_append, buf, capacity, length, *(read(t) for t in tails))
    return _new_tensor(shape, head.dtype, value)  # (the storage's size: all its room)


def row_major_strides(shape) -> tuple:
    """PyTorch's contiguous strides for ``shape`` (see :func:`is_row_major`)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def read_resolved(t: torch.Tensor) -> jax.Array:
    """:func:`read` with the tensor's lazy conjugate/negative bits applied. PyTorch hands kernels
    that natively handle them (copies, matmuls, norms...) such views unresolved."""
    value = read(t)
    if t.is_conj():
        value = apply(_conj, value)
    if t.is_neg():
        value = apply(_negative, value)
    return value


_conj, _negative = jax.jit(jnp.conj), jax.jit(jnp.negative)


# ----------------------------------------------------------------------------- writes
def _write_view(buf: jax.Array, value: jax.Array, shape, strides, offset) -> jax.Array:
    """The flat storage array ``buf`` with its view (``shape``, ``strides``, starting at
    ``offset``) set to ``value``, cast to ``buf``'s dtype and broadcast to ``shape``."""
    flat = buf.reshape(-1)
    value = jnp.broadcast_to(cast(value, buf.dtype), shape)
    if _permutation_of_dense(shape, strides) == list(range(len(shape))):
        return lax.dynamic_update_slice(flat, value.reshape(-1), (offset,))
    return flat.at[_flat_indices(shape, strides, offset).reshape(-1)].set(value.reshape(-1))


_strided_write = jax.jit(_write_view, static_argnums=(2, 3))


@functools.partial(jax.jit, static_argnums=(1, 2, 5, 6))
def _copy_strided(
    buf: jax.Array, shape, strides, offset, source: jax.Array, source_shape, source_strides, start
) -> jax.Array:
    """:func:`_write_view` of the view (``source_shape``, ``source_strides``, ``start``) of the
    flat storage array ``source`` (which may be ``buf``: both are read before the write), read
    in the same program. Like :func:`_strided_read`, the offsets are runtime arguments: a copy
    from row ``i`` to row ``j`` is one executable for every ``i`` and ``j``."""
    value = _read_view(source, source_shape, source_strides, start)
    return _write_view(buf, value, shape, strides, offset)


#: the storage values a view copy (:func:`write_view`) reads and writes in its program
_PLAIN = (buffer.ARRAY_TYPE, Deferred)


def write_view(t: torch.Tensor, src: torch.Tensor) -> bool:
    """``t.copy_(src)`` of tpu tensors on one device in one program, where ``src`` is a view read
    by a program of its own (:func:`_read_apart`) and ``t`` a part of its storage (``x[i] =
    y[j]`` at each step of a loop): reading the view apart, then writing it, dispatches two.
    False, writing nothing, for any other copy (:func:`write` takes it): a target that is its
    whole storage, a storage of another dtype (read reinterpreted), a padded or uninitialized
    one, lazy conjugate/negative bits (:func:`read_resolved`), tensors of two devices. The
    caller checks the shapes and overlap first (``overlap.check_writes``); a source sharing
    the target's storage is read before the write, as a copy of it would be.

    Example::

        >>> x, y = torch.zeros(4, 3, device="tpu"), torch.rand(8, 3, device="tpu")
        >>> write_view(x[1], y[5])  # one program: x's storage with y[5] as its row 1
        True
    """
    source = _copy_source(t, src)
    if source is None:
        return False
    target = _copy_target(t)
    if target is None:
        return False
    offset = device_scalar(t.storage_offset(), device_index(t))
    value = apply(_copy_strided, target, tuple(t.shape), t.stride(), offset, *source)
    buffer.put(t.untyped_storage(), value)
    return True


def _copy_source(t: torch.Tensor, src: torch.Tensor) -> tuple | None:
    """(storage array, shape, strides, start) of the view ``src`` that :func:`write_view` reads
    into ``t``; None where the copy is :func:`write`'s (see there)."""
    if src.is_conj() or src.is_neg() or device_index(src) != device_index(t):
        return None
    stored = buffer.peek(src.untyped_storage())
    if type(stored) not in _PLAIN or stored.dtype != TORCH_TO_JAX.get(src.dtype):
        return None
    buf, view = _view(src)
    return None if view is None else (buf, *view)


def _copy_target(t: torch.Tensor) -> buffer.Value | None:
    """The storage array :func:`write_view` writes ``t`` into: one of ``t``'s dtype of which ``t``
    is a part; else None."""
    if t.is_conj() or t.is_neg():
        return None
    storage = t.untyped_storage()
    stored = buffer.peek(storage)
    dtype = TORCH_TO_JAX.get(t.dtype)
    if type(stored) not in _PLAIN or stored.dtype != dtype or _is_whole(t, stored, dtype):
        return None
    return buffer.get_array(storage)  # (a deferred value whose graph has run: its array)


def _is_whole(t: torch.Tensor, current: buffer.Value, dtype: np.dtype) -> bool:
    """Whether ``t`` is all of its storage (value ``current``, seen as ``dtype``) in order."""
    return (
        t.storage_offset() == 0 and t.is_contiguous() and t.numel() * dtype.itemsize == buffer.nbytes(current)
    )


@functools.partial(jax.jit, static_argnums=(1, 2))
def fill(value: jax.Array, shape: tuple, dtype) -> jax.Array:
    """``value`` cast to ``dtype`` (as CPU casts) and broadcast to ``shape``: a strongly typed
    array even from a weakly typed scalar of that dtype (a storage's value is never weak: the
    programs reading it would compile once more for its weak type)."""
    return jnp.broadcast_to(lax.convert_element_type(cast(value, dtype), dtype), shape)


def _writes_padded_whole(t: torch.Tensor, value: Padded) -> bool:
    """Store padded ``value`` as ``t``'s storage value where ``t`` is that whole storage in order,
    of the value's logical shape and dtype (an in-place op's result); False otherwise."""
    storage = t.untyped_storage()
    whole = (
        t.storage_offset() == 0
        and t.is_contiguous()
        and tuple(t.shape) == value.layout.shape
        and value.array.dtype == TORCH_TO_JAX.get(t.dtype)
        and t.numel() * t.element_size() == storage.nbytes()
    )
    if whole:
        buffer.put(storage, padding.made(value))
    return whole


def write_whole(t: torch.Tensor, value) -> bool:
    """Store ``value`` (an op's result) as the new value of ``t``'s storage if ``t`` is that whole
    storage, of the value's shape and dtype (in one C++ check: the common case of every in-place
    op and optimizer update); False, storing nothing, otherwise."""
    kind = type(value)
    if kind is Deferred or kind is buffer.ARRAY_TYPE:
        current = whole_value(t)
        if current is not None and value.shape == current.shape and value.dtype == current.dtype:
            buffer.put(t.untyped_storage(), value)
            return True
    return False


def write(t: torch.Tensor, value) -> None:
    """``t[...] = value`` (broadcast and cast to ``t``'s dtype) as an update of its storage value."""
    if write_whole(t, value):
        return
    if type(value) is Padded:
        if _writes_padded_whole(t, value):
            return
        value = value.unpadded()
    storage = t.untyped_storage()
    dtype = to_jax(t.dtype)
    shape = tuple(t.shape)
    whole = _is_whole(t, buffer.get(storage), dtype)
    filled = first_fill_on_host(shape, value, dtype, device_index(t)) if whole else None
    if filled is not None:  # (a model's initial weights: zeros_(bias), ones_(norm.weight))
        buffer.put(storage, filled)
        return
    if type(value) in (bool, int, float, complex):  # (an int past int64 too: a weak uint64)
        value = device_scalar(value, device_index(t))
    elif not isinstance(value, (jax.Array, Deferred)):
        value = jnp.asarray(value)
        if flags.others_used:  # (made on tpu:0)
            value = jax.device_put(value, platform.jax_device(t.get_device()))
    if whole:
        if value.shape != shape or value.dtype != dtype:
            value = apply(fill, value, shape, dtype)
        buffer.put(storage, value)
        return
    buf = storage_array(storage, dtype)
    offset = device_scalar(t.storage_offset(), device_index(t))
    buffer.put(storage, apply(_strided_write, buf, value, shape, t.stride(), offset))
