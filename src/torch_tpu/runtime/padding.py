"""Bucketed values: a tensor whose sizes change from call to call, kept padded to a size bucket.

XLA compiles one program per input shape, so a workload whose shapes vary (dynamic padding in a
data collator, the last partial batch, growing sequences) compiles every op again at every new
size. A storage may instead hold a :class:`~torch_tpu.runtime.buffer.Padded` value: an array
padded to a bucket along its *dynamic* dimensions, and the :class:`Layout` saying which of its
elements are the tensor's. Ops with a padding rule (``ops.padding``) run the program compiled
for the bucket on padded inputs, with the logical sizes as runtime arguments; the tensor itself
(sizes, strides, ``numel()``, ``.cpu()``) stays the logical one. Padding is never visible: a
reader that does not know it gets the unpadded array (:func:`unpadded`, one program per shape,
as before buckets).

A layout describes each dimension as one or more *factors* (a dimension that merged others, the
``B * T`` rows of ``x.view(-1, C)``, has one per merged dimension), each of logical ``size``
and, for a dynamic factor, a ``bucket``: the padded array's row-major order over the factors'
buckets holds the tensor's row-major order over their sizes, skipping positions past a size.

Which dimensions are dynamic is learned as Dynamo learns it: a tensor made at one place in the
user's code (a host copy, a factory) whose size along a dimension has changed once is dynamic
along it from then on (:func:`learned_layout`).

Example::

    >>> layout = Layout.of((4, 37), dynamic=(1,))
    >>> layout.padded_shape, layout.shape
    ((4, 64), (4, 37))
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import config
from . import events, platform, transfer
from .buffer import ARRAY_TYPE, Padded, apply, register_unpad
from .context import context
from .host_copies import host_copy, keep_host_copy
from .library_dirs import USER_DIRS, library_dirs
from .lru import Kind, caches

# ----------------------------------------------------------------------------- buckets
#: The smallest bucket: sizes up to it share one program
SMALLEST_BUCKET = 8


def bucket(n: int, bound: int | None = None) -> int:
    """The padded size of a dynamic dimension of size ``n``: the next rung of the ladder
    (``TORCH_TPU_BUCKETS``: powers of two by default, a growth factor such as ``1.25`` for a
    finer ladder), at least :data:`SMALLEST_BUCKET`, at most ``bound`` (the largest size the
    dimension can take: ``torch._dynamo.mark_dynamic(x, d, max=...)``).

    Example::

        >>> [bucket(n) for n in (1, 8, 9, 33, 64, 65)], bucket(33, bound=48)
        ([8, 8, 16, 64, 64, 128], 48)
    """
    rung = SMALLEST_BUCKET
    growth = config.bucket_growth
    while rung < n:
        rung = max(rung + 1, int(math.ceil(rung * growth)))
    return rung if bound is None or bound < n else min(rung, bound)


# ----------------------------------------------------------------------------- layouts
class Factor(NamedTuple):
    """One factor of a dimension: ``size`` logical positions; a dynamic one is padded to ``bucket``
    (None for a static factor, whose padded size is its size)."""

    size: int
    bucket: int | None = None

    @property
    def padded(self) -> int:
        return self.size if self.bucket is None else self.bucket


class Layout(NamedTuple):
    """Which elements of a padded array are a tensor's: per dimension, its factors (outer first)."""

    dims: tuple[tuple[Factor, ...], ...]

    @classmethod
    def of(cls, shape: Sequence[int], dynamic: Sequence[int] = (), bounds: Mapping[int, int] = {}) -> Layout:  # noqa: B006
        """The layout of ``shape`` padded along the ``dynamic`` dims to their buckets (those in
        ``bounds`` at most to their bound)."""
        return cls(
            tuple(
                (Factor(n, bucket(n, bounds.get(d)) if d in dynamic else None),) for d, n in enumerate(shape)
            )
        )

    @property
    def shape(self) -> tuple[int, ...]:
        """The tensor's (logical) shape."""
        return tuple(math.prod(f.size for f in dim) for dim in self.dims)

    @property
    def padded_shape(self) -> tuple[int, ...]:
        return tuple(math.prod(f.padded for f in dim) for dim in self.dims)

    @property
    def structure(self) -> tuple:
        """What a program depends on: the padded sizes, and which factors are dynamic (their
        sizes are the program's runtime arguments, :attr:`sizes`)."""
        return tuple(tuple((f.padded, f.bucket is not None) for f in dim) for dim in self.dims)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The logical sizes of the dynamic factors, in order."""
        return tuple(f.size for dim in self.dims for f in dim if f.bucket is not None)

    @property
    def factors(self) -> tuple[Factor, ...]:
        return tuple(f for dim in self.dims for f in dim)

    def is_dynamic(self, d: int) -> bool:
        return any(f.bucket is not None for f in self.dims[d])

    def permuted(self, order: Sequence[int]) -> Layout:
        return Layout(tuple(self.dims[d] for d in order))


def static_dim(n: int) -> tuple[Factor, ...]:
    return (Factor(n),)


def valid_masks(structure: tuple, sizes) -> list:
    """Per dimension of a layout's ``structure`` (traced), None for one without dynamic factors,
    else a boolean vector over its padded positions: True where the position is the tensor's.
    ``sizes``: an iterator over the runtime sizes of the dynamic factors, consumed in order."""
    masks = []
    for dim in structure:
        if not any(dynamic for _, dynamic in dim):
            masks.append(None)
            continue
        total = math.prod(p for p, _ in dim)
        position = lax.iota(jnp.int32, total)
        valid = None
        inner = total
        for padded, dynamic in dim:
            inner //= padded
            if dynamic:
                term = (position // inner) % padded < next(sizes)
                valid = term if valid is None else valid & term
        masks.append(valid)
    return masks


def mask_of(structure: tuple, sizes) -> jax.Array | None:
    """The boolean mask (broadcastable to the padded shape) of a layout's positions that are the
    tensor's; None where every position is (no dynamic factor)."""
    ndim = len(structure)
    mask = None
    for d, valid in enumerate(valid_masks(structure, sizes)):
        if valid is not None:
            valid = valid.reshape([-1 if e == d else 1 for e in range(ndim)])
            mask = valid if mask is None else mask & valid
    return mask


