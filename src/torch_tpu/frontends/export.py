"""``torch.export`` programs as StableHLO: the portable artifact XLA (and JAX) runs anywhere.

:func:`to_stablehlo` interprets an ``ExportedProgram``'s graph through the same tpu lowerings as
eager and ``torch.compile`` (:class:`torch_tpu.frontends.compile.Program`), traced by ``jax.jit``. The
result holds the StableHLO text, a serialized ``jax.export`` artifact that JAX can load and run
without torch or torch_tpu, and the program's weights in the order the artifact takes them.

Example::

    >>> import torch, jax, torch_tpu
    >>> model = torch.nn.Linear(3, 2)
    >>> x = torch.ones(1, 3)
    >>> program = torch_tpu.to_stablehlo(torch.export.export(model, (x,)))
    >>> "stablehlo.dot_general" in program.text
    True
    >>> artifact = jax.export.deserialize(program.serialized)
    >>> out = artifact.call(*program.jax_state(), jax.numpy.ones((1, 3), "float32"))
    >>> out[0].shape
    (1, 2)
    >>> torch.allclose(program(x)[0], model(x), atol=1e-6)
    True
"""

from __future__ import annotations

import dataclasses

import jax
import torch

from ..runtime import tensor, transfer
from ..runtime.dtypes import to_jax
from .compile.program import Interpreter, traced_ops

__all__ = ["StableHLOProgram", "to_stablehlo"]

_STATE_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")


@dataclasses.dataclass(frozen=True)
class StableHLOProgram:
    """An exported program lowered to StableHLO.

    The artifact's inputs are ``state`` (weights, buffers and constants, named ``state_names``)
    followed by the user inputs (``input_names``); its outputs are ``output_names`` (mutated
    buffers' new values first, as ``torch.export`` orders them, then the user outputs).
    """

    text: str  # StableHLO MLIR text
    serialized: bytes  # ``jax.export`` serialization: ``jax.export.deserialize(...)``
    state_names: tuple[str, ...]
    state: tuple[torch.Tensor, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    def jax_state(self) -> list[jax.Array]:
        """``state`` as JAX arrays, the artifact's leading arguments."""
        return [transfer.to_device(t) for t in self.state]

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run the serialized artifact through JAX on CPU tensors; returns CPU tensors."""
        artifact = jax.export.deserialize(self.serialized)
        outputs = artifact.call(*self.jax_state(), *(transfer.to_device(a) for a in args))
        return tuple(transfer.to_host(o) for o in outputs)


def _placeholder_avals(graph_module: torch.fx.GraphModule) -> list[jax.ShapeDtypeStruct]:
    avals = []
    for node in graph_module.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            raise NotImplementedError(
                f"to_stablehlo: input {node.name} is {type(value).__name__}, not a tensor; export "
                "with tensor inputs only"
            )
        if any(not isinstance(d, int) for d in value.shape):
            raise NotImplementedError(
                f"to_stablehlo: input {node.name} has a dynamic shape {list(value.shape)}; XLA "
                "programs have static shapes. Export without dynamic_shapes (one program per "
                "shape), or pad inputs to a few sizes (torch_tpu.pad_to_bucket)"
            )
        avals.append(jax.ShapeDtypeStruct(tuple(value.shape), to_jax(value.dtype)))
    return avals


def _jax_function(graph_module: torch.fx.GraphModule):
    def run(*arrays):
        with traced_ops(jax.random.key(0)) as trace:
            outputs = Interpreter(graph_module, trace).run(*map(tensor.wrap, arrays))
            if trace.draws:
                raise NotImplementedError(
                    "to_stablehlo: the program draws random numbers (dropout in training mode?); "
                    "export the model in eval mode"
                )
            return [
                tensor.read(o)
                for o in torch.utils._pytree.tree_leaves(outputs)
                if isinstance(o, torch.Tensor)
            ]

    return run


def to_stablehlo(exported: torch.export.ExportedProgram) -> StableHLOProgram:
    """Lower ``exported`` (from ``torch.export.export(model, args)``) to StableHLO.

    Shapes are static: each exported shape is its own program. Index bounds are not checked
    inside the artifact (XLA clamps out-of-range indices).
    """
    # functional IR: buffers the program updates (BatchNorm's statistics in training mode)
    # become outputs instead of in-place writes the artifact would lose
    exported = exported.run_decompositions({})
    signature = exported.graph_signature
    state_names, state, input_names = [], [], []
    for spec in signature.input_specs:
        kind = spec.kind.name
        if kind in _STATE_KINDS:
            value = exported.state_dict.get(spec.target)
            if value is None:
                value = exported.constants[spec.target]
            state_names.append(spec.target)
            state.append(value.detach().cpu())
        elif kind == "USER_INPUT":
            input_names.append(spec.arg.name)
        else:
            raise NotImplementedError(f"to_stablehlo: {kind} inputs are not supported")
    graph_module = exported.graph_module
    avals = _placeholder_avals(graph_module)
    jitted = jax.jit(_jax_function(graph_module))
    # the text comes from lowering (the artifact's own module text carries a debug location on
    # every line)
    artifact = jax.export.export(jitted)(*avals)
    return StableHLOProgram(
        text=jitted.lower(*avals).as_text(),
        serialized=bytes(artifact.serialize()),
        state_names=tuple(state_names),
        state=tuple(state),
        input_names=tuple(input_names),
        output_names=tuple(
            spec.arg.name
            for spec in signature.output_specs
            if isinstance(spec.arg, torch.export.graph_signature.TensorArgument)
        ),
    )
