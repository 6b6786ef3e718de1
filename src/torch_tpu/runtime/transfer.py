"""Host <-> device copies (numpy has no bfloat16 for torch, so it travels as int16 bits)."""

from __future__ import annotations

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax._src import core as jax_core
from jax._src.interpreters import pxla

from . import checks, devices, platform
from .context import context
from .dtypes import FLOAT8, FLOAT8_JAX, JAX_TO_TORCH, TORCH_TO_JAX
from .host_copies import keep_host_copy
from .lru import Kind, caches

#: tpu:0's scalar constants (its ``DeviceState.scalars``), bound once: the per-op path's one load
_first_scalars = devices.local.first.scalars
#: id -> (device scalar, its number) for the scalars :func:`device_scalar` made, so that a
#: check reads an argument's number without a device read (holding the array keeps its id
#: from naming another while listed; emptied when full, after which ``.item()`` answers)
_numbers_by_id: dict[int, tuple[jax.Array, bool | int | float | complex]] = {}
_NUMBERS_HELD = 4096
#: The Python integers JAX takes as runtime values (``device_scalar``): int64's.
INT64_RANGE = range(-(2**63), 2**63)


def device_scalar(x: bool | int | float | complex, index: int = 0) -> jax.Array:
    """A Python number as a weakly typed device scalar, cached by value: handing JAX a fresh
    Python number costs a host->device transfer per call, and the same constants (alpha=1,
    0.5, eps, a fill value) recur on every step. Values stay runtime inputs of the programs
    that take them, so a new learning rate never recompiles. Like every value we hold, it is
    committed to the device (see :func:`torch_tpu.runtime.buffer.put`): ``tpu:index``, each
    device has its own (JAX refuses to mix devices in one program)."""
    key = (type(x), x) if x else (type(x), str(x))  # keeps -0.0 apart from 0.0
    cache = _first_scalars if not index else devices.local.state(index).scalars
    array = cache.get(key)
    if array is None:
        array = cache[key] = _weak_scalar(x, platform.jax_device(index))
        if len(_numbers_by_id) >= _NUMBERS_HELD:
            _numbers_by_id.clear()
        _numbers_by_id[id(array)] = (array, x)
    return array


def number_of(array: object) -> bool | int | float | complex | None:
    """The Python number a :func:`device_scalar` holds (None for any other object).

    Example::

        >>> from torch_tpu.runtime.transfer import device_scalar, number_of
        >>> number_of(device_scalar(0.5))
        0.5
    """
    known = _numbers_by_id.get(id(array))
    return known[1] if known is not None and known[0] is array else None


def _weak_scalar(x: bool | int | float | complex, device: jax.Device) -> jax.Array:
    """``x`` on ``device`` as JAX holds a Python number: weakly typed (a bool excepted), so it
    takes its operation's dtype. An integer past int64 (a uint64 value, which PyTorch's Scalar
    holds and JAX takes from no Python int) is a weak uint64, which promotes as a Python int
    does and converts to the op's dtype modulo its size, as CPU casts it (``x * (2**63 + 5)`` on
    int64 wraps). Put over directly, a concrete array even inside a trace: 10 us, where
    ``jax.device_put`` of ``jnp.asarray(x)`` costs about 60 (a view copied at a new offset at
    each step of a loop makes one per step)."""
    host = np.asarray(np.uint64(x) if type(x) is int and x not in INT64_RANGE else x)
    aval = _scalar_aval(host.dtype, type(x) is not bool)
    return pxla.batched_device_put(aval, _sharding(device), [host], [device])


@functools.cache
def _scalar_aval(dtype: np.dtype, weak: bool) -> jax_core.ShapedArray:
    return jax_core.ShapedArray((), dtype, weak_type=weak)  # (made once: 25 us each)


