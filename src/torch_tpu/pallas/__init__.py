"""JAX and Pallas functions as PyTorch ops on tpu tensors.

``jax_op("ns::name", fn)`` turns a type-annotated JAX function into the custom op
``torch.ops.ns.name``: its tpu kernel is a lowering like ATen's (run at once in strict eager,
recorded into fused graphs, traced into ``torch.compile`` programs and StableHLO exports), its
fake kernel is ``jax.eval_shape`` of the function, and its backward is ``jax.vjp`` of it.
``pl.pallas_call`` kernels inside run compiled on a TPU and in Pallas' TPU interpret mode on
any other platform. See ``docs/kernels.md``.
"""

from __future__ import annotations

from ._op import custom_jax_kernel, jax_op

__all__ = ["custom_jax_kernel", "jax_op"]