def filled(x: jax.Array, structure: tuple, sizes, fill) -> jax.Array:
    """``x`` (padded as ``structure``) with every position that is not the tensor's set to ``fill``:
    what makes a reduction or a contraction over a padded dimension exact."""
    mask = mask_of(structure, sizes)
    if mask is None:
        return x
    return jnp.where(mask, x, jnp.asarray(fill, x.dtype))


# ----------------------------------------------------------------------------- pad and unpad
def _factor_shapes(layout: Layout) -> tuple[tuple[int, ...], tuple[slice, ...]]:
    factors = layout.factors
    return tuple(f.padded for f in factors), tuple(slice(0, f.size) for f in factors)


def unpad_host(array: np.ndarray, layout: Layout) -> np.ndarray:
    """The tensor's elements (its logical shape) from ``array`` padded as ``layout`` (host)."""
    shape, index = _factor_shapes(layout)
    return np.ascontiguousarray(array.reshape(shape)[index]).reshape(layout.shape)


def pad_host(array: np.ndarray, layout: Layout) -> np.ndarray:
    """``array`` (the logical shape) padded as ``layout``, zeros in the padding (host)."""
    shape, index = _factor_shapes(layout)
    padded = np.zeros(shape, array.dtype)
    padded[index] = array.reshape(tuple(f.size for f in layout.factors))
    return padded.reshape(layout.padded_shape)


@functools.partial(jax.jit, static_argnums=(1,))
def _unpad(array: jax.Array, layout: Layout) -> jax.Array:
    shape, index = _factor_shapes(layout)
    return array.reshape(shape)[index].reshape(layout.shape)


@functools.partial(jax.jit, static_argnums=(1,))
def _pad(array: jax.Array, layout: Layout) -> jax.Array:
    widths = [(0, f.padded - f.size) for f in layout.factors]
    sized = array.reshape(tuple(f.size for f in layout.factors))
    return jnp.pad(sized, widths).reshape(layout.padded_shape)