#: The largest fill :func:`_filled_on_host` builds: the host memory and the copy it costs grow
#: with the size, an XLA compile does not.
HOST_FILL_BYTES = 64 << 20
_EXACT_FILL_DTYPES = frozenset(
    np.dtype(t)
    for t in (
        *(jnp.bool_, jnp.uint8, jnp.int8, jnp.int16, jnp.int32, jnp.int64),
        *(jnp.uint16, jnp.uint32, jnp.uint64),
        *(jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64, jnp.complex64, jnp.complex128),
    )
)


def _held_exactly(value: bool | int | float | complex, dtype: np.dtype) -> np.generic | None:
    """``value`` (a Python number) as a ``dtype`` scalar where ``dtype`` holds it exactly, so
    that every way of casting it (torch CPU's, XLA's, numpy's) agrees; else None."""
    if dtype not in _EXACT_FILL_DTYPES:
        return None
    if dtype.kind in "biu":
        low, high = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
        return dtype.type(value) if isinstance(value, int) and low <= value <= high else None
    if isinstance(value, complex) and dtype.kind != "c":
        return None
    if isinstance(value, int) and abs(value) > 2**53:  # (numpy rounds it to float64 first)
        return None
    parts = (value.real, value.imag) if isinstance(value, complex) else (value,)
    largest = float(jnp.finfo(dtype).max)
    if not all(math.isinf(part) or abs(part) <= largest for part in parts):  # (or numpy warns)
        return None
    held = np.array(value, dtype)
    return held[()] if complex(held) == value else None  # (NaN never equals: not held)


#: How many times strict eager builds the same fill (shape, dtype and value) on the host before
#: it runs the compiled program instead (enough for an optimizer's two or three zero states
#: per parameter shape, or a few layers' norm weights)
HOST_FILLS = 4
#: Fills :func:`small_fill_on_host` always builds on the host: copying a few KB over costs about
#: what running a compiled fill does, and a new shape compiles nothing
SMALL_HOST_FILL_BYTES = 16 << 10
#: (shape, dtype, value) -> how many times strict eager made that fill (up to HOST_FILLS)
_fills = caches.lru("transfer.fills", Kind.TRACES)
_NUMBERS = (bool, int, float, complex)


def first_fill_on_host(shape: tuple, value, dtype: np.dtype, index: int = 0) -> jax.Array | None:
    """A strict-eager fill of ``shape`` with ``value`` as ``dtype`` on ``tpu:index``, built on
    the host (:func:`_filled_on_host`) the first :data:`HOST_FILLS` times: one-off fills, such
    as an optimizer's zero states for each parameter shape or a model's initial weights,
    would otherwise each compile a program before the first step. None where the fill should
    run as a program: made more often than that (compiled once, it then runs on the device),
    recorded into a fused graph or traced into a compiled one, or not buildable on the host."""
    if not _fills_on_host(value):
        return None
    key = (shape, dtype, value)
    made = _fills.get(key, 0)
    if made >= HOST_FILLS:  # (a recurring fill: counted no further, on the hot path)
        return None
    _fills[key] = made + 1
    return _filled_on_host(shape, value, dtype, index)


def put(array: np.ndarray, device: jax.Device) -> jax.Array:
    """``jax.device_put(array, device)`` for a host array, by the transfer that call ends in
    (8 us against 28: every copy from the host, on each serving step several, pays it). The
    value is the same: dtype canonicalized as JAX's, committed to ``device``."""
    return pxla.batched_device_put(jax_core.shaped_abstractify(array), _sharding(device), [array], [device])


@functools.cache
def _sharding(device: jax.Device) -> jax.sharding.SingleDeviceSharding:
    return jax.sharding.SingleDeviceSharding(device)


def small_fill_on_host(shape: tuple, value, dtype: np.dtype, index: int = 0) -> jax.Array | None:
    """A strict-eager fill of at most :data:`SMALL_HOST_FILL_BYTES`, built on the host however
    often it recurs (an unwritten storage's zeros, which the reader overwrites: ``torch.empty``
    then ``uniform_``); None where :func:`first_fill_on_host` decides."""
    if math.prod(shape) * dtype.itemsize > SMALL_HOST_FILL_BYTES or not _fills_on_host(value):
        return None
    return _filled_on_host(shape, value, dtype, index)


