"""The device value behind a tpu storage.

Every tpu tensor is a real PrivateUse1 ``TensorImpl`` whose 0-byte storage carries the data as a
Python attribute of its ``UntypedStorage`` object (PyTorch keeps that object alive exactly as long
as the StorageImpl, so the JAX buffer is freed with the last tensor that uses it).

The value is one of:

- a ``jax.Array`` holding the storage's elements (natural shape of whoever wrote it last, any
  dtype: readers reinterpret bytes as needed);
- :class:`Uninitialized` for ``torch.empty``, which must not allocate and zero-fill a buffer that
  is about to be overwritten;
- in fused eager, a :class:`Deferred` value that its graph has not computed yet.

Nothing outside this module and ``runtime.tensor`` should assume which. :func:`apply` is how
everyone runs a jitted helper on such values: recorded in fused eager, called otherwise.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax._src.array import ArrayImpl

from . import platform
from .context import context
from .flags import flags
from .host_copies import pass_host_copy

platform.configure()  # JAX configured (64-bit types, the platform) before any array exists

#: The attribute of a tpu ``UntypedStorage`` holding its value
STORAGE_ATTR = _ATTR = "_tpu_value"


class Uninitialized:
    """Storage of ``size`` elements of ``dtype`` on ``tpu:index`` that nobody has written yet."""

    __slots__ = ("size", "dtype", "index")

    def __init__(self, size: int, dtype: np.dtype, index: int = 0):
        self.size = size
        self.dtype = dtype
        self.index = index

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def materialize(self, shape: tuple | None = None) -> jax.Array:
        """Its zeros, flat or in ``shape`` (of ``size`` elements)."""
        shape = (self.size,) if shape is None else shape
        return jnp.zeros(shape, self.dtype, device=platform.jax_device(self.index))


def aval_of(struct) -> tuple:
    """What a :class:`Deferred` is made from: a ``jax.ShapeDtypeStruct``'s shape, dtype, element
    count and weak type (computed once per recorded signature, not per value)."""
    return struct.shape, struct.dtype, math.prod(struct.shape), struct.weak_type


class Deferred:
    """One output of an op recorded in a fused graph: shape and dtype known; ``value`` is set
    when the graph has run, ``error`` if it failed (the value then never exists).

    ``graph`` is the recording graph (``torch_tpu.execution.fused.Graph``); anything that needs
    the array asks it to run (:meth:`concrete`), whichever thread recorded it.
    """

    # (the C++ core makes them too, setting these slots as __init__ does: csrc/runtime/FusedRecord.cpp,
    # which refuses to load for another list)
    __slots__ = (
        "shape",
        "dtype",
        "size",
        "weak_type",
        "graph",
        "node",
        "index",
        "value",
        "error",
        "__weakref__",
    )

    def __init__(self, aval: tuple, graph, node: int, index: int):
        """``aval``: (shape, dtype, size, weak type) (see :func:`aval_of`)."""
        self.shape, self.dtype, self.size, self.weak_type = aval
        self.graph, self.node, self.index = graph, node, index
        self.value: jax.Array | None = None
        self.error: str | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def concrete(self) -> jax.Array:
        if self.value is None:
            if self.error is None:
                self.graph.run("a deferred value was used directly")
            if self.value is None:
                raise RuntimeError(f"tpu: this tensor has no value: {self.error}")
        return self.value

    def __jax_array__(self) -> jax.Array:
        return self.concrete()

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.concrete(), dtype=dtype)

    def __getattr__(self, name: str) -> Any:  # .astype, .reshape, .T ...: the concrete array's
        return getattr(self.concrete(), name)

    def __repr__(self) -> str:
        state = "ready" if self.value is not None else "failed" if self.error else "pending"
        return f"Deferred({self.shape}, {self.dtype}, {state})"


def _delegate(name: str) -> Callable:
    def method(self, *args):
        return getattr(self.concrete(), name)(*args)

    method.__name__ = name
    return method


for _name in (
    "__float__",
    "__int__",
    "__complex__",
    "__bool__",
    "__index__",
    "__len__",
    "__getitem__",
    "__iter__",
    "__neg__",
    "__pos__",
    "__abs__",
    "__invert__",
    "__add__",
    "__radd__",
    "__sub__",
    "__rsub__",
    "__mul__",
    "__rmul__",
    "__truediv__",
    "__rtruediv__",
    "__floordiv__",
    "__rfloordiv__",
    "__mod__",
    "__rmod__",
    "__pow__",
    "__rpow__",
    "__matmul__",
    "__rmatmul__",
    "__and__",
    "__rand__",
    "__or__",
    "__ror__",
    "__xor__",
    "__rxor__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__eq__",
    "__ne__",
):
    setattr(Deferred, _name, _delegate(_name))
Deferred.__hash__ = object.__hash__


class Padded:
    """A storage value padded to a size bucket (``runtime.padding``): ``array`` holds the tensor's
    elements at the positions ``layout`` (a ``padding.Layout``) marks, anything elsewhere. Only
    padding-aware readers take it as it is; :func:`get` hands every other reader the unpadded
    array, made once and kept with the value (the storage stays padded for the ops that know
    padding)."""

    __slots__ = ("array", "layout", "host", "_plain")

    def __init__(self, array: jax.Array, layout, host: np.ndarray | None = None):
        self.array, self.layout = array, layout
        self.host = host  # (the logical elements on the host, for a value copied from there)
        self._plain = None  # (its unpadded array, once a reader asked: values are immutable)

    @property
    def shape(self) -> tuple:
        """The logical shape (what an op's output checks compare)."""
        return self.layout.shape

    @property
    def dtype(self):
        return self.array.dtype

    @property
    def ndim(self) -> int:
        return len(self.layout.dims)

    @property
    def size(self) -> int:
        return math.prod(self.layout.shape)

    def unpadded(self) -> jax.Array:
        if self._plain is None:
            self._plain = _unpad(self)
        return self._plain

    def __repr__(self) -> str:
        return f"Padded({self.layout.shape} in {self.array.shape}, {self.array.dtype})"


_unpad: Callable = None  # (runtime.padding registers it)


def register_unpad(fn: Callable) -> None:
    global _unpad
    _unpad = fn


Value = jax.Array | Uninitialized | Deferred | Padded


# ----------------------------------------------------------------------------- views into programs
class StridedView:
    """A tensor argument handed to an op's program as its storage's array and the view's
    geometry, for the program to read the view itself: a view then costs no program (strict
    eager) or graph node (fused eager) of its own. A pytree: the array and the start offset (a
    device scalar, or None for a view at the storage's start) are its leaves, the shape and
    strides its static part (see ``tensor.read_in_program``)."""

    __slots__ = ("buf", "start", "shape", "strides")

    def __init__(self, buf: Any, start: Any, shape: tuple, strides: tuple):
        self.buf, self.start, self.shape, self.strides = buf, start, shape, strides

    def resolved(self) -> StridedView:
        """The view over its storage's array (a deferred one computed)."""
        buf = self.buf
        return self if type(buf) is not Deferred else StridedView(buf.concrete(), self.start, *self.geometry)

    @property
    def geometry(self) -> tuple:
        return self.shape, self.strides


# (as a dataclass node, JAX flattens it in C++: no Python call per program call)
jax.tree_util.register_dataclass(StridedView, data_fields=["buf", "start"], meta_fields=["shape", "strides"])


# ----------------------------------------------------------------------------- deferred values
def is_pending(x: Any) -> bool:
    """Whether ``x`` (a value or a list of them) holds a deferred value not computed yet."""
    if type(x) is Deferred:
        return x.value is None
    return isinstance(x, (list, tuple)) and any(type(v) is Deferred and v.value is None for v in x)


def resolved(x: Any) -> Any:
    """``x`` with any deferred value replaced by its array (running its graph if needed)."""
    if type(x) is Deferred:
        return x.concrete()
    if type(x) is StridedView:
        return x.resolved()
    if isinstance(x, (list, tuple)) and any(type(v) is Deferred or type(v) is StridedView for v in x):
        return type(x)(map(resolved, x))
    return x


def apply(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` for a pure jitted helper: recorded into this thread's fused graph while one
    is recording, else called (on the arrays of any deferred inputs)."""
    recorder = context.recorder
    if recorder is not None:
        return recorder.record(fn, args)
    for a in args:
        if type(a) is Deferred:
            return fn(*(resolved(x) for x in args))
    return fn(*args)


# ----------------------------------------------------------------------------- storages
def get(storage) -> Value:
    value = getattr(storage, _ATTR)
    if type(value) is Deferred and value.value is not None:  # its graph has run
        value = value.value
        setattr(storage, _ATTR, value)
    elif type(value) is Padded:  # a reader that does not know padding: the logical array
        value = value.unpadded()  # (the storage stays padded for the ops that know padding)
    return value


def peek(storage) -> Value:
    """The storage's value as it is (a :class:`Padded` one kept padded)."""
    return getattr(storage, _ATTR)


def get_array(storage, shape: tuple | None = None) -> jax.Array | Deferred:
    """The storage value as an array (an uninitialized storage becomes zeros, like fresh HBM,
    flat or in ``shape``); in fused eager, possibly a :class:`Deferred` one."""
    value = get(storage)
    if type(value) is Uninitialized:
        value = value.materialize(shape)
        setattr(storage, _ATTR, value)
    return value


#: The type of concrete device arrays (``jax.Array`` is an abstract base: slow to test against),
#: named rather than made (making one would start JAX's backend at import).
ARRAY_TYPE = ArrayImpl


def concrete(storage) -> jax.Array:
    """The storage value as a concrete array: the common case first (it already is one), else
    zeros for an uninitialized storage, or a fused graph's result (running the graph)."""
    value = getattr(storage, _ATTR)
    if type(value) is ARRAY_TYPE:
        return value
    value = get_array(storage)
    return value.concrete() if type(value) is Deferred else value


# ----------------------------------------------------------------------------- storage values
def put(storage, value: Value) -> None:
    """Give ``storage`` a new value. A value a fused graph has yet to compute replaces the old
    one only tentatively: the graph keeps the old value, to put back if it fails.

    Values are kept committed to the device: a jitted program is compiled per placement of its
    arguments, so one uncommitted array (the output of a program without array inputs, a
    factory) would compile every later op that reads it a second time."""
    if type(value) is ARRAY_TYPE:
        if not value.committed:  # (committed where it was made: a factory's device)
            made = value
            value = jax.device_put(value, made.sharding._device if flags.others_used else platform.device())
            pass_host_copy(made, value)
    elif type(value) is Deferred and value.value is None:
        old = getattr(storage, _ATTR, None)
        if old is not None and not (type(old) is Deferred and old.graph is value.graph):
            value.graph.overwrote(storage, old)
    setattr(storage, _ATTR, value)


def live_storages() -> list:
    """Every storage PyTorch keeps alive that holds a tpu value (their Python objects live as
    long as their StorageImpl, and the garbage collector tracks them; those frozen by
    ``gc.freeze()``, as vLLM's capture does, are frozen again after the search)."""
    frozen = gc.get_freeze_count()
    if frozen:
        gc.unfreeze()
    try:
        return [o for o in gc.get_objects() if type(o) is torch.UntypedStorage and hasattr(o, _ATTR)]
    finally:
        if frozen:
            gc.freeze()


def restore(storage, value: Value) -> None:
    """Put back a value a failed graph had replaced (no bookkeeping)."""
    setattr(storage, _ATTR, value)


def index_of(value: Value) -> int:
    """The tpu index of the device that holds (or will hold) ``value``."""
    kind = type(value)
    if kind is ARRAY_TYPE:
        return platform.index_of(value.sharding._device)
    if kind is Deferred:
        return value.graph.index
    if kind is Uninitialized:
        return value.index
    if kind is Padded:
        return index_of(value.array)
    return context.index  # a tracer: a compiled program's value, on the program's device


def has_value(storage) -> bool:
    return hasattr(storage, _ATTR)


def nbytes(value: Value) -> int:
    return value.nbytes if type(value) is Uninitialized else value.size * value.dtype.itemsize