def rebucketable(a: Layout, b: Layout) -> bool:
    """Whether ``a`` and ``b`` differ only in their buckets (factor by factor, of one size): a
    value laid out as one is laid out as the other by :func:`rebucketed`, one program per pair
    of buckets."""
    pairs = [(f, g) for x, y in zip(a.dims, b.dims) if len(x) == len(y) for f, g in zip(x, y)]
    return (
        len(a.dims) == len(b.dims)
        and len(pairs) == len(a.factors) == len(b.factors)
        and all(f.size == g.size and (f.bucket is None) == (g.bucket is None) for f, g in pairs)
    )


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _rebucket(array: jax.Array, old: tuple, new: tuple, shape: tuple) -> jax.Array:
    factors = array.reshape(old)[tuple(slice(0, min(a, b)) for a, b in zip(old, new))]
    return jnp.pad(factors, [(0, max(0, b - a)) for a, b in zip(old, new)]).reshape(shape)


def rebucketed(value: Padded, layout: Layout) -> Padded:
    """``value`` laid out as ``layout``, whose factors are its own in other buckets
    (:func:`rebucketable`): each factor's padded axis cut or padded to its new bucket (the
    logical positions lead each axis, so the program depends on the buckets alone)."""
    old = tuple(f.padded for f in value.layout.factors)
    new = tuple(f.padded for f in layout.factors)
    return Padded(apply(_rebucket, value.array, old, new, layout.padded_shape), layout)


def unpadded(value: Padded) -> jax.Array:
    """The logical array of a padded value: cut on the host where it has a host copy (no
    program), else by a program compiled per logical shape (what a reader that knows nothing
    of padding costs, as every shape cost before buckets)."""
    _note_unpadded_read(context.op)
    logical = value.host
    if logical is None:
        host = host_copy(value.array)
        logical = None if host is None else unpad_host(host, value.layout)
    if logical is None and _first_sighting(_unpad, value.array, value.layout):
        logical = unpad_host(np.asarray(value.array), value.layout)
    if logical is not None:
        array = jax.device_put(logical, value.array.sharding._device)
        keep_host_copy(array, logical)
        return array
    return apply(_unpad, value.array, value.layout)


register_unpad(unpadded)

#: the ops said to read padded values unpadded (:func:`_note_unpadded_read`)
_unpadded_readers: set[str] = set()


def _note_unpadded_read(op: str) -> None:
    """Say, once per op, that it read a padded value unpadded (it has no padding rule, or its
    rule did not serve the call): it compiles per size, and a fused graph holding it too."""
    if op in _unpadded_readers:
        return
    _unpadded_readers.add(op)
    events.explain(f"{op or 'a reader'} reads size-bucketed values unpadded: it compiles per size")


def padded(array: jax.Array, layout: Layout) -> Padded:
    """``array`` (logical shape) padded as ``layout``: on the host where it has a host copy,
    else by a program compiled per shape (an operand that met padded ones the first time)."""
    host = host_copy(array)
    if host is None and _first_sighting(_pad, array, layout):
        host = np.asarray(array)
    if host is not None:
        return from_host(host, layout, array.sharding._device)
    return Padded(apply(_pad, array, layout), layout)


#: Arrays up to this many bytes are padded through the host (a transfer each way) where a
#: program would otherwise be compiled for their shape (:func:`padded_through_host`), and are
#: padded or cut there the first time their shape is met (:func:`_first_sighting`)
HOST_PADDING_BYTES = 4 << 20
#: (pad or unpad, shape, dtype, layout) met once: the second time, the program is compiled
_met = caches.lru("padding.met", Kind.SIZES)


def _first_sighting(program, array, layout: Layout) -> bool:
    """Whether to pad or cut ``array`` on the host rather than by ``program``: a small concrete
    array on one device whose shape this program has not met before. A shape met once (a
    test's tensor, one odd batch) costs two transfers instead of a compile; one met again (a
    training loop's sizes, which recur) gets its program, and runs without a wait from then on."""
    if type(array) is not ARRAY_TYPE or array.nbytes > HOST_PADDING_BYTES:
        return False
    if type(array.sharding) is not jax.sharding.SingleDeviceSharding:  # (a distributed array)
        return False
    key = (program, array.shape, array.dtype, layout)
    if key in _met:
        return False
    _met[key] = True
    return True


def padded_through_host(array: jax.Array, layout: Layout) -> Padded:
    """``array`` padded as ``layout``, through the host when it is small: a round trip costs
    far less than compiling a pad program for a shape that may never come back (a compiled
    graph's input, :mod:`torch_tpu.frontends.compile.program`). Waits for ``array``."""
    if array.nbytes > HOST_PADDING_BYTES:
        return padded(array, layout)
    return from_host(np.asarray(array), layout, array.sharding._device)


