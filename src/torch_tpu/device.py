"""The ``torch.tpu`` device module (mirrors ``torch.cuda`` where the device model allows).

A process drives every local device (``tpu:0`` .. ``tpu:n-1``, JAX's local devices; one per
process under ``torchrun``). Streams and events exist for API compatibility: XLA orders each
device's work on a single stream, so every stream is that stream and events time by
synchronizing.

Example::

    >>> import torch, torch_tpu
    >>> torch.tpu.is_available(), torch.tpu.device_count()
    (True, 1)
    >>> torch.tpu.manual_seed(0); x = torch.randn(2, device="tpu"); torch.tpu.synchronize()
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import torch

from .runtime import callbacks, native, platform, random
from .runtime import memory as device_memory

__all__ = [
    "is_available",
    "is_initialized",
    "device_count",
    "current_device",
    "set_device",
    "device",
    "synchronize",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "initial_seed",
    "get_rng_state",
    "set_rng_state",
    "get_rng_state_all",
    "set_rng_state_all",
    "get_device_name",
    "get_device_properties",
    "get_device_capability",
    "mem_get_info",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_stats",
    "reset_peak_memory_stats",
    "memory_summary",
    "empty_cache",
    "get_amp_supported_dtype",
    "is_bf16_supported",
    "Stream",
    "Event",
    "current_stream",
    "default_stream",
    "set_stream",
    "stream",
    "compilation_cache_stats",
    "reset_compilation_cache_stats",
]

#: Graph capture and replay (``torch.cuda.CUDAGraph``'s interface): execution/capture.py
#: (attributes of the module, not in ``__all__``: they exist once the execution layer is imported)
_CAPTURE_NAMES = ("TPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing")

_DeviceLike = int | str | torch.device | None


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    """Whether the device has started (it starts on first use, not at import)."""
    return platform.is_initialized()


def init() -> None:
    """Start the device now rather than at its first use."""
    platform.start()


def _lazy_init() -> None:
    """PyTorch's hook before device use: start the device if it has not started."""
    init()


def _is_in_bad_fork() -> bool:
    """True in a process forked after the device started in its parent (tpu unusable here)."""
    return platform.forked_child


def device_count() -> int:
    """Devices this process drives: JAX's local devices (starts the platform to count them)."""
    return platform.device_count()


def current_device() -> int:
    """The calling thread's current tpu device (the C++ device guard's; 0 without it)."""
    return torch.accelerator.current_device_index() if native.available() else 0


def _get_device_index(device: _DeviceLike) -> int:
    """The index ``device`` names (None: the current device), refused unless this process
    drives it, in the words of the C++ device guard (and of CUDA: "invalid device ordinal")."""
    if device is None:
        return current_device()
    if not isinstance(device, int):
        device = torch.device(device)
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {device}")
        device = current_device() if device.index is None else device.index
    return platform.check_index(device)


def set_device(device: _DeviceLike) -> None:
    """Make ``device`` the calling thread's current tpu device (as ``torch.cuda.set_device``)."""
    index = _get_device_index(device)
    if native.available():
        torch.accelerator.set_device_index(index)  # (the C++ guard tells platform.use)


class device(contextlib.ContextDecorator):
    """Context manager making a tpu device current, and the previous one again on exit."""

    def __init__(self, device: _DeviceLike):
        self.index = _get_device_index(device)
        self.previous: list[int] = []

    def __enter__(self):
        self.previous.append(current_device())
        set_device(self.index)
        return self

    def __exit__(self, *exc):
        set_device(self.previous.pop())
        return False


def synchronize(device: _DeviceLike = None) -> None:
    """Wait until all queued work whose results are still held has finished (in fused eager,
    pending recorded ops run first)."""
    _get_device_index(device)
    platform.check_not_forked()
    if not platform.is_initialized():
        return  # nothing ever ran
    import jax

    from .execution import fused
    from .runtime import checks

    fused.sync("synchronize()")
    if checks.before_wait:
        checks.before_host_wait()
    jax.effects_barrier()
    for array in jax.live_arrays():
        array.block_until_ready()


def compilation_cache_stats() -> dict:
    """Compilation cache counters. For fused-eager graphs: ``requests``, ``hits``, ``misses``,
    ``compile_seconds`` (spent on misses), ``flush_seconds`` (spent running graphs: their
    fingerprint, cache lookup and dispatch; compiling excluded), ``graphs_run``, ``ops_run``,
    ``ops_run_alone`` (ops whose shapes change in every graph, run on their own), ``cached_graphs``,
    ``sync_reasons`` (why graphs ran), ``donated_buffers`` (inputs XLA could update in place).
    ``disk_hits``: executables of any mode that XLA did not have to compile because the
    persistent cache (``TORCH_TPU_CACHE_DIR``) had them."""
    from .execution import fused

    return fused.stats.as_dict()


def reset_compilation_cache_stats() -> None:
    """Zero the counters of :func:`compilation_cache_stats` (compiled graphs stay cached)."""
    from .execution import fused

    fused.stats.reset()


# ----------------------------------------------------------------------------- RNG
def manual_seed(seed: int) -> None:
    """Seed the current device's default generator (``manual_seed_all``: every device's)."""
    random.manual_seed(int(seed), current_device())


def manual_seed_all(seed: int) -> None:
    random.manual_seed_all(int(seed))


def seed() -> None:
    random.default_generator(current_device()).seed()


def seed_all() -> None:
    for index in range(platform.known_device_count()):
        random.default_generator(index).seed()


def initial_seed() -> int:
    return random.default_generator(current_device()).initial_seed()


