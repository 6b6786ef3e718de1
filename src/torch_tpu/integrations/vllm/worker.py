"""vLLM's GPU worker and model runner, pointed at a tpu device.

The model runner's host-side work (batching, block tables, sampling bookkeeping) is vLLM's own;
its device tensors simply live on tpu. What differs from a CUDA device: no CUDA streams, events or
graphs (the runner is built with tpu's streams and events in their place; a step runs in fused
eager instead, as a few XLA programs), device memory comes from ``torch.tpu``, and sampled tokens
are read back with a plain ``tolist()``.
"""

from __future__ import annotations

import contextlib
import os

import torch
from vllm.config import CompilationMode, CUDAGraphMode, set_current_vllm_config
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu.cudagraph_utils import has_compiled_submodule
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes

from torch_tpu.execution.modes import set_eager_mode
from torch_tpu.runtime.context import context

from . import graph

logger = init_logger(__name__)


@contextlib.contextmanager
def _tpu_streams():
    """While vLLM's runner is built, its ``torch.cuda`` streams and events are tpu's."""

    def event(*args, blocking=None, **kwargs):  # tpu events have no ``blocking``
        return torch.tpu.Event(*args, **kwargs)

    names = {
        "Stream": torch.tpu.Stream,
        "Event": event,
        "current_stream": torch.tpu.current_stream,
        "stream": torch.tpu.stream,
    }
    saved = {name: getattr(torch.cuda, name) for name in names}
    try:
        for name, value in names.items():
            setattr(torch.cuda, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)


class TpuModelRunner(GPUModelRunner):
    def __init__(self, vllm_config, device: torch.device):
        with _tpu_streams():
            super().__init__(vllm_config, device)

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        self.model = graph.rewrap(self.model, self.vllm_config)

    def capture_model(self) -> int:
        with _tpu_streams():  # (vLLM's capture runs on a stream of its own)
            return super().capture_model()

    def _sync_device(self) -> None:
        torch.tpu.synchronize(self.device)

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.tolist()


class TpuWorker(Worker):
    def init_device(self) -> None:
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        if self.parallel_config.world_size > 1:
            # Each worker (a process of its own) drives one device, its own tpu:0, which also
            # answers to the host-wide number vLLM gives it, ``tpu:local_rank``, as under torchrun
            # (docs/distributed.md).
            os.environ["LOCAL_RANK"] = str(self.local_rank)
        # The process group comes before the device's first use: with several workers it makes
        # this process one of JAX's multi-process runtime, which only a device not yet started
        # can join (docs/distributed.md).
        init_worker_distributed_environment(
            self.vllm_config,
            self.rank,
            self.distributed_init_method,
            self.local_rank,
            current_platform.dist_backend,
        )
        self.device = torch.device("tpu", self.local_rank)
        torch.tpu.set_device(self.device)
        # The engine's thread runs in fused eager: a step's ops (input preparation, the model,
        # sampling) are recorded and run as one XLA program when the sampled tokens are read,
        # compiled once per batch shape (docs/execution.md). With vLLM's engine in the caller's
        # process (VLLM_ENABLE_V1_MULTIPROCESSING=0) that is the caller's thread.
        set_eager_mode("fused")
        # Its steps' shapes are a bounded set (vLLM's batch sizes): each graph compiles once
        # and stays whole, where ops whose shapes differ from one batch size to the next would
        # be learned as changing and run one by one (docs/execution.md).
        context.shapes_recur = True
        set_random_seed(self.model_config.seed)
        self._init_workspace_and_model_runner()

    def _make_model_runner(self) -> TpuModelRunner:
        return TpuModelRunner(self.vllm_config, self.device)

    @torch.inference_mode()
    def determine_available_memory(self) -> int:
        """The KV cache's bytes: the user's ``kv_cache_memory_bytes``, else the device memory
        ``gpu_memory_utilization`` grants, less the peak a full-size profiling step reaches."""
        if explicit := self.cache_config.kv_cache_memory_bytes:
            return explicit
        torch.tpu.reset_peak_memory_stats(self.device)
        with set_current_vllm_config(self.vllm_config):
            self.model_runner.profile_run()
        torch.tpu.synchronize(self.device)
        total = torch.tpu.get_device_properties(self.device).total_memory
        granted = int(total * self.cache_config.gpu_memory_utilization)
        available = granted - torch.tpu.max_memory_allocated(self.device)
        if available <= 0:
            raise ValueError(
                f"No memory left for the KV cache on {self.device}: the model's peak is "
                f"{torch.tpu.max_memory_allocated(self.device)} bytes of the {granted} granted by "
                "gpu_memory_utilization. Raise gpu_memory_utilization or set kv_cache_memory_bytes."
            )
        return available

    def compile_or_warm_up_model(self) -> CompilationTimes:
        # No CUDA graphs to capture. A compiled model is traced by Dynamo at its first call, once
        # for every token count (a symbolic size), but Dynamo fixes a size of 1 it sees then: a
        # first request of one token would leave a model that only takes one. So the first call
        # is a dummy step of two tokens (vLLM's GPU worker uses its largest size; for XLA that is
        # just one more executable to build); XLA compiles each real size when it first comes.
        if self.compilation_config.mode == CompilationMode.VLLM_COMPILE and has_compiled_submodule(
            self.model_runner.get_model()
        ):
            self.model_runner._dummy_run(2, skip_eplb=True, remove_lora=False)
        # Full graphs: each capture size's step is captured and compiled now (graph.py).
        if self.compilation_config.cudagraph_mode != CUDAGraphMode.NONE:
            self.model_runner.capture_model()
        set_random_seed(self.model_config.seed)
        return CompilationTimes(
            language_model=self.compilation_config.compilation_time,
            encoder=self.compilation_config.encoder_compilation_time,
        )

    def _maybe_get_memory_pool_context(self, tag: str) -> contextlib.AbstractContextManager:
        # No sleep mode (vLLM's pooled allocator is CUDA's): allocations go to tpu as they are.
        return contextlib.nullcontext()

    def sleep(self, level: int = 1) -> None:
        raise NotImplementedError("sleep mode is not supported on tpu")

    def wake_up(self, tags: list[str] | None = None) -> None:
        raise NotImplementedError("sleep mode is not supported on tpu")
