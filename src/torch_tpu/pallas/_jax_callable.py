"""``JaxCallable``: a jitted JAX function called on tpu tensors, one registered kernel
(``_custom_kernels``) per argument signature, and the placeholders it traces with. Upstream
TorchTPU's older kernel API, which Helion's Pallas launcher builds on (through
``torch_tpu._internal.pallas.pallas``), and what the deprecated ``custom_jax_kernel`` returns.
New code uses :func:`torch_tpu.pallas.jax_op`, which makes a real PyTorch op."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import torch

from ..runtime.dtypes import JAX_TO_TORCH, TORCH_TO_JAX
from . import _custom_kernels
from ._interpret import interpret_mode

__all__ = [
    "JAX_TO_TORCH_DTYPE_MAP",
    "TORCH_TO_JAX_DTYPE_MAP",
    "JaxCallable",
    "custom_jax_kernel",
    "jax_placeholder",
    "jax_placeholders",
    "torch_placeholder",
]

TORCH_TO_JAX_DTYPE_MAP = dict(TORCH_TO_JAX)
JAX_TO_TORCH_DTYPE_MAP = dict(JAX_TO_TORCH)


def jax_placeholder(tensor: Any) -> Any:
    """A tensor as the ``jax.ShapeDtypeStruct`` JAX traces with (anything else as it is)."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    dtype = TORCH_TO_JAX_DTYPE_MAP.get(tensor.dtype)
    if dtype is None:
        raise NotImplementedError(f"Unsupported dtype for pallas kernels: {tensor.dtype}")
    return jax.ShapeDtypeStruct(tuple(tensor.shape), dtype)


def jax_placeholders(tensors: Sequence[torch.Tensor] | torch.Tensor) -> Any:
    if isinstance(tensors, torch.Tensor):
        return jax_placeholder(tensors)
    return [jax_placeholder(t) for t in tensors]


def torch_placeholder(aval: Any) -> Any:
    """An output's shape and dtype as a meta tensor (anything else as it is)."""
    if not isinstance(aval, (jax.ShapeDtypeStruct, jax.core.ShapedArray)):
        return aval
    dtype = JAX_TO_TORCH_DTYPE_MAP.get(aval.dtype)
    if dtype is None:
        raise NotImplementedError(f"Unsupported dtype for pallas kernels: {aval.dtype}")
    return torch.empty(aval.shape, dtype=dtype, device="meta")


def _get_kernel_invocation_key(
    trace_key: str,
    input_args: Sequence[Any],
    input_kwargs: dict[str, Any],
    static_argnums: tuple[int, ...] = (),
) -> str:
    """What one kernel specialization is: the callable's key, each tensor's shape and dtype,
    every other argument's value (static ones marked), the keyword arguments."""

    def spelled(item: Any) -> str:
        return f"{item.shape}x{item.dtype}" if isinstance(item, torch.Tensor) else str(item)

    args = ",".join(
        f"static_{spelled(a)}" if i in static_argnums else spelled(a) for i, a in enumerate(input_args)
    )
    kwargs = ";".join(f"{k}:{spelled(v)}" for k, v in input_kwargs.items())
    return ";".join([trace_key, args, kwargs])


