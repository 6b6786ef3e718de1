"""The tpu as a vLLM platform: what vLLM asks of a device, answered from ``torch.tpu``.

vLLM's model code, scheduler, sampler and model runner are used as they are. This class tells them
which device to use ("tpu", kernels registered on PrivateUse1), which worker, attention backend and
distributed backend to use, and what graph capture means here: no CUDA graphs; vLLM's own compile
of the model runs through ``torch.compile(backend="tpu")`` (``compiler.py``: the pieces between
attention layers as XLA executables), and the worker runs the rest of each step in fused eager.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
import vllm.envs as envs
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

from ...runtime import memory, platform

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

logger = init_logger(__name__)

#: Paged attention as plain torch ops on tpu tensors (``attention.py``).
ATTENTION_BACKEND = "torch_tpu.integrations.vllm.attention.TpuAttentionBackend"
#: The block size (tokens per KV-cache page) when the user sets none.
DEFAULT_BLOCK_SIZE = 16
#: vLLM's collectives (its custom ops) at which a compiled model with several workers is split.
COLLECTIVE_OPS = ("vllm::all_reduce", "vllm::all_gather", "vllm::reduce_scatter")


class TpuPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "tpu"
    device_type: str = "tpu"
    # vLLM registers its custom ops (attention among them) for this dispatch key.
    dispatch_key: str = "PrivateUse1"
    dist_backend: str = "tpu_dist"
    # Standalone functions vLLM compiles on its own (outside the model) go to XLA too.
    simple_compile_backend: str = "tpu"
    # Quantized checkpoints vLLM serves on tpu: torchao's (int8 / float8 weights as torchao's
    # tensor subclasses, whose ops tpu lowers). vLLM refuses the others by name; its own "fp8"
    # picks a scaled-matmul kernel per platform and has none for out-of-tree ones.
    supported_quantization: list[str] = ["torchao"]

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return True

    @classmethod
    def import_kernels(cls) -> None:
        # vLLM's C++ ops as its CPU build loads them: one library per x86 instruction set (the
        # default ``vllm._C`` needs AVX-512 with BF16: an AVX2-only host dies of SIGILL)
        from vllm.platforms.cpu import CpuPlatform

        CpuPlatform.import_kernels()

    @classmethod
    def get_compile_backend(cls) -> str:
        # What compiles the model's pieces under vLLM's own compile (``compiler.py``).
        return "torch_tpu.integrations.vllm.compiler.TpuCompiler"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float32, torch.float16]

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype not in cls().supported_dtypes:
            raise ValueError(f"{dtype} is not supported on tpu (supported: {cls().supported_dtypes})")

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        # (vLLM's front end asks too: see get_device_total_memory)
        return platform.known_device_name() or torch.tpu.get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        # vLLM's front end asks before it forks its engine core: answered without starting the
        # device where that is known (a started XLA runtime does not survive fork)
        known = memory.known_total_memory()
        return known if known is not None else torch.tpu.get_device_properties(device_id).total_memory

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        return float(torch.tpu.memory_allocated(device))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.tpu.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.tpu.manual_seed_all(seed)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        # Host buffers vLLM stages inputs in are plain CPU tensors; a copy to tpu is one transfer.
        return False

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # Attention runs as vLLM's custom op, so a compiled model sees one node per layer and the
        # per-step metadata never becomes part of a traced graph.
        return True

    @classmethod
    def get_attn_backend_cls(
        cls,
        selected_backend: AttentionBackendEnum,
        attn_selector_config: AttentionSelectorConfig,
        num_heads: int | None = None,
    ) -> str:
        if attn_selector_config.use_mla or attn_selector_config.use_sparse:
            raise NotImplementedError("MLA and sparse attention are not supported on tpu.")
        if selected_backend is not None:
            logger.info("Attention backend %s is not available on tpu; using TPU_ATTN.", selected_backend)
        return ATTENTION_BACKEND

    @classmethod
    def get_punica_wrapper(cls) -> str:
        # LoRA's batched matmuls as plain torch ops (vLLM's own, for CPU), which tpu lowers
        return "torch_tpu.integrations.vllm.lora.TpuPunicaWrapper"

    @classmethod
    def use_custom_op_collectives(cls) -> bool:
        # A collective is one node of a traced model, vLLM's custom op: a compiled model is split
        # there (``check_and_update_config``) and it runs between the pieces, over ``tpu_dist``.
        return True

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        from vllm.triton_utils.dispatcher import register_kernels

        from . import kernels, rejection

        register_kernels({**kernels.OVERRIDES, **rejection.OVERRIDES})

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm.config import CompilationMode

        cache_config = vllm_config.cache_config
        if not cache_config.user_specified_block_size:
            cache_config.block_size = DEFAULT_BLOCK_SIZE

        parallel_config = vllm_config.parallel_config
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = "torch_tpu.integrations.vllm.worker.TpuWorker"
        parallel_config.enable_dbo = False
        forks = parallel_config.world_size > 1 or envs.VLLM_ENABLE_V1_MULTIPROCESSING
        if forks and torch.tpu.is_initialized():
            # The engine core and the workers are processes of their own; a forked copy of a
            # process whose device (JAX's backend) has started cannot use it, and a worker must
            # join JAX's multi-process runtime before its device starts (as for CUDA, vLLM's own
            # reason to spawn).
            logger.info(
                "The tpu device has started in this process: vLLM's processes are spawned, not forked."
            )
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
            # (vLLM caches its environment once an engine has started; the executor must read this)
            envs.disable_envs_cache()
        # Steps run one after the other: the worker reads each step's tokens before the next.
        vllm_config.scheduler_config.async_scheduling = False

        compilation = vllm_config.compilation_config
        _uncompiled_with_lora(vllm_config)
        if compilation.mode in (CompilationMode.STOCK_TORCH_COMPILE, CompilationMode.DYNAMO_TRACE_ONCE):
            # These compile the whole model as one graph, attention included; attention reads
            # its per-step metadata from vLLM's forward context, not from the graph's inputs, so
            # an XLA program would keep the first step's.
            raise NotImplementedError(
                f"compilation mode {compilation.mode.name} is not supported on tpu: use "
                "VLLM_COMPILE (the default, compiled between attention layers) or NONE"
            )
        _graph_sizes(vllm_config)
        # vLLM's fusion passes rewrite Inductor's graphs into CUDA/ROCm kernels (and would import
        # them); under our backend XLA fuses on its own.
        passes = compilation.pass_config
        for name in type(passes).__dataclass_fields__:
            if name.startswith(("fuse_", "enable_")):
                setattr(passes, name, False)
        if parallel_config.world_size > 1 and compilation.mode == CompilationMode.VLLM_COMPILE:
            # A graph with collectives compiles as one SPMD program over the ranks' devices, which
            # every rank's graph must match, but each rank's pieces differ (a vocab-parallel
            # embedding's shard bounds are constants in the first): the model is split at the
            # collectives too, each rank compiles its own pieces, and the collectives run
            # between them through the process group.
            if compilation.splitting_ops is None:  # (vLLM's default: at attention)
                compilation.set_splitting_ops_for_v1(
                    parallel_config.all2all_backend, parallel_config.data_parallel_size
                )
            compilation.splitting_ops += [op for op in COLLECTIVE_OPS if op not in compilation.splitting_ops]


def _uncompiled_with_lora(vllm_config: VllmConfig) -> None:
    """With LoRA on, the model runs in fused eager, as vLLM's CPU backend runs it: LoRA's Punica
    ops (``lora.py``) choose their path in Python from each step's adapters, so a compiled piece
    or a replayed step would keep the first step's choice (no adapter) for every adapter after it."""
    from vllm.config import CompilationMode, CUDAGraphMode

    if vllm_config.lora_config is not None:
        vllm_config.compilation_config.mode = CompilationMode.NONE
        vllm_config.compilation_config.cudagraph_mode = CUDAGraphMode.NONE


def _graph_sizes(vllm_config: VllmConfig) -> None:
    """Full graphs for decoding steps (``graph.py``), captured at powers of two up to
    ``max_num_seqs``: a decode step of n requests is padded to the next size and runs as one
    program. Steps with prefills run as before (fused eager, the compiled pieces). With
    ``enforce_eager`` (vLLM's NONE mode) or several workers, none."""
    from vllm.config import CUDAGraphMode

    compilation = vllm_config.compilation_config
    # (several workers: vLLM's capture asks for its CUDA communicators; not captured yet)
    if compilation.cudagraph_mode == CUDAGraphMode.NONE or vllm_config.parallel_config.world_size > 1:
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.cudagraph_capture_sizes = []
        compilation.max_cudagraph_capture_size = 0
    else:
        compilation.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
        scheduler = vllm_config.scheduler_config
        largest = min(scheduler.max_num_seqs, scheduler.max_num_batched_tokens)
        sizes = [1 << i for i in range(largest.bit_length()) if 1 << i <= largest]
        compilation.cudagraph_capture_sizes = sizes
        compilation.max_cudagraph_capture_size = sizes[-1]
    compilation.post_init_cudagraph_sizes()