def from_host(host: np.ndarray, layout: Layout, device) -> Padded:
    """A host array (logical shape) padded on the host and put on ``device``: no program."""
    padded_host = pad_host(host, layout)
    array = transfer.put(padded_host, device)
    keep_host_copy(array, padded_host)
    kept = np.array(host)  # (its own: the caller's array may be the user's tensor's memory)
    kept.flags.writeable = False
    return Padded(array, layout, kept)


# ----------------------------------------------------------------------------- learning
#: True once a padded value was made in this process: until then the dispatcher skips every
#: padding test (one global read per op)
live = False
#: (call site, kind, dtype, rank) -> [first shape seen, dynamic dims]
_sites = caches.lru("padding.sites", Kind.SIZES)
#: code object -> what its frames are to :func:`user_call_site` (:func:`_frame_kind`)
_library_code: dict = {}
#: torch's frames a call may come through and still be the user's: a module's forward and the
#: functional API it calls (any other torch frame, a module's ``__init__``, ``Module.to``'s
#: ``_apply``, the autograd engine, the optimizers, a test helper, makes many different tensors
#: from one line of user code)
_THROUGH = {
    "nn/modules/module.py": ("_call_impl", "_wrapped_call_impl"),
    "nn/functional.py": None,
    "functional.py": None,
    "_ops.py": None,
    "_tensor.py": None,
    "overrides.py": None,
}


def _frame_kind(code) -> str:
    """``"user"``, ``"through"`` (a library frame a user's call may come through) or ``"stop"``."""
    kind = _library_code.get(code)
    if kind is None:
        libraries = library_dirs()
        name = code.co_filename
        if name.startswith(libraries.torch_tpu):
            kind = "user" if name.startswith(USER_DIRS) else "through"
        elif name.startswith(libraries.torch):
            relative = name[len(libraries.torch) :].replace("\\", "/")
            allowed = _THROUGH.get(relative, ())
            forward = relative.startswith("nn/modules/") and code.co_name == "forward"
            kind = "through" if forward or allowed is None or code.co_name in allowed else "stop"
        elif name.startswith(libraries.jax):
            kind = "through"
        else:
            kind = "user"
        _library_code[code] = kind
    return kind


def user_call_site() -> tuple | None:
    """Where the user's code asked for the tensor being made: its frame's code and the call's
    instruction (``w.to(d), x.to(d)`` on one line are two places), when the call came from it
    through torch_tpu, C++ and a module's forward only; None when another torch frame stands
    between (:data:`_THROUGH`)."""
    frame = sys._getframe(2)
    while frame is not None:
        kind = _frame_kind(frame.f_code)
        if kind == "user":
            return frame.f_code, frame.f_lasti  # (the call itself: one line may make several)
        if kind == "stop":
            return None
        frame = frame.f_back
    return None


class _Sighting:
    """What one call site has made: per dim the first size above 1 seen there (None before
    one), and the dims whose size has changed since (dynamic from then on)."""

    __slots__ = ("first", "dynamic")

    def __init__(self, ndim: int):
        self.first: list[int | None] = [None] * ndim
        self.dynamic: frozenset[int] = frozenset()

    def learn(self, shape: tuple) -> list[int]:
        """Note ``shape`` made here; the dims to pad it along. Sizes 0 and 1 teach nothing and
        are never padded (Dynamo's 0/1 specialization): a generation loop's prompt of length P
        and its steps of length 1 stay two static shapes."""
        for d, n in enumerate(shape):
            if n > 1 and d not in self.dynamic:
                if self.first[d] is None:
                    self.first[d] = n
                elif self.first[d] != n:
                    self.dynamic |= {d}
        return [d for d in self.dynamic if shape[d] > 1]


def learned_layout(kind: str, shape: Sequence[int], dtype) -> Layout | None:
    """The layout a tensor of ``shape`` made by ``kind`` (``"host"``, ``"full"``, ``"arange"``)
    from the current user call site gets: padded along the dimensions whose size changed since
    the first tensor made there, where it is above 1 (None while none has, or where padding is
    off or cannot apply: a compiled program's trace, a call not made by user code). Inside a
    bucketed compiled graph the dimensions are those Dynamo made symbolic
    (``context.symbolic_dims``)."""
    if not config.buckets or context.trace is not None or not shape:
        return None
    if context.symbolic_dims is not None:  # made inside a bucketed compiled graph: Dynamo knows
        return symbolic_layout(shape, context.symbolic_dims)
    site = user_call_site()
    if site is None:
        return None
    shape = tuple(shape)
    key = (site, kind, dtype, len(shape))
    seen = _sites.get(key)
    if seen is None:
        seen = _sites[key] = _Sighting(len(shape))
    dynamic = seen.learn(shape)
    if not dynamic:
        return None
    return Layout.of(shape, dynamic)