def get_rng_state(device: _DeviceLike = "tpu") -> torch.Tensor:
    return random.default_generator(_get_device_index(device)).get_state()


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "tpu") -> None:
    random.default_generator(_get_device_index(device)).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# ----------------------------------------------------------------------------- properties
def get_device_name(device: _DeviceLike = None) -> str:
    """The hardware actually in use, e.g. ``"TPU v5 lite"`` or ``"XLA:CPU (stand-in)"``."""
    _get_device_index(device)
    return platform.device_name()


@dataclasses.dataclass(frozen=True)
class _DeviceProperties:
    name: str
    total_memory: int
    multi_processor_count: int = 1
    type: str = "tpu"
    platform: str = ""


def get_device_properties(device: _DeviceLike = None) -> _DeviceProperties:
    _get_device_index(device)
    return _DeviceProperties(get_device_name(), device_memory.total_memory(), platform=platform.platform())


def get_device_capability(device: _DeviceLike = None) -> tuple[int, int]:
    _get_device_index(device)
    return (0, 0)


# ----------------------------------------------------------------------------- memory
# The numbers are runtime.memory's, which the C++ allocator also reports to torch.accelerator.
# (``torch.tpu.memory``, torch_tpu/memory.py, adds the memory history.)
def memory_allocated(device: _DeviceLike = None) -> int:
    """Bytes held by live device buffers (on stand-in platforms: summed over live arrays)."""
    return device_memory.allocated(_get_device_index(device))


def max_memory_allocated(device: _DeviceLike = None) -> int:
    """Peak of :func:`memory_allocated` (device-tracked on TPU/GPU; sampled at queries on CPU)."""
    return device_memory.max_allocated(_get_device_index(device))


def memory_reserved(device: _DeviceLike = None) -> int:
    return device_memory.reserved(_get_device_index(device))


def max_memory_reserved(device: _DeviceLike = None) -> int:
    return device_memory.max_reserved(_get_device_index(device))


def memory_stats(device: _DeviceLike = None) -> dict[str, Any]:
    index = _get_device_index(device)
    peak = device_memory.max_allocated(index)
    return {
        "allocated_bytes.all.current": device_memory.allocated(index),
        "allocated_bytes.all.peak": peak,
        # (CUDA's "active" bytes also count freed blocks a stream still uses; XLA frees a buffer
        # once its last use ran, so every allocated byte is active)
        "active_bytes.all.peak": peak,
        "reserved_bytes.all.current": device_memory.reserved(index),
        "reserved_bytes.all.peak": device_memory.max_reserved(index),
        "num_live_buffers": device_memory.live_buffers(index),
        **{f"xla.{k}": v for k, v in device_memory.device_stats(index).items()},
    }


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    device_memory.reset_peak(_get_device_index(device))


def mem_get_info(device: _DeviceLike = None) -> tuple[int, int]:
    total = get_device_properties(device).total_memory
    return total - device_memory.allocated(_get_device_index(device)), total


def memory_summary(device: _DeviceLike = None, abbreviated: bool = False) -> str:
    """A table of the device's memory (``torch.cuda.memory_summary``'s): allocated, active,
    requested and reserved bytes and the allocation counts, now, at their peak, and in total."""
    return device_memory.summary(_get_device_index(device), abbreviated)


def empty_cache() -> None:
    """Frees compiled-op caches' unreachable buffers; live tensors are untouched."""
    import gc

    gc.collect()


# ----------------------------------------------------------------------------- AMP
def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def _is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("tpu")


def _get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("tpu")


# ----------------------------------------------------------------------------- streams/events
class Stream:
    """The device's single in-order stream (XLA serializes work; all streams are this one)."""

    def __init__(self, device: _DeviceLike = None, priority: int = 0):
        self.device = torch.device("tpu", _get_device_index(device))
        self.priority = priority

    def synchronize(self) -> None:
        synchronize()

    def query(self) -> bool:
        synchronize()
        return True

    def wait_stream(self, stream: Stream) -> None:
        """Same stream: already ordered."""

    def wait_event(self, event: Event) -> None:
        """Same stream: already ordered."""

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return hash("tpu-stream")


class Event:
    """Marks a point in the stream; ``elapsed_time`` synchronizes to measure wall time."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        synchronize()
        self._time = time.perf_counter()

    def synchronize(self) -> None:
        synchronize()

    def wait(self, stream: Stream | None = None) -> None:
        """Same stream: already ordered."""

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: Event) -> float:
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0


def current_stream(device: _DeviceLike = None) -> Stream:
    return Stream(device)


def default_stream(device: _DeviceLike = None) -> Stream:
    return Stream(device)


def set_stream(stream: Stream) -> None:
    """Only the one stream exists; nothing to switch."""


@contextlib.contextmanager
def stream(stream: Stream | None):
    yield stream


@contextlib.contextmanager
def precision(value: str):
    """``torch.set_float32_matmul_precision(value)`` for a block (``"highest"``, ``"high"``,
    ``"medium"``); the setting before it comes back at its end.

    >>> import torch, torch_tpu
    >>> with torch.tpu.precision("high"):
    ...     torch.get_float32_matmul_precision()
    'high'
    """
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def __getattr__(name: str) -> Any:
    if name == "default_generators":  # made at first use (see runtime.random)
        return tuple(random.default_generator(i) for i in range(device_count()))
    if name == "ops":  # (XLA's own ops: defining them starts the device, so at first use)
        from .kernels import xla

        return xla
    if name in _CAPTURE_NAMES:  # (the execution layer, imported at first use)
        from .execution import capture

        return getattr(capture, name)
    raise AttributeError(f"module 'torch.tpu' has no attribute {name!r}")


callbacks.register_device(synchronize, empty_cache, mem_get_info)  # (the C++ core calls them)
