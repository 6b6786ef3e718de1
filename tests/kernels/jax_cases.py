"""Shared by the kernel tests: a JAX function's value and gradients on CPU tensors, and each
result compared with PyTorch CPU's, within the tolerance the float64 computation gives."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu.testing.reference import assert_matches_cpu, widened


def to_jax(t: torch.Tensor) -> jax.Array:
    if t.dtype == torch.bfloat16:
        return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)
    return jnp.asarray(t.numpy())


def to_torch(a: jax.Array, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.array(a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a)).to(dtype)


def jax_value_and_grads(
    fn: Callable, inputs: Sequence[torch.Tensor], cotangent: torch.Tensor, wrt: Sequence[int]
):
    """(fn's output, the gradients of ``<output, cotangent>`` for the inputs at ``wrt``), as
    CPU tensors: ``fn`` takes JAX arrays of ``inputs``."""
    arrays = [to_jax(t) for t in inputs]

    def of(*diff):
        full = list(arrays)
        for i, a in zip(wrt, diff):
            full[i] = a
        return fn(*full)

    out, pullback = jax.vjp(of, *(arrays[i] for i in wrt))
    grads = pullback(to_jax(cotangent))
    return to_torch(out, cotangent.dtype), [to_torch(g, inputs[i].dtype) for g, i in zip(grads, wrt)]


def torch_value_and_grads(
    fn: Callable, inputs: Sequence[torch.Tensor], cotangent: torch.Tensor, wrt: Sequence[int]
):
    """The same for a PyTorch function (inputs on any device; results on CPU)."""
    leaves = [t.detach().requires_grad_(i in wrt) for i, t in enumerate(inputs)]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, [leaves[i] for i in wrt], cotangent.to(out.device, out.dtype))
    return out.detach().cpu(), [g.cpu() for g in grads]


def assert_matches_composition(actual, composition: Callable, inputs, cotangent, wrt, part=(...,)) -> None:
    """``actual`` (output, gradients) against ``composition`` on CPU, with the tolerance its
    float64 run gives; the outputs are compared at index ``part``."""
    expected = torch_value_and_grads(composition, inputs, cotangent, wrt)
    reference = torch_value_and_grads(composition, [widened(t) for t in inputs], widened(cotangent), wrt)
    assert_matches_cpu(actual[0][part], expected[0][part], reference[0][part], "output")
    for i, got, want, ref in zip(wrt, actual[1], expected[1], reference[1]):
        assert_matches_cpu(got, want, ref, f"gradient of input {i}")
