"""``torch.compile(model, backend="tpu")``: a first backend that runs Dynamo's graphs fused.

Dynamo captures FX graphs, AOTAutograd splits them into forward and backward graphs of ATen ops,
and each graph runs through the same op lowerings as eager, recorded in fused eager, so one call
of a compiled graph is one cached XLA computation. Graph breaks work (each piece is its own
graph). PyTorch finds the backend through the ``torch_dynamo_backends`` entry point, so importing
torch_tpu does not import Dynamo.

Example::

    >>> import torch, torch_tpu
    >>> f = torch.compile(lambda x: (x.sin() * 2).sum(), backend="tpu")
    >>> round(f(torch.zeros(3, device="tpu")).item(), 4)
    0.0
"""
from __future__ import annotations

from typing import Callable

import torch

from . import execution


def _fused(graph: torch.fx.GraphModule, example_inputs) -> Callable:
    from torch._functorch.aot_autograd import make_boxed_func

    def run(*args):
        if execution.get_eager_mode() is execution.EagerMode.FUSED:
            return graph(*args)
        with execution.eager_mode("fused"):
            return graph(*args)
    return make_boxed_func(run)


def _skip_backend_frames() -> None:
    """Keep Dynamo out of torch_tpu's and JAX's own Python: after a graph break, eager ops reach
    our kernels as new Python frames, which Dynamo would otherwise try to compile."""
    from torch._dynamo import trace_rules
    for package in ("torch_tpu", "jax", "jaxlib"):
        trace_rules.add(package)


def backend(graph: torch.fx.GraphModule, example_inputs) -> Callable:
    """The Dynamo backend registered as ``"tpu"``."""
    from torch._dynamo.backends.common import aot_autograd
    _skip_backend_frames()
    return aot_autograd(fw_compiler=_fused, bw_compiler=_fused)(graph, example_inputs)
