"""XLA's own operations that ATen has no op for, as PyTorch ops: ``torch.tpu.ops``. Usable in
strict and fused eager, ``torch.compile``'d code and under autograd; on CPU tensors they run a
reference implementation.

- :func:`optimization_barrier`: the tensors unchanged, with XLA kept from moving computation
  across the barrier (from scheduling a recomputation before it, or fusing across it);
- :func:`ragged_dot`: XLA's grouped matmul (``lax.ragged_dot``), the matmul of
  mixture-of-experts layers: rows of ``lhs`` in consecutive groups, each times its own matrix.

>>> import torch, torch_tpu
>>> lhs, rhs = torch.ones(5, 2, device="tpu"), torch.ones(2, 2, 3, device="tpu")
>>> torch.tpu.ops.ragged_dot(lhs, rhs, torch.tensor([2, 2], device="tpu"))[:, 0].tolist()
[2.0, 2.0, 2.0, 2.0, 0.0]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..pallas import jax_op
from ..runtime import precision

__all__ = ["optimization_barrier", "ragged_dot"]


@jax_op("torch_tpu::optimization_barrier")
def _optimization_barrier(tensors: list[jax.Array]) -> list[jax.Array]:
    return list(lax.optimization_barrier(tuple(tensors)))


@_optimization_barrier.register_kernel("cpu")
def _optimization_barrier_cpu(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in tensors]  # (a custom op's outputs may not alias its inputs)


@jax_op("torch_tpu::ragged_dot")
def _ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    return lax.ragged_dot(
        lhs, rhs, group_sizes.astype(jnp.int32), precision=precision.matmul_precision(lhs.dtype)
    )


@_ragged_dot.register_kernel("cpu")
def _ragged_dot_cpu(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    pieces, start = [], 0
    for group, size in enumerate(group_sizes.tolist()):
        pieces.append(lhs[start : start + size] @ rhs[group])
        start += size
    pieces.append(lhs.new_zeros(lhs.shape[0] - start, rhs.shape[2]))  # (rows past the groups)
    return torch.cat(pieces)


def _cpu_backward(name: str):
    """Register the CPU kernel of ``name``'s backward op (``jax_op`` defines it for tpu)."""
    from torch._library.custom_ops import _maybe_get_opdef

    return _maybe_get_opdef(f"torch_tpu::{name}_jax_vjp").register_kernel("cpu")


def _barrier_context(ctx, inputs, output) -> None:
    pass


def _barrier_backward(ctx, grads: list) -> tuple:
    """The gradients pass the barrier unchanged (as a list: the op takes a list)."""
    return (list(grads),)


_optimization_barrier.register_autograd(_barrier_backward, setup_context=_barrier_context)


@_cpu_backward("ragged_dot")
def _ragged_dot_vjp_cpu(lhs, rhs, group_sizes, grad_outputs: list) -> list[torch.Tensor]:
    _, vjp = torch.func.vjp(lambda a, b: _ragged_dot_cpu(a, b, group_sizes), lhs, rhs)
    return list(vjp(grad_outputs[0]))


def optimization_barrier(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors``, unchanged, behind a barrier XLA does not move computation across (``jax.lax.
    optimization_barrier``): e.g. to keep a rematerialized activation from being computed early."""
    return tuple(torch.ops.torch_tpu.optimization_barrier(list(tensors)))


def ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """``lhs`` ``[m, k]``'s rows in consecutive groups of ``group_sizes`` ``[g]`` (integers, sum
    at most ``m``), group ``i`` times ``rhs[i]`` (``rhs`` ``[g, k, n]``): ``[m, n]``, zeros in the
    rows past the groups. XLA's native grouped matmul (``jax.lax.ragged_dot``), under the float32
    matmul precision; :func:`torch_tpu.kernels.grouped_matmul` is the Pallas kernel. Differentiable
    in ``lhs`` and ``rhs``."""
    if lhs.dim() != 2 or rhs.dim() != 3 or group_sizes.dim() != 1:
        raise ValueError(
            f"ragged_dot: expected lhs [m, k], rhs [g, k, n] and group_sizes [g]; got {list(lhs.shape)}, "
            f"{list(rhs.shape)} and {list(group_sizes.shape)}"
        )
    if lhs.shape[1] != rhs.shape[1] or rhs.shape[0] != group_sizes.shape[0]:
        raise ValueError(
            f"ragged_dot: lhs {list(lhs.shape)}, rhs {list(rhs.shape)} and group_sizes "
            f"{list(group_sizes.shape)} do not fit (lhs's k is rhs's dim 1, group_sizes has rhs's g)"
        )
    if group_sizes.dtype.is_floating_point or group_sizes.dtype.is_complex:
        raise TypeError(f"ragged_dot: group_sizes must be integers, got {group_sizes.dtype}")
    return torch.ops.torch_tpu.ragged_dot(lhs, rhs, group_sizes)
