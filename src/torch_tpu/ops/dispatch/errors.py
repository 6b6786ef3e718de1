"""PyTorch's exceptions for calls a lowering or its program refused: device mismatches, the
dtypes CPU's kernel refuses, and the argument checks of PyTorch's meta kernels replayed."""

from __future__ import annotations

import torch

from ...runtime import platform
from ..meta import NEEDS_VALUES_MESSAGES, to_meta
from .binding import is_out


def device_mismatch(t: torch.Tensor, index: int = 0) -> RuntimeError:
    return platform.mixed_devices(f"tpu:{index}", t.device)


def mixed_devices(args: tuple, kwargs: dict) -> RuntimeError | None:
    """The device error for a call whose tensors JAX found on two devices (None if they are not:
    then the error was not the caller's)."""
    devices = []
    for x in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(x, torch.Tensor) and not x.is_cpu and x.device not in devices:
            devices.append(x.device)
    return platform.mixed_devices(*devices[:2]) if len(devices) > 1 else None


def check_dtypes(dtype_guard, op, names, values, types, args: tuple, kwargs: dict) -> bool:
    """Run ``dtype_guard``; returns whether its verdict hung on more than dtypes."""
    try:
        return dtype_guard(values, types)
    except NotImplementedError as refusal:  # after PyTorch's own argument checks, as on CPU
        raise _refusal_meta_error(op, names, args, kwargs, refusal) or refusal from None


def _refusal_meta_error(op, names, args: tuple, kwargs: dict, refusal) -> Exception | None:
    """PyTorch's argument checks for a call CPU's kernel refuses: the meta replay with the
    refused tensors as a dtype the kernel takes. Which ones is a guess (only the refused
    argument, or every tensor of its dtype: an index or a second operand of that dtype), so a
    check must fire both ways, as a shape check does (not one about the stand-ins' dtypes)."""
    if getattr(refusal, "stand_in", None) is None:
        return meta_error(op, args, kwargs)
    positions, dtype, stand_in = refusal.stand_in
    errors = [
        meta_error(op, *_stand_ins(names, args, kwargs, swapped, dtype, stand_in))
        for swapped in (positions, range(len(names)))
    ]
    return errors[0] if all(errors) else None


def _stand_ins(names, args: tuple, kwargs: dict, positions, dtype, stand_in) -> tuple[tuple, dict]:
    """The call with the tensors of ``dtype`` at these argument positions as meta tensors of
    dtype ``stand_in``."""

    def swap(x):
        if isinstance(x, torch.Tensor) and x.dtype == dtype:
            return torch.empty_strided(x.shape, x.stride(), dtype=stand_in, device="meta")
        return x

    def at(position, value):
        return torch.utils._pytree.tree_map(swap, value) if position in positions else value

    args = tuple(at(i, a) for i, a in enumerate(args))
    kwargs = {k: at(names.index(k) if k in names else -1, v) for k, v in kwargs.items()}
    return args, kwargs


def meta_error(op, args: tuple, kwargs: dict) -> Exception | None:
    """The exception PyTorch itself raises for these arguments, found by replaying the call on
    meta tensors, whose kernels carry PyTorch's shape and dtype checks (None: meta accepts them,
    or has no kernel for the op)."""
    meta_args, meta_kwargs = to_meta((args, kwargs), tpu_only=True)
    try:
        op(*meta_args, **meta_kwargs)
    except NotImplementedError:  # no meta kernel (data-dependent ops)
        return None
    except (RuntimeError, IndexError, ValueError, TypeError) as torch_error:
        if any(text in str(torch_error) for text in NEEDS_VALUES_MESSAGES):
            return None  # meta cannot run it, no check of PyTorch's
        return torch_error
    except Exception:  # noqa: BLE001  (no usable meta kernel)
        return None
    return None


#: How the meta kernels of elementwise ops (Python references) word operands that do not
#: broadcast; CPU's TensorIterator says it as ``at::infer_size`` does (other ops' meta kernels
#: word it as CPU's do, or broadcast only some dims: theirs is kept)
_PRIMS_BROADCAST_ERROR = "Attempting to broadcast a dimension of length"


def _broadcast_error(op, args: tuple, kwargs: dict) -> RuntimeError | None:
    """CPU's error for an elementwise op whose tensors do not broadcast: TensorIterator folds
    their shapes in argument order (``out=`` tensors, resized to the result, left out) with
    ``at::infer_size``, whose error names the shape so far ("tensor a") and the next one
    ("tensor b"); None if they broadcast (the meta kernel refused something else)."""
    outs = {a.name for a in op._schema.arguments if is_out(a)}
    values = [*args, *(v for k, v in kwargs.items() if k not in outs)]
    shape = None
    try:
        for t in values:
            if isinstance(t, torch.Tensor):
                shape = t.shape if not shape else torch._C._infer_size(shape, t.shape)
    except RuntimeError as error:
        return error
    return None


def translate(op, error: Exception, args: tuple, kwargs: dict, elementwise: bool = False) -> Exception:
    """PyTorch's exception for these arguments (``meta_error``; for an ``elementwise`` op's
    operands that do not broadcast, TensorIterator's), else one naming the op."""
    translated = meta_error(op, args, kwargs)
    if elementwise and str(translated).startswith(_PRIMS_BROADCAST_ERROR):
        translated = _broadcast_error(op, args, kwargs) or translated
    return translated or RuntimeError(f"{op} on tpu: {error}")
