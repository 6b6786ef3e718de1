"""Runtime kernels: tensor creation, copies, views, resizing, and scalars.

These manage tpu tensors themselves instead of mapping arrays to arrays, so they are ``runtime``
entries of the table. Views compute sizes, strides and offset over the *same* storage with
PyTorch's own kernels (CPU's, registered by the C++ runtime core; without the core, Meta's by
redispatch): aliasing, version counters and autograd's view tracking are PyTorch's own.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from ..runtime import buffer, checks, overlap, padding, platform, tensor, transfer
from ..runtime.buffer import apply
from ..runtime.dtypes import TORCH_TO_JAX, cast, check_scalar, to_jax
from ..runtime.flags import flags
from ._helpers import warn
from .creation import _filled
from .registry import lower, runtime

aten = torch.ops.aten
_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def _target_dtype(dtype):
    return torch.get_default_dtype() if dtype is None else dtype


@runtime(aten.empty.memory_format)
def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    strides = None
    if memory_format not in (None, torch.contiguous_format):  # channels-last strides (or the
        # error PyTorch raises for the formats ``empty`` does not take) from the Meta kernel
        strides = torch.empty(size, device="meta", memory_format=memory_format).stride()
    else:
        made = _padded_empty(size, _target_dtype(dtype))
        if made is not None:
            return made
    return tensor.empty(size, _target_dtype(dtype), strides=strides)


def _padded_empty(size, dtype: torch.dtype) -> torch.Tensor | None:
    """``torch.empty(size)`` padded to its buckets where the user's line has made tensors of
    other sizes before (``padding.learned_layout``: ``torch.empty(n).uniform_()`` for each new
    ``n`` then runs the bucket's programs); None elsewhere. Its storage holds zeros."""
    if any(n < 0 for n in size):
        return None  # (the unpadded path raises PyTorch's error)
    jdtype = to_jax(dtype)
    layout = padding.learned_layout("empty", size, jdtype)
    if layout is None:
        return None
    return tensor.wrap_padded(buffer.Padded(_filled(layout.padded_shape, 0, jdtype), layout))


@runtime(aten.empty_strided)
def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return tensor.empty(size, _target_dtype(dtype), strides=stride)


def _meta_view(op):
    """A view kernel where the C++ runtime core (which runs CPU's view kernels) is not loaded:
    PyTorch's Meta kernel computes the geometry over the shared storage."""

    def view(self, *args, **kwargs):
        tensor.ensure_nbytes(self)
        return op.redispatch(_META, self, *args, **kwargs)

    runtime(op, native=True)(view)


# In-place metadata ops (squeeze_, t_, ...) check the storage size directly, so they come here too.
for _view_op in (
    aten.view.default,
    aten.as_strided.default,
    aten._reshape_alias.default,
    aten.unfold.default,
    aten.view_as_real.default,
    aten.view_as_complex.default,
    aten.squeeze_.default,
    aten.squeeze_.dim,
    aten.squeeze_.dims,
    aten.unsqueeze_.default,
    aten.transpose_.default,
    aten.t_.default,
):
    _meta_view(_view_op)


@lower(aten.unfold_backward.default)
def unfold_backward(grad, input_sizes, dim, size, step):
    """Sum each window's gradient back into the elements it was cut from (windows may overlap)."""
    if step <= 0:  # (CPU's checks, in its order and types)
        raise ValueError(f"step is {step} but must be > 0")
    if size < 0:
        raise RuntimeError(f"size is {size} but must be >= 0")
    if not input_sizes:  # a 0-dim input unfolds into one window of one element
        return grad.reshape(())
    dim %= len(input_sizes)
    windows = grad.shape[dim]
    source = (jnp.arange(windows)[:, None] * step + jnp.arange(size)).reshape(-1)
    per_window = jnp.moveaxis(grad, -1, dim + 1).reshape(
        input_sizes[:dim] + (windows * size,) + input_sizes[dim + 1 :]
    )
    return jnp.zeros(input_sizes, grad.dtype).at[(slice(None),) * dim + (source,)].add(per_window)


@runtime(aten.set_.source_Storage_storage_offset)
def set_storage(self, source, storage_offset, size, stride=()):
    if not buffer.has_value(source):
        raise RuntimeError("set_: the source storage is not a tpu storage")
    tensor.ensure_storage_nbytes(source)
    return aten.set_.source_Storage_storage_offset.redispatch(
        _META, self, source, storage_offset, size, stride
    )


@runtime(aten.set_.source_Storage)
def set_storage_whole(self, source):
    itemsize = self.element_size()
    return set_storage(self, source, 0, [buffer.nbytes(buffer.get(source)) // itemsize], [1])


@runtime(aten.set_.source_Tensor)
def set_tensor(self, source):
    tensor.ensure_nbytes(source)
    return aten.set_.source_Tensor.redispatch(_META, self, source)


@runtime(aten.resize_)
def resize_(self, size, memory_format=None):
    if tuple(self.shape) == tuple(size) and memory_format is None:
        return self  # as CPU: the same size keeps the strides (an expanded tensor stays one)
    if memory_format is torch.preserve_format:
        raise RuntimeError("Unsupported memory formatPreserve")  # (sic)
    storage = self.untyped_storage()
    dtype = to_jax(self.dtype)
    need = (self.storage_offset() + math.prod(size)) * dtype.itemsize
    current = buffer.get(storage)
    if buffer.nbytes(current) < need:
        if type(current) is buffer.Uninitialized:
            buffer.put(storage, buffer.Uninitialized(need // dtype.itemsize, dtype))
        else:
            old = tensor.storage_array(storage, dtype).reshape(-1)
            grown = jnp.zeros((need // dtype.itemsize,), dtype).at[: old.size].set(old)
            buffer.put(storage, grown)
    tensor.ensure_nbytes(self)
    # Meta's resize_ only accepts meta tensors; set_ gives the same geometry.
    strides = torch.empty(
        size, device="meta", memory_format=memory_format or torch.contiguous_format
    ).stride()
    return aten.set_.source_Storage_storage_offset.redispatch(
        _META, self, storage, self.storage_offset(), size, strides
    )


def _host_to_device(host: torch.Tensor, dtype: torch.dtype, index: int) -> jax.Array:
    """A CPU tensor on ``tpu:index``, for a tpu tensor of ``dtype`` (unsupported ``dtype``: the
    clear TypeError). A source dtype the device lacks (float64 is fine, complex32 is not) is
    cast on the host first, as CUDA's copy would on the device."""
    to_jax(dtype)
    if host.dtype not in TORCH_TO_JAX:
        host = host.to(dtype)
    return transfer.to_device(host, index)


def _padded_from_host(host: torch.Tensor, dtype: torch.dtype, index: int) -> buffer.Padded | None:
    """A CPU tensor put on ``tpu:index`` padded to its size buckets, where the user's code that
    copies it has copied tensors of other sizes there before (``padding.learned_layout``);
    else None."""
    if host.is_complex() or host.dtype not in TORCH_TO_JAX or not host.numel():
        return None
    layout = padding.learned_layout("host", host.shape, dtype)
    if layout is None:
        return None
    to_jax(dtype)
    array = transfer.host_array(host.to(dtype))
    return padding.from_host(array, layout, platform.jax_device(index))


def _on_device(source: torch.Tensor, index: int) -> jax.Array:
    """A tpu tensor's value on ``tpu:index`` (copied there from another device)."""
    value = tensor.read_keeping_padding(source)
    if type(value) is buffer.Padded:
        return value if not flags.others_used or source.get_device() == index else value.unpadded()
    if flags.others_used and source.get_device() != index:
        value = transfer.between_devices(buffer.resolved(value), index)
    return value


def _discards_imaginary(source: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether converting ``source`` to ``dtype`` drops an imaginary part (warned, as on CPU)."""
    if source.is_complex() and not dtype.is_complex:
        warn("Casting complex values to real discards the imaginary part")
        return True
    return False


@runtime(aten.copy_)
def copy_(self, src, non_blocking=False):
    if tensor.is_tpu(self):
        if _discards_imaginary(src, self.dtype):
            src = src.real
        index = tensor.device_index(self)
        if tensor.is_tpu(src):
            _check_copy(self, src)
            if not tensor.write_view(self, src):  # (a view into part of a storage: one program)
                tensor.write(self, _on_device(src, index))
        else:
            value = _host_to_device(src, self.dtype, index)
            _check_copy(self, src)
            tensor.write(self, value)
    else:
        self.copy_(_to_host(src))
    return self


def _check_copy(self: torch.Tensor, src: torch.Tensor) -> None:
    """PyTorch's errors for a copy between shapes that do not broadcast, or into a target that
    overlaps itself or its source (before anything is read or written)."""
    if tuple(src.shape) != tuple(self.shape):
        torch.broadcast_shapes(src.shape, self.shape)  # PyTorch's error for bad shapes
    overlap.check_writes([self], [src], copy=True)


@runtime(aten._to_copy)
def to_copy(
    self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None
):
    """A copy laid out as ``empty_like(self, memory_format=memory_format)``, as PyTorch's."""
    dtype = self.dtype if dtype is None else dtype
    target = torch.device(device) if device is not None else self.device
    if target.type == "tpu":
        _discards_imaginary(self, dtype)  # (the cast keeps the real part)
        if target.index is not None:
            index = platform.check_index(target.index)  # (tpu:LOCAL_RANK is a rank's tpu:0)
        else:
            index = tensor.device_index(self) if tensor.is_tpu(self) else _current_index()
        if not tensor.is_tpu(self):
            padded = _padded_from_host(self, dtype, index)
            if padded is not None:
                return tensor.wrap_like(padded, self, memory_format)
        value = _on_device(self, index) if tensor.is_tpu(self) else _host_to_device(self, dtype, index)
        target_dtype = to_jax(dtype)
        if type(value) is buffer.Padded:
            if value.dtype != target_dtype:
                value = buffer.Padded(apply(_astype, value.array, target_dtype), value.layout)
        elif value.dtype != target_dtype:  # (values are immutable: a new storage may share one)
            value = apply(_astype, value, target_dtype)
        return tensor.wrap_like(value, self, memory_format)
    host = _to_host(self).to(dtype=dtype, device=target)
    strides = tensor.like_strides(self, memory_format)
    if strides is None:
        return host
    return torch.empty_strided(host.shape, strides, dtype=dtype, device=target).copy_(host)


_astype = jax.jit(cast, static_argnums=1)


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A new CPU tensor with tpu tensor ``t``'s value (a small storage's view read on the host)."""
    host = tensor.read_on_host(t)
    return transfer.to_host(tensor.read_resolved(t) if host is None else host)


def _current_index() -> int:
    return torch.accelerator.current_device_index() if flags.others_used else 0


@runtime(aten._local_scalar_dense)
def local_scalar_dense(self):
    value = tensor.read_on_host(self)
    if value is None:
        value = checks.before_host_read(tensor.read(self))
    value = value.reshape(())
    if self.dtype.is_complex:
        return complex(value)
    if self.dtype.is_floating_point:
        return float(value)
    if self.dtype == torch.bool:
        return bool(value)
    return int(value)


@runtime(aten.fill_.Scalar, aten.fill_.Tensor)
def fill_(self, value):
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise RuntimeError(
                f"fill_ only supports 0-dimension value tensor but got tensor with {value.dim()} dimensions."
            )
        value = tensor.read(value) if tensor.is_tpu(value) else value.item()
    else:  # a Python number is converted as CPU converts it (a 0-dim tensor is cast instead)
        check_scalar(value, to_jax(self.dtype), self.numel())
    tensor.write(self, value)
    return self


@runtime(aten.zero_)
def zero_(self):
    tensor.write(self, 0)
    return self
