"""Ops with no tpu lowering: ``NotImplementedError`` naming the op, or with
``TORCH_TPU_CPU_FALLBACK=1`` the op run on CPU (counted in ``recording.cpu_fallback_counts``)."""

from __future__ import annotations

import torch

from ... import config
from ...runtime import tensor
from ..registry import qualified_name
from . import recording


def _cpu(x):
    if isinstance(x, torch.device) and x.type == "tpu":  # factories build on CPU, then move
        return torch.device("cpu")
    return x.cpu() if tensor.is_tpu(x) else x


def fallback(op: torch._ops.OpOverload, *args, **kwargs):
    """An op with no tpu lowering: ``NotImplementedError`` naming it, or with
    ``TORCH_TPU_CPU_FALLBACK=1`` the op run on CPU (counted)."""
    name = qualified_name(op)
    tree = torch.utils._pytree
    if not config.cpu_fallback:
        sparse = any(isinstance(x, torch.Tensor) and x.is_sparse for x in tree.tree_leaves((args, kwargs)))
        raise NotImplementedError(
            f"'{name}' has no tpu lowering{' for sparse tensors' if sparse else ''}. Set "
            "TORCH_TPU_CPU_FALLBACK=1 to run it on CPU instead (slow; counted in "
            "torch_tpu.cpu_fallback_counts())."
        )
    recording.cpu_fallback_counts[name] += 1
    cpu_args, cpu_kwargs = tree.tree_map(_cpu, (args, kwargs))
    result = op(*cpu_args, **cpu_kwargs)
    written = _written_back(op, args, kwargs, cpu_args, cpu_kwargs)
    if written is not None:
        return written
    return tree.tree_map(lambda x: x.to("tpu") if isinstance(x, torch.Tensor) else x, result)


def _written_back(op, args: tuple, kwargs: dict, cpu_args: tuple, cpu_kwargs: dict) -> torch.Tensor | None:
    """Copy the arguments the op mutated on CPU back into the tpu tensors; the written tensor
    where the op returns it (an in-place op's ``self``)."""
    schema = op._schema
    bound = dict(zip([a.name for a in schema.arguments], args), **kwargs)
    cpu_bound = dict(zip([a.name for a in schema.arguments], cpu_args), **cpu_kwargs)
    for a in schema.arguments:
        if a.alias_info is not None and a.alias_info.is_write and tensor.is_tpu(bound.get(a.name)):
            bound[a.name].copy_(cpu_bound[a.name])
            if len(schema.returns) == 1 and schema.returns[0].alias_info is not None:
                return bound[a.name]
    return None