def symbolic_layout(shape: Sequence[int], symbolic: Sequence[tuple[int, int | None]]) -> Layout | None:
    """The layout of a tensor of ``shape`` whose dims ``symbolic`` ((dim, largest size or
    None) each, as Dynamo knows them) are dynamic; None if no such dim has a size."""
    dynamic = [d for d, _ in symbolic if d < len(shape) and shape[d] > 0]
    bounds = {d: bound for d, bound in symbolic if bound is not None}
    return Layout.of(shape, dynamic, bounds) if dynamic else None


def made(value: Padded) -> Padded:
    """Note that a padded value exists (the dispatcher then looks for them)."""
    global live
    live = True
    return value


# ----------------------------------------------------------------------------- views
class ViewPlan(NamedTuple):
    """How a view of a padded storage is read from its padded array (static: one program per
    plan, shared by every logical size in the bucket)."""

    hull: tuple[int, ...]  # the padded array reshaped so each view dim is one axis (padded sizes)
    slices: tuple[tuple[int, int], ...]  # per hull axis: (start, stop) in padded positions
    kept: tuple[int, ...]  # the hull axes that are view dims (others are indexed at start)
    order: tuple[int, ...]  # kept axes -> the view's non-broadcast dims in view order
    shape: tuple[int, ...]  # the padded view's shape (broadcast dims included)
    broadcast: tuple[int, ...]  # view dims of stride 0 (expanded), broadcast in
    tails: tuple[int, ...] = ()  # per hull axis: padding appended after the slice (a cut's start)


def _read_view_with(xp, array, plan: ViewPlan):
    x = array.reshape(plan.hull)
    x = x[tuple(slice(a, b) for a, b in plan.slices)]
    if any(plan.tails):
        x = xp.pad(x, [(0, t) for t in plan.tails])
    dropped = tuple(a for a in range(len(plan.hull)) if a not in plan.kept)
    x = x.reshape([n for a, n in enumerate(x.shape) if a not in dropped])
    x = x.transpose(plan.order) if plan.order != tuple(range(len(plan.order))) else x
    for d in plan.broadcast:
        x = xp.expand_dims(x, d)
    return xp.broadcast_to(x, plan.shape)


#: A view of a padded storage array, read as a :class:`ViewPlan` says.
read_view = jax.jit(functools.partial(_read_view_with, jnp), static_argnums=(1,))

#: Programs whose static arguments are bucket sizes, not a call's sizes: a fused graph meets one
#: shape of them per bucket, a few recurring shapes, never shapes that churn (``fused``)
BUCKETED_PROGRAMS = frozenset({read_view})