class JaxCallable:
    """A jitted JAX function called on tpu tensors.

    Each argument signature (``_get_kernel_invocation_key``) is traced once for its outputs
    (``output_shapes``: meta tensors and the output tree) and registered with
    ``_custom_kernels`` (upstream's ``tpu_torch_pallas``) under a fingerprint
    (``kernel_key_to_mlir_fingerprint``), which ``call_custom_kernel`` runs. Arguments are
    tensors or None, or values at ``static_argnums``.
    """

    def __init__(
        self,
        name: str,
        jit_fn: Any,
        trace_key: str,
        static_argnums: tuple[int, ...] = (),
        input_output_aliases: Mapping[int, int] | None = None,
        mesh: Any = None,
        input_partition_specs: Any = None,
        donate_argnums: Sequence[int] | None = None,
    ):
        self.name, self.jit_fn, self.trace_key = name, jit_fn, trace_key
        self.static_argnums = tuple(static_argnums)
        self.input_output_aliases = dict(input_output_aliases or {})
        self.mesh, self.input_partition_specs = mesh, input_partition_specs
        self.donate_argnums = None if donate_argnums is None else tuple(donate_argnums)
        self.output_shapes: dict[str, tuple[list, Any]] = {}
        self.kernel_key_to_mlir_fingerprint: dict[str, str] = {}

    def __repr__(self) -> str:
        return (
            f"JaxCallable(name={self.name}, trace_key={self.trace_key}, static_argnums={self.static_argnums})"
        )

    def _validate_args(self, *args) -> None:
        for i, arg in enumerate(args):
            if i in self.static_argnums:
                if isinstance(arg, torch.Tensor):
                    raise ValueError(
                        f"Argument at index {i} is marked as static but is a torch.Tensor. Tensors "
                        "cannot be static arguments."
                    )
            elif arg is not None and not isinstance(arg, torch.Tensor):
                raise TypeError(
                    f"custom kernels only support torch.Tensor and None inputs, but input {i} was of "
                    f"type {type(arg)}. Use static_argnums or functools.partial for non-tensor args."
                )

    def _kernel(self, args: tuple, kwargs: dict):
        """The function of this signature's tensor arrays (statics and Nones bound), returning
        its outputs flat."""
        fixed = {i: a for i, a in enumerate(args) if a is None or i in self.static_argnums}
        count, jit_fn = len(args), self.jit_fn

        def structure(*arrays):  # (its output tree, which the flat kernel drops)
            given = iter(arrays)
            with interpret_mode():
                return jit_fn(*(fixed[i] if i in fixed else next(given) for i in range(count)), **kwargs)

        def kernel(*arrays):
            return jax.tree_util.tree_leaves(structure(*arrays))

        tensors = [jax_placeholder(a) for i, a in enumerate(args) if i not in fixed]
        return kernel, jax.eval_shape(structure, *tensors)

    def __call__(self, *args, **kwargs) -> Any:
        self._validate_args(*args)
        key = _get_kernel_invocation_key(self.trace_key, args, kwargs, self.static_argnums)
        fingerprint = self.kernel_key_to_mlir_fingerprint.get(key)
        if fingerprint is None or not _custom_kernels.lookup_custom_kernel(self.name, fingerprint):
            kernel, out = self._kernel(args, kwargs)
            leaves, tree = jax.tree_util.tree_flatten(out)
            fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
            _custom_kernels.register_custom_kernel(self.name, fingerprint, fn=kernel)
            self.output_shapes[key] = ([torch_placeholder(a) for a in leaves], tree)
            self.kernel_key_to_mlir_fingerprint[key] = fingerprint
        output_shapes, tree = self.output_shapes[key]
        tensors = [a for i, a in enumerate(args) if a is not None and i not in self.static_argnums]
        results = _custom_kernels.call_custom_kernel(
            self.name,
            fingerprint,
            inputs=tensors,
            output_shapes=output_shapes,
            input_output_aliases=self.input_output_aliases,
            donate_argnums=self.donate_argnums,
        )
        return tree.unflatten(results)


def custom_jax_kernel(
    jax_fn: Callable | None = None,
    name: str | None = None,
    static_argnums: tuple[int, ...] = (),
    input_output_aliases: dict[int, int] | None = None,
    **jit_kwargs,
):
    """Deprecated (upstream's older API): a callable running ``jax.jit(jax_fn)`` on tpu tensors
    (a :class:`JaxCallable`); a decorator when ``jax_fn`` is left out. Use
    :func:`torch_tpu.pallas.jax_op`, which makes a real op (compile, export, autograd)."""
    warnings.warn(
        "torch_tpu.pallas.custom_jax_kernel is deprecated: use torch_tpu.pallas.jax_op",
        DeprecationWarning,
        stacklevel=2,
    )
    donate = jit_kwargs.get("donate_argnums")
    if input_output_aliases and donate is not None and set(donate) != set(input_output_aliases):
        raise ValueError("donate_argnums must be None or the same as the keys of input_output_aliases.")

    def make(fn):
        label = name or getattr(fn, "__name__", "kernel")
        trace_key = _get_kernel_invocation_key(
            f"{label}_{id(fn)}", [], {**jit_kwargs, "static_argnums": static_argnums}
        )
        return JaxCallable(
            label,
            jax.jit(fn, static_argnums=static_argnums, **jit_kwargs),
            trace_key,
            static_argnums=static_argnums,
            input_output_aliases=input_output_aliases,
            donate_argnums=donate,
        )

    return make if jax_fn is None else make(jax_fn)
