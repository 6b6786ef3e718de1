"""vLLM's full CUDA graphs on tpu: the whole model step captured as one XLA program.

vLLM's model runner wraps the model in ``CUDAGraphWrapper`` when its ``cudagraph_mode`` has full
graphs, pads every batch it serves that way to one of the capture sizes, keeps the model's
inputs and the attention metadata in persistent buffers, and captures each size at start-up
(``capture_model``). This wrapper is that class with ``torch.tpu.TPUGraph`` in place of CUDA's:
a capture records the model's forward (attention included) into one program, compiled there; a
replay runs it on the buffers' current contents without recording an op.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.compilation.counter import compilation_counter
from vllm.compilation.cuda_graph import CUDAGraphEntry, CUDAGraphWrapper
from vllm.compilation.monitor import validate_cudagraph_capturing_enabled
from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context, is_forward_context_available


class TpuGraphWrapper(CUDAGraphWrapper):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not is_forward_context_available():
            return self.runnable(*args, **kwargs)
        context = get_forward_context()
        mode = context.cudagraph_runtime_mode
        if mode == CUDAGraphMode.NONE or mode != self.runtime_mode:
            return self.runnable(*args, **kwargs)
        descriptor = context.batch_descriptor
        entry = self.concrete_cudagraph_entries.get(descriptor)
        if entry is None:
            entry = self.concrete_cudagraph_entries[descriptor] = CUDAGraphEntry(batch_descriptor=descriptor)
        if entry.cudagraph is None:
            validate_cudagraph_capturing_enabled()
            graph = torch.tpu.TPUGraph()
            with torch.tpu.graph(graph):
                output = self.runnable(*args, **kwargs)
            # (held, not weakly referenced as CUDA's are: a replay writes into these tensors)
            entry.output, entry.cudagraph = output, graph
            compilation_counter.num_cudagraph_captured += 1
            return output
        entry.cudagraph.replay()
        return entry.output


def rewrap(model: Any, vllm_config) -> Any:
    """``model`` with vLLM's full-graph ``CUDAGraphWrapper`` (which the GPU model runner uses
    whatever the platform) replaced by :class:`TpuGraphWrapper`."""
    if type(model) is CUDAGraphWrapper:
        return TpuGraphWrapper(model.runnable, vllm_config, runtime_mode=model.runtime_mode)
    return model
