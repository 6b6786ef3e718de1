"""JAX and Pallas functions as PyTorch ops on tpu tensors.

``jax_op("ns::name", fn)`` turns a type-annotated JAX function into the custom op
``torch.ops.ns.name``: its tpu kernel is a lowering like ATen's (run at once in strict eager,
recorded into fused graphs, traced into ``torch.compile`` programs and StableHLO exports), its
fake kernel is ``jax.eval_shape`` of the function, and its backward is ``jax.vjp`` of it.
``pl.pallas_call`` kernels inside run compiled on a TPU and in Pallas' TPU interpret mode on
any other platform (``interpret_mode``). See ``docs/kernels.md``.

Modules: ``_op`` (``jax_op``), ``_interpret`` (where kernels run), ``_blocks`` (what Pallas TPU
kernels share: grid semantics, block lengths, padding), ``_jax_callable`` and
``_custom_kernels`` (upstream TorchTPU's older kernel API, re-exported by
``torch_tpu._internal.pallas``).
"""

from __future__ import annotations

from ._interpret import interpret_mode
from ._jax_callable import custom_jax_kernel
from ._op import jax_op

__all__ = ["custom_jax_kernel", "interpret_mode", "jax_op"]
