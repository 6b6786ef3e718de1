"""Environment switches, read once at import (names shared with upstream TorchTPU)."""

from __future__ import annotations

import os


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


#: ``TPU_LAUNCH_BLOCKING=1``: debug eager, block after every op so errors surface where they happen.
launch_blocking: bool = _flag("TPU_LAUNCH_BLOCKING")
#: ``TORCH_TPU_LOG_RECOMPILES=1``: say on stderr why each program compiles (always on the
#: ``torch_tpu`` logger at INFO).
log_recompiles: bool = _flag("TORCH_TPU_LOG_RECOMPILES")
#: ``TORCH_TPU_DEFER_AND_FUSE=1``: start in fused eager (ops recorded, compiled and run as graphs).
defer_and_fuse: bool = _flag("TORCH_TPU_DEFER_AND_FUSE")
#: ``TORCH_TPU_CACHE_DIR``: where compiled XLA executables persist across processes (default
#: ``$XDG_CACHE_HOME/torch_tpu``, i.e. ``~/.cache/torch_tpu``); empty or ``0`` turns it off.
cache_dir: str | None = os.environ.get(
    "TORCH_TPU_CACHE_DIR",
    os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch_tpu"),
)
if cache_dir in ("", "0"):
    cache_dir = None
#: ``TORCH_TPU_CACHE_MIN_COMPILE_SECONDS``: only executables that took at least this long to
#: compile are written to the persistent cache.
cache_min_compile_seconds: float = float(os.environ.get("TORCH_TPU_CACHE_MIN_COMPILE_SECONDS", "0"))
#: ``TORCH_TPU_CACHE_WAIT_SECONDS``: processes sharing the cache directory compile each program
#: once: one compiles it, the others wait up to this long for its entry (0: each compiles its own).
cache_wait_seconds: float = float(os.environ.get("TORCH_TPU_CACHE_WAIT_SECONDS", "300"))
#: ``TORCH_TPU_FLASH_ATTENTION=1``: ``F.scaled_dot_product_attention`` on a TPU runs the Pallas flash
#: kernel where it applies (``torch_tpu.kernels.use_flash_attention``), set when the device starts.
flash_attention: bool = _flag("TORCH_TPU_FLASH_ATTENTION")
#: ``TORCH_TPU_XLA_TRACE_DIR``: each ``torch.profiler`` session with tpu activities also writes
#: XLA's own trace (an XSpace) there, laid out as TensorBoard's profile plugin and XProf read it.
xla_trace_dir: str | None = os.environ.get("TORCH_TPU_XLA_TRACE_DIR") or None
#: ``TORCH_TPU_CPU_FALLBACK=1``: run ops with no tpu lowering on CPU (slow, counted, reported).
cpu_fallback: bool = _flag("TORCH_TPU_CPU_FALLBACK")
#: ``TORCH_TPU_PLATFORM=cpu|gpu|tpu``: force the XLA platform instead of the best available one.
platform: str | None = os.environ.get("TORCH_TPU_PLATFORM") or None
#: ``TORCH_TPU_CACHE_ENTRIES``: how many entries each in-process cache keeps (compiled graphs and
#: programs, per-op shape signatures, scalar constants), least recently used dropped first.
cache_entries: int = int(os.environ.get("TORCH_TPU_CACHE_ENTRIES", "4096"))
#: ``TORCH_TPU_CHECK_META=1``: a test tool: every tpu kernel call is replayed on meta tensors and
#: its outputs' shapes, dtypes and strides are checked against PyTorch's Meta kernel (slow; see
#: ``torch_tpu.ops.meta_check``). The switch itself is ``runtime.flags.flags.check_meta``, which
#: starts from this and which tests may set at runtime.
check_meta: bool = _flag("TORCH_TPU_CHECK_META")
#: ``TORCH_TPU_STATIC_GENERATION=0``: Hugging Face ``generate()`` on tpu keeps Transformers'
#: default (dynamic) cache instead of a static, bucketed one with fused decoding (see
#: ``torch_tpu.integrations.generation``).
static_generation: bool = os.environ.get("TORCH_TPU_STATIC_GENERATION", "1").strip().lower() not in (
    "0",
    "false",
    "no",
    "off",
)
#: ``TORCH_TPU_QUICK_COMPILE=0``: on the XLA:CPU stand-in, compile strict eager's per-op programs
#: with LLVM's full optimization and XLA's fusion emitters too (by default they compile without
#: them: a small program in 20 ms instead of 55; a GPT step's strict steady state is unchanged,
#: but an elementwise op on a million elements runs several times slower; fused graphs and
#: compiled models are optimized either way). Read when the device starts.
quick_compile: bool = os.environ.get("TORCH_TPU_QUICK_COMPILE", "1").strip().lower() not in (
    "0",
    "false",
    "no",
    "off",
)
#: ``TORCH_TPU_BACKGROUND_COMPILE=1`` / ``0``: a fused graph met at new shapes runs op by op
#: while its program compiles on a worker thread (``torch_tpu.execution.background``); unset:
#: on where the device is a TPU, off on the stand-in.
background_compile: bool | None = (
    _flag("TORCH_TPU_BACKGROUND_COMPILE")
    if os.environ.get("TORCH_TPU_BACKGROUND_COMPILE", "").strip()
    else None
)
#: ``TORCH_TPU_DISTRIBUTED=0``: processes launched as ranks of a job (``RANK``/``WORLD_SIZE`` in
#: the environment) stay one-process JAX runtimes when they use tpu before any ``tpu_dist`` group.
distributed: bool = os.environ.get("TORCH_TPU_DISTRIBUTED", "1").strip().lower() not in (
    "0",
    "false",
    "no",
    "off",
)
#: ``TORCH_TPU_COORDINATOR_PORT``: the port of JAX's multi-process coordinator on ``MASTER_ADDR``
#: (default ``MASTER_PORT + 1``).
coordinator_port: int | None = (
    int(os.environ["TORCH_TPU_COORDINATOR_PORT"]) if os.environ.get("TORCH_TPU_COORDINATOR_PORT") else None
)


def _buckets(text: str) -> float | None:
    """``TORCH_TPU_BUCKETS``: ``0``/``off`` keeps every size its own program; ``1``/``on``/``pow2``
    pads dynamic dimensions to powers of two; a number above 1 is the ladder's growth factor."""
    text = text.strip().lower()
    if text in ("0", "off", "false", "no"):
        return None
    if text in ("1", "on", "true", "yes", "pow2", ""):
        return 2.0
    growth = float(text)
    if not growth > 1:
        raise ValueError(f"TORCH_TPU_BUCKETS must be 0, 1 or a growth factor above 1, got {text!r}")
    return growth


#: ``TORCH_TPU_BUCKETS``: how tensors whose sizes change are padded to size buckets (see
#: ``torch_tpu.runtime.padding`` and docs/execution.md): None turns bucketing off.
bucket_growth: float | None = _buckets(os.environ.get("TORCH_TPU_BUCKETS", "1"))
buckets: bool = bucket_growth is not None
