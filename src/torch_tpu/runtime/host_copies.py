"""Host copies: the host's copy of a small integer or boolean device value, kept beside it, and
the views of such a copy that follow the device value's views.

A value copied from the host (``transfer``), an integer ``arange`` or a value an op's host rule
computed (``Lowering.host``) keeps its host copy here, by ``id`` (a weak reference drops it with
the array); a view read from such a value keeps the same view of the copy. Value checks (index
bounds) read the copy instead of running a program on the device and waiting for it.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .dtypes import TORCH_TO_JAX

if TYPE_CHECKING:  # (buffer keeps a value's host copy through this module)
    import jax

    from .buffer import Deferred

#: Integer and boolean arrays up to this size copied from the host (a batch of token ids, a
#: loss's targets, ``torch.tensor([0, 2])``), views read from them and integer ``arange``s keep
#: their host copy: a value check over them (index bounds) reads it instead of running a
#: program on the device and waiting for it. A value changed on the device is a new array,
#: without one unless an op's host rule computed the same value (``Lowering.host``): a host
#: copy is never stale.
HOST_COPY_BYTES = 1 << 20
#: id(array) -> (weak reference to it, its host copy, [its (min, max) once asked], its reshapes
#: read so far by shape (:func:`kept_reshape`)); the C++ core runs the host rule of a planned
#: call (``Lowering.host``) where an operand is in it
host_copies_by_id: dict[int, tuple[weakref.ref, np.ndarray, list, dict]] = {}
#: Reshapes kept per host-copied array (a few: a batch flattened for a loss, for an embedding)
_RESHAPES_KEPT = 4
#: Up to this many entries, a host copy's range is taken in Python (numpy's reductions cost
#: more per call than the loop over so few)
_FEW = 32


def keep_host_copy(value: Any, array: np.ndarray, shared: bool = False) -> None:
    """Remember ``array``, the host's copy of ``value`` (an array, or a deferred one), for
    :func:`host_copy`, if it is a small integer or boolean array. ``shared``: ``array`` is
    read-only and torch_tpu's own (a kept copy, a view of one), kept as it is."""
    if array.dtype.kind not in "biu" or array.nbytes > HOST_COPY_BYTES:
        return
    if shared:
        copy = array
    else:
        copy = array.copy()  # its own: the device value may alias ``array`` (and be donated)
        copy.flags.writeable = False
    key = id(value)
    # (the callback runs while ``value`` is freed, before its id can be reused)
    forget = host_copies_by_id.pop  # (bound now: a kept reshape may be freed at exit, after the module)
    host_copies_by_id[key] = (weakref.ref(value, lambda _: forget(key, None)), copy, [], {})


def _host_entry(value: Any) -> tuple | None:
    entry = host_copies_by_id.get(id(value))
    return None if entry is None or entry[0]() is not value else entry


def host_copy(value: Any) -> np.ndarray | None:
    """The host copy kept of ``value`` (read-only), or None: ``value`` was computed on the
    device, or is not a small integer or boolean array copied from the host
    (``transfer.to_device``), a view read from one, or an integer ``arange``."""
    entry = _host_entry(value)
    return None if entry is None else entry[1]


def kept_reshape(value: Any, shape: tuple) -> Any:
    """The array of ``shape`` holding all of host-copied ``value``'s elements in order, as
    :func:`keep_reshape` kept it, or None."""
    entry = _host_entry(value)
    return None if entry is None else entry[3].get(shape)


def keep_reshape(value: Any, shape: tuple, reshaped: Any) -> None:
    """Keep ``reshaped``, host-copied ``value`` read in ``shape`` (a view of it every step reads
    again: a loss's flattened targets), for as long as ``value`` lives: both are immutable."""
    entry = _host_entry(value)
    if entry is not None and len(entry[3]) < _RESHAPES_KEPT:
        entry[3][shape] = reshaped


def pass_host_copy(source: Any, target: Any) -> None:
    """Keep ``source``'s host copy, if it has one, as ``target``'s: the same value elsewhere
    (placed on the device, computed by its graph)."""
    host = host_copy(source)
    if host is not None:
        keep_host_copy(target, host, shared=True)


def pass_host_copies(computed: Sequence[Deferred]) -> None:
    """Keep the host copy of each of ``computed`` (deferred values its graph has just computed)
    as its array's too: the storages holding it will hold the array."""
    for deferred in computed:
        pass_host_copy(deferred, deferred.value)


def host_range(value: Any) -> tuple[int, int] | None:
    """The smallest and largest entries of :func:`host_copy`'s copy of ``value``, taken once
    per copy (an index tensor reused every step is not read again); None without one, or for
    an empty one."""
    entry = _host_entry(value)
    if entry is None:
        return None
    known = entry[2]
    if not known:
        host = entry[1]
        if not host.size:
            return None
        if host.size <= _FEW:
            values = host.ravel().tolist()
            known.append((min(values), max(values)))
        else:
            known.append((host.min().item(), host.max().item()))
    return known[0]


# ----------------------------------------------------------------------------- views of a host copy
def keep_view_of_host_copy(value: jax.Array, host: np.ndarray, t: torch.Tensor) -> None:
    """Keep ``t``'s view of its storage's host copy ``host`` as ``value``'s."""
    view = host_view(host, t)
    if view is not None:
        keep_host_copy(value, view, shared=True)


def host_view(host: np.ndarray, t: torch.Tensor) -> np.ndarray | None:
    """``t``'s view of its storage's host copy ``host`` (read-only), or None where it would
    reach outside ``host`` (numpy's ``as_strided`` does not check)."""
    shape, strides, offset = tuple(t.shape), t.stride(), t.storage_offset()
    if offset == 0 and t.numel() == host.size and host.flags.c_contiguous and t.is_contiguous():
        return host.reshape(shape)  # (a reshape: the common view)
    if 0 not in shape and offset + sum((n - 1) * s for n, s in zip(shape, strides)) >= host.size:
        return None
    flat = host.reshape(-1)[offset:]
    # (numpy's as_strided reads float8's array interface as "<f1", which it does not know: the
    # bits are strided, then viewed back)
    bits = flat.view(np.uint8) if host.dtype.itemsize == 1 and host.dtype.kind in "Vf" else flat
    strided = np.lib.stride_tricks.as_strided(
        bits, shape, [s * host.itemsize for s in strides], writeable=False
    )
    return strided if bits is flat else strided.view(host.dtype)


def view_on_host(flat: np.ndarray, t: torch.Tensor) -> np.ndarray | None:
    """View ``t`` of its storage's elements ``flat`` (host), reinterpreted where ``t`` has
    another dtype; None where the device read must raise PyTorch's error instead."""
    dtype = TORCH_TO_JAX.get(t.dtype)
    if dtype is None:
        return None  # (a dtype tpu has no storage for)
    if flat.dtype != dtype:  # (a view in another dtype than its storage's value)
        if flat.nbytes % dtype.itemsize:
            return None
        flat = flat.view(dtype)
    return host_view(flat, t)
