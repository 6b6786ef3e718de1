"""vLLM's compile of the model (``CompilationMode.VLLM_COMPILE``), through torch_tpu's backend.

vLLM traces the model with Dynamo once for every token count, splits the graph at each attention
(its ``splitting_ops``: attention reads per-step metadata that is no input of the graph, so it runs
eagerly between the pieces) and hands each piece to the platform's compiler, this class. Each piece
becomes ``torch.compile(backend="tpu")``'s compiled graph: AOTAutograd's ATen graph, one XLA
executable per input shape.

vLLM saves the compiled model (``VLLM_USE_AOT_COMPILE``, on by default) as Dynamo's code plus
each piece's ``serialize()`` bytes, read back with Inductor's ``AOTCompiledArtifact``; a piece
here is therefore returned in that wrapper (AOTAutograd's serializable result inside it pickles
our graph without its executables, :class:`~torch_tpu.frontends.compile.CompiledGraph`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._inductor.standalone_compile import AOTCompiledArtifact
from vllm.compilation.compiler_interface import CompilerInterface


class TpuCompiler(CompilerInterface):
    name = "tpu"

    def compute_hash(self, vllm_config) -> str:
        from torch_tpu.frontends.compile import cache_key

        return cache_key()

    def compile(
        self,
        graph: torch.fx.GraphModule,
        example_inputs: list[Any],
        compiler_config: dict[str, Any],
        compile_range,
        key: str | None = None,
    ) -> tuple[Callable, None]:
        from torch_tpu.frontends.compile import backend

        # Static programs per token count, as before size buckets: vLLM's graphs are symbolic
        # in the number of tokens, and a bucketed graph records its ops on every call (fused
        # eager's host cost), which a serving step cannot afford.
        compiled = backend(graph, example_inputs, options={"bounded_dynamism": False})
        # (serializable when vLLM saves the model: it compiles under AOTAutograd's bundled cache)
        if hasattr(compiled, "serialize"):
            compiled = AOTCompiledArtifact(compiled)
        # No handle: vLLM's per-piece cache is Inductor's; the saved model above covers restarts.
        return compiled, None