def _regroup(factors: Sequence[Factor], sizes: Sequence[int]) -> list[list[Factor]] | None:
    """The factors (outer first) regrouped into dimensions of logical ``sizes``, a reshape of
    the whole that keeps their order: a static factor may split, a dynamic one falls whole into
    one group (a dynamic factor of size 1 into any). None where that cannot be."""
    queue, groups = list(factors), []
    for target in sizes:
        group, have = [], 1
        while have < target:
            if not queue:
                return None
            f = queue[0]
            need = target // have
            if f.size == 1:
                queue.pop(0)
                if f.bucket is not None:
                    group.append(f)
            elif need % f.size == 0:
                group.append(queue.pop(0))
                have *= f.size
            elif f.bucket is None and f.size % need == 0:
                group.append(Factor(need))
                queue[0] = Factor(f.size // need)
                have = target
            else:
                return None
        while group and queue and queue[0].size == 1:  # (a dynamic dim of size 1 now: a row's)
            f = queue.pop(0)
            if f.bucket is not None:
                group.append(f)
        groups.append(group or [Factor(1)])
    if not groups or any(f.size != 1 for f in queue):
        return None
    groups[-1] += [f for f in queue if f.bucket is not None]
    return groups


def _padded_position(group: Sequence[Factor], position: int) -> int:
    """Where logical ``position`` along a dimension of factors ``group`` is in its padded axis."""
    coords = []
    for f in reversed(group):
        coords.append(position % f.size)
        position //= f.size
    padded, step = 0, 1
    for f, c in zip(reversed(group), coords):
        padded += c * step
        step *= f.padded
    return padded


def _cut(group: Sequence[Factor], start: int, length: int) -> tuple[Factor] | None:
    """The dim of a slice ``start:start + length`` of a dimension that is one dynamic factor
    (``x[:, 1:]``, ``x[:, :-1]``: a language model's shifted logits and labels): the padded axis
    from ``start`` on, padded again to the bucket (so ``x[:, 1:]`` and ``x[:, :-1]`` are laid
    out alike), its first ``length`` positions the slice's: the read depends on ``start`` and
    the bucket only. None for any other dimension."""
    if len(group) != 1 or group[0].bucket is None:
        return None
    return (Factor(length, group[0].padded),)


class _Hull(NamedTuple):
    """The logical storage reshaped so each view dim is one axis (outer first)."""

    sizes: list[int]  # per axis, in logical positions
    dims: list[int | None]  # per axis, the view dim it steps along (None: below the smallest stride)
    real: list[int]  # the view's non-broadcast dims, in order
    by_stride: list[int]  # the same, largest stride first


def _hull(shape: tuple[int, ...], strides: tuple[int, ...], numel: int) -> _Hull | None:
    """The sizes between the view's strides, largest first, and the innermost stride when above
    1; None where the strides do not nest (overlapping elements, a dim longer than its room)."""
    real = [d for d, n in enumerate(shape) if n != 1 and strides[d] != 0]
    by_stride = sorted(real, key=lambda d: -strides[d])
    sizes, dims, outer = [], [], numel
    for d in by_stride:
        s = strides[d]
        if s <= 0 or outer % s or outer // s < shape[d]:
            return None
        sizes.append(outer // s)
        dims.append(d)
        outer = s
    if outer > 1 or not sizes:
        sizes.append(outer)
        dims.append(None)
    return _Hull(sizes, dims, real, by_stride)


def _hull_starts(sizes: list[int], offset: int) -> list[int] | None:
    """``offset`` as a position in the hull (outer first); None past its end."""
    starts, rest = [], offset
    for n in reversed(sizes):
        starts.append(rest % n)
        rest //= n
    if rest:
        return None
    starts.reverse()
    return starts


class _AxisReads(NamedTuple):
    """How the view reads each hull axis of the padded array."""

    slices: list[tuple[int, int]]  # per axis: (start, stop) in padded positions
    kept: list[int]  # the axes that are view dims (others are indexed at start)
    tails: list[int]  # per axis: padding appended after the slice (a cut's start)
    dims: dict[int, tuple[Factor, ...]]  # view dim -> its factors in the view's layout


def _axis_reads(groups, hull: _Hull, shape: tuple[int, ...], starts: list[int]) -> _AxisReads | None:
    """Each axis's read: whole, cut from a fixed start (:func:`_cut`), or a static range; None
    where the view cuts into a dynamic factor any other way (an index into it, ``x[:, -1]``)."""
    slices, kept, tails, dims = [], [], [], {}
    for axis, (group, d, start) in enumerate(zip(groups, hull.dims, starts)):
        length = 1 if d is None else shape[d]
        size = hull.sizes[axis]
        if start + length > size:
            return None
        whole = d is not None and start == 0 and length == size
        cut = _cut(group, start, length) if d is not None and not whole else None
        if (
            not whole
            and cut is None
            and any(f.bucket is not None and (d is not None or f.size > 1) for f in group)
        ):
            return None  # (a cut into a merged dynamic dim; a factor of size 1 is indexed at 0 below)
        slices.append(_padded_range(group, start, length, whole, cut))
        tails.append(start if cut is not None else 0)
        if d is not None:
            kept.append(axis)
            dims[d] = tuple(group) if whole else cut or static_dim(length)
    return _AxisReads(slices, kept, tails, dims)


def _padded_range(group: Sequence[Factor], start: int, length: int, whole: bool, cut) -> tuple[int, int]:
    """(start, stop) in padded positions of one axis's read: all of it, a cut's padded axis from
    its start on, or the padded positions of a static range."""
    if whole:
        return 0, math.prod(f.padded for f in group)
    if cut is not None:
        return start, group[0].padded
    first = _padded_position(group, start)
    return first, first + length


def _view_plan(shape: tuple[int, ...], hull: _Hull, groups, reads: _AxisReads) -> tuple[ViewPlan, Layout]:
    """The plan and the view's layout, broadcast dims (stride 0) static."""
    view_layout = Layout(tuple(reads.dims.get(d, static_dim(n)) for d, n in enumerate(shape)))
    plan = ViewPlan(
        hull=tuple(math.prod(f.padded for f in g) for g in groups),
        slices=tuple(reads.slices),
        kept=tuple(reads.kept),
        order=tuple(hull.by_stride.index(d) for d in hull.real),
        shape=view_layout.padded_shape,
        broadcast=tuple(d for d in range(len(shape)) if d not in reads.dims),
        tails=tuple(reads.tails) if any(reads.tails) else (),
    )
    return plan, view_layout


def plan_view(layout: Layout, shape: Sequence[int], strides: Sequence[int], offset: int) -> tuple | None:
    """(:class:`ViewPlan`, the view's :class:`Layout`) for the view (``shape``, ``strides``,
    ``offset``, in elements of the logical storage ``layout`` describes), or None where the view
    is not a block of a reshape of the storage that keeps each dynamic factor whole or slices a
    dimension of one dynamic factor from a fixed start (an index into a dynamic dimension,
    ``x[:, -1]``; overlapping elements): it is then read unpadded.

    The storage is reshaped to a *hull* with one axis per view dim (the sizes between the view's
    strides, largest first, and the innermost stride when above 1), each axis sliced to the
    view's range, the innermost indexed at the offset, and the axes put in the view's order."""
    shape, strides = tuple(shape), tuple(strides)
    numel = math.prod(layout.shape)
    if 0 in shape or numel == 0:
        return None
    hull = _hull(shape, strides, numel)
    if hull is None:
        return None
    groups = _regroup(layout.factors, hull.sizes)
    if groups is None:
        return None
    starts = _hull_starts(hull.sizes, offset)
    if starts is None:
        return None
    reads = _axis_reads(groups, hull, shape, starts)
    return None if reads is None else _view_plan(shape, hull, groups, reads)


def read_padded(value: Padded, shape, strides, offset: int) -> Padded | None:
    """The view (``shape``, ``strides``, ``offset``) of a storage holding padded ``value``, as a
    padded value (a program per view plan, none for the whole storage in order); None where
    the view cannot be read padded (:func:`plan_view`)."""
    layout = value.layout
    if offset == 0 and tuple(shape) == layout.shape and tuple(strides) == _row_major(layout.shape):
        return value
    planned = _plans.get((layout, tuple(shape), tuple(strides), offset), _NO)
    if planned is _NO:
        planned = _plans[(layout, tuple(shape), tuple(strides), offset)] = plan_view(
            layout, shape, strides, offset
        )
    if planned is None:
        return None
    plan, view_layout = planned
    array = apply(read_view, value.array, plan)
    host = host_copy(value.array)
    if host is not None:  # (index bounds over it are then checked on the host)
        keep_host_copy(array, np.ascontiguousarray(_read_view_with(np, host, plan)))
    return Padded(array, view_layout)


_plans = caches.lru("padding.view_plans", Kind.TRACES)
_NO = object()


def _row_major(shape) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


@functools.partial(jax.jit, static_argnums=(1,))
def _transpose(array: jax.Array, order: tuple) -> jax.Array:
    return array.transpose(order)


def permuted(value: Padded, order: Sequence[int]) -> Padded:
    """``value`` with its axes in ``order`` (a tensor's memory order)."""
    order = tuple(order)
    if order == tuple(range(len(order))):
        return value
    return Padded(apply(_transpose, value.array, order), value.layout.permuted(order))


def sizes_array(sizes: tuple[int, ...], index: int = 0) -> jax.Array:
    """The dynamic sizes of a padded call as the program's runtime argument (cached)."""
    key = (sizes, index)
    array = _sizes.get(key)
    if array is None:
        array = _sizes[key] = jax.device_put(np.asarray(sizes, np.int32), platform.jax_device(index))
    return array


_sizes = caches.lru("padding.sizes_arrays", Kind.CONSTANTS)