def _fills_on_host(value) -> bool:
    """Whether a fill with ``value`` may be built on the host: a number, in strict eager (a graph
    recording or a trace makes it part of its program)."""
    return context.recorder is None and context.trace is None and type(value) in _NUMBERS


def _filled_on_host(shape: tuple, value, dtype: np.dtype, index: int = 0) -> jax.Array | None:
    """``shape`` filled with ``value`` (a Python number) as ``dtype`` on ``tpu:index``, built
    on the host and copied over: no XLA program, so no compile. None where ``dtype`` does not
    hold ``value`` exactly or the fill is over :data:`HOST_FILL_BYTES`."""
    held = _held_exactly(value, dtype)
    if held is None or math.prod(shape) * dtype.itemsize > HOST_FILL_BYTES:
        return None
    host = np.full(shape, held, dtype)
    array = put(host, platform.jax_device(index))
    keep_host_copy(array, host)
    return array


def _host_array(host: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a numpy array the device value may keep. On the CPU platform
    ``device_put(..., may_alias=False)`` still aliases suitably aligned host memory (torch's
    allocations are), so a tensor mutated after its transfer would change the device value."""
    array = host.numpy()
    return array.copy() if platform.platform() == "cpu" else array


def host_array(host: torch.Tensor) -> np.ndarray:
    """A CPU tensor's elements as a numpy array of its own (bfloat16 as numpy's bfloat16)."""
    host = host.detach().resolve_conj().resolve_neg().contiguous()
    if host.dtype == torch.bfloat16:  # (its bits as numpy's bfloat16: no program, so no compile)
        return _host_array(host.view(torch.int16)).view(jnp.bfloat16)
    if host.dtype in FLOAT8:  # (numpy has no torch float8: its bits, as ml_dtypes' float8)
        return _host_array(host.view(torch.uint8)).view(TORCH_TO_JAX[host.dtype])
    return _host_array(host)


def to_device(host: torch.Tensor, index: int = 0) -> jax.Array:
    """A copy of a CPU tensor on ``tpu:index`` (never aliasing it: torch may mutate the host
    tensor later). A small integer or boolean one keeps its host copy (``host_copies.host_copy``)."""
    array = host_array(host)
    value = put(array, platform.jax_device(index))
    keep_host_copy(value, array)
    return value


def between_devices(value: jax.Array, index: int) -> jax.Array:
    """``value`` on ``tpu:index`` (a device-to-device copy when it is elsewhere)."""
    device = platform.jax_device(index)
    if value.sharding._device is device:
        return value
    return jax.device_put(value, device)


def _host_view(value: jax.Array | np.ndarray) -> torch.Tensor:
    """A read-only CPU tensor over the value's host copy (zero-copy on the CPU platform)."""
    if type(value) is not np.ndarray:
        value = np.asarray(checks.before_host_read(value))  # a sync point in fused eager
    with warnings.catch_warnings():  # the view is only read, never written
        warnings.simplefilter("ignore", UserWarning)
        if value.dtype == jnp.bfloat16:  # torch reads no numpy bfloat16: its bits, viewed back
            return torch.from_numpy(value.view(np.int16)).view(torch.bfloat16)
        if value.dtype in FLOAT8_JAX:  # (nor float8)
            return torch.from_numpy(value.view(np.uint8)).view(JAX_TO_TORCH[value.dtype])
        return torch.from_numpy(value)


def to_host(value: jax.Array | np.ndarray) -> torch.Tensor:
    """A new CPU tensor with the contents of ``value`` (a device array, or a host array read
    already), owning ordinary (resizable) storage."""
    view = _host_view(value)
    return torch.empty(view.shape, dtype=view.dtype).copy_(view)
