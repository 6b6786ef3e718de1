"""The XLA platform behind the "tpu" device: started on first use, reported truthfully.

Nothing here runs at ``import torch``: JAX is imported and configured by :func:`initialize`,
which the first use of the device calls (the first tpu op, or a ``torch.tpu`` query that needs
the device). Two of its settings are process-wide, because JAX has no narrower scope for them:

- ``jax_enable_x64``: int64/float64 tensors keep their width, as in torch. JAX code elsewhere in
  the process then also defaults to 64-bit types where it would have used 32-bit ones.
- JAX's persistent compilation cache points to ``TORCH_TPU_CACHE_DIR``, unless the process had
  already chosen a cache directory of its own (which is then kept and used for tpu too).

A process that forks after the device started cannot use it in the child (XLA's runtime does
not survive ``fork()``); the child gets a clear error instead of a hang (:func:`check_not_forked`).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from .. import config
from . import devices, events, executable_budget
from .flags import flags

_PLATFORM_ALIASES = {"gpu": "cuda", "cuda": "cuda", "tpu": "tpu", "cpu": "cpu"}
_lock = threading.Lock()
#: ``tpu:0``'s JAX device, set last as the platform starts (each device's state: ``devices.local``)
_device: Any = None
# Two flags this module owns live in ``flags`` (runtime/flags.py), where the C++ core reads them:
# ``flags.others_used``: whether a device other than ``tpu:0`` was ever used (made current, or
# given a tensor); until then every value is on ``tpu:0`` and the per-op paths skip all device
# bookkeeping. ``flags.attention_needed``: whether the per-op path has something to do before
# its next op (:func:`attend`): refuse a forked child, or run a job that must wait for a safe
# point (:func:`request_attention`); one flag, so that the common case costs one test.
#: True in a child process forked after the device had started in its parent.
forked_child = False
_jobs: list[Callable[[], None]] = []
#: "executables_built" (every executable JAX builds: compiled by XLA or read from the persistent
#: cache) and "disk_hits" (read from the cache), counted from the device's start.
compile_events: collections.Counter = collections.Counter()
#: Called with JAX imported, before JAX starts its backend (the one moment at which JAX's
#: multi-process runtime can still be joined: ``torch_tpu.distributed`` adds its start here).
before_start: list = []


def _not_registered() -> None:
    raise RuntimeError("runtime.platform.start called before torch_tpu's __init__ registered it")


#: Starts the whole device: :func:`initialize`, then the layers above the runtime (the lowering
#: table, the execution hooks). ``torch_tpu._initialize``, set by the package's ``__init__``; the
#: device module and the execution layer call it through here.
start: Callable[[], None] = _not_registered

FORKED_MESSAGE = (
    "Cannot use the tpu device in a forked subprocess: the parent process had already started "
    "it, and XLA's runtime does not survive fork(). Start worker processes with the 'spawn' "
    "method instead (DataLoader(..., multiprocessing_context='spawn'), "
    "torch.multiprocessing.set_start_method('spawn')), or keep the workers on the CPU and move "
    "each batch to tpu in the main process."
)


def check_not_forked() -> None:
    if forked_child:
        raise RuntimeError(FORKED_MESSAGE)


def request_attention(job: Callable[[], None]) -> None:
    """Run ``job`` before the next op (:func:`attend`): for work that cannot run where it is
    found to be due, such as clearing JAX's caches from inside a JAX compilation."""
    if job not in _jobs:
        _jobs.append(job)
    flags.attention_needed = True


def attend() -> None:
    """What the per-op path does when ``flags.attention_needed``: refuse a forked child, then run
    the jobs asked for."""
    check_not_forked()
    flags.attention_needed = False
    while _jobs:
        _jobs.pop(0)()


def _mark_forked_child() -> None:
    global forked_child
    forked_child = _device is not None
    flags.attention_needed = flags.attention_needed or forked_child


def configure() -> None:
    """Configure JAX (64-bit types, the platform) without starting its backend: what modules that
    build JAX values need at import. The device, and JAX's backend, start at the first use
    (:func:`initialize`), so importing torch_tpu's modules (``torch.compile(backend="tpu")``
    declared at a library's import) leaves a process free to join JAX's multi-process runtime
    first (``before_start``)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    if config.platform:
        if config.platform not in _PLATFORM_ALIASES:
            raise ValueError(f"TORCH_TPU_PLATFORM must be one of cpu, gpu, tpu; got {config.platform!r}")
        jax.config.update("jax_platforms", _PLATFORM_ALIASES[config.platform])


def initialize() -> None:
    """Import and configure JAX and pick the device (once; later calls return at once)."""
    global _device
    if _device is not None:
        return
    check_not_forked()
    with _lock:
        if _device is not None:
            return
        import jax

        configure()
        for hook in before_start:
            hook()
        if config.cache_dir and not jax.config.jax_compilation_cache_dir:
            # Every compiled executable (strict eager's per-op ones, fused graphs, compiled
            # models) persists, so a second process skips XLA compilation for what it has seen.
            from . import compilation_cache

            compilation_cache.enable(
                config.cache_dir, config.cache_min_compile_seconds, config.cache_wait_seconds
            )
        keep_interrupts()
        jax.monitoring.register_event_listener(_count_disk_hit)
        jax.monitoring.register_event_duration_secs_listener(_count_executable)
        from . import native

        # several devices need the C++ core (a tensor's device index is set there)
        with _quick_compiles():  # (JAX's backend starts here)
            jax_devices = jax.local_devices() if native.available() else jax.local_devices()[:1]
        devices.local.start(jax_devices)
        if native.available():
            native._C.set_device_count(len(jax_devices))
        _device = jax_devices[0]
    os.register_at_fork(after_in_child=_mark_forked_child)


#: XLA:CPU's flags for programs compiled quickly: LLVM without its optimization passes, and
#: the elemental emitters in place of the MLIR fusion emitters (a small program compiles in
#: 20 ms instead of 55 on a 2-core box)
_QUICK_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
)
#: whether this process compiles quickly by default (set as the device starts)
quick_compiles = False


@contextlib.contextmanager
def _quick_compiles():
    """On the XLA:CPU stand-in, per-op programs compile without LLVM's optimization
    (``config.quick_compile``): strict eager's programs are many and small, and a compile is most
    of a new shape's cost (half the time); fused graphs and compiled models ask for full
    optimization (``compiler.optimized``). Set through ``XLA_FLAGS`` while JAX's backend starts in
    this block (not left for child processes, which decide for themselves)."""
    global quick_compiles
    before = os.environ.get("XLA_FLAGS")
    if (
        not config.quick_compile
        or "xla_backend_optimization_level" in (before or "")
        or not stand_in_is_cpu()
    ):
        yield  # (off, or the user's own level)
        return
    os.environ["XLA_FLAGS"] = " ".join(filter(None, (before, *_QUICK_FLAGS)))
    try:
        yield
        quick_compiles = True
    finally:
        if before is None:
            del os.environ["XLA_FLAGS"]
        else:
            os.environ["XLA_FLAGS"] = before


def _count_disk_hit(event: str, **_: object) -> None:
    if event == events.JAX_DISK_HIT:
        compile_events["disk_hits"] += 1


def _count_executable(event: str, duration: float, **_: object) -> None:
    if event == events.JAX_COMPILED:
        compile_events["executables_built"] += 1
        if executable_budget.executable_loaded():
            request_trim()


def request_trim() -> None:
    """Clear the in-memory compilation caches before the next op (past the mapping budget:
    :mod:`.executable_budget`), counting it in ``compile_events["cache_trims"]``."""
    request_attention(_trim)


def _trim() -> None:
    if executable_budget.trim():
        compile_events["cache_trims"] += 1


executable_budget.request_trim = request_trim  # (the persistent cache asks through it)


def keep_interrupts() -> None:
    """Make Ctrl-C survive garbage collection. JAX frees buffers from a ``gc`` callback, and
    CPython prints and drops any exception raised during a collection (in its callbacks, and in
    the finalizers and weakref callbacks it runs): a Ctrl-C whose handler runs there is lost.
    This SIGINT handler (installed in place of Python's default one, from the main thread)
    delivers such an interrupt again once the collection is over."""
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, _interrupt)


def _inside_gc_callback(frame) -> bool:
    callbacks = {getattr(c, "__code__", None) for c in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks:
            return True
        frame = frame.f_back
    return False


def _interrupt(signum, frame) -> None:
    if not _inside_gc_callback(frame):
        raise KeyboardInterrupt
    if _interrupt_after_collection not in gc.callbacks:
        gc.callbacks.append(_interrupt_after_collection)  # (last: after every other callback)


def _interrupt_after_collection(phase: str, info: dict) -> None:
    if phase != "stop":
        return
    gc.callbacks.remove(_interrupt_after_collection)
    previous = sys.getprofile()

    def raise_at_first_event_outside(frame, event, arg) -> None:
        if frame.f_code is _interrupt_after_collection.__code__ or _inside_gc_callback(frame):
            return
        sys.setprofile(previous)
        raise KeyboardInterrupt

    sys.setprofile(raise_at_first_event_outside)


def device_count() -> int:
    """Devices this process drives: JAX's local devices (``tpu:0`` .. ``tpu:n-1``). Counting
    them starts the platform (imports JAX; no device work)."""
    initialize()
    return len(devices.local)


def known_device_count() -> int:
    """The count without starting anything: the local devices once started, else 1 (there is
    always one: JAX falls back to the CPU). The C++ runtime core starts with this one at import
    and gets the true count when the device starts, which any use of a tpu device does, as do
    ``torch.tpu.device_count()`` and ``torch.accelerator.device_count()`` (PyTorch initializes
    the backend before counting); ``torch.accelerator.is_available()`` starts nothing."""
    return len(devices.local)


def check_index(index: int) -> int:
    """The index of the device this process drives that ``tpu:index`` names: ``index`` itself,
    or ``0`` for :func:`host_index`; else CUDA's error for the same request ("invalid device
    ordinal", in the C++ device guard's words), never a silent ``tpu:0``."""
    count = known_device_count()
    if not 0 <= index < count:
        count = device_count()
    if not 0 <= index < count:
        if count == 1 and index == host_index():
            return 0
        drives = "1 device, tpu:0" if count == 1 else f"{count} devices, tpu:0 to tpu:{count - 1}"
        raise RuntimeError(
            f"tpu error: invalid device ordinal: tpu:{index} (this process drives {drives}; "
            "launch one process per device)"
        )
    return index


def host_index() -> int | None:
    """The host-wide number of this process's device under a launcher of one process per device
    (``LOCAL_RANK``, set by ``torchrun``): CUDA code names its device ``cuda:LOCAL_RANK``, and
    PyTorch's ``DeviceMesh`` makes ``LOCAL_RANK`` current, where JAX gives each such process its
    own device as local device 0. A process that drives one device therefore also answers to
    ``tpu:LOCAL_RANK``, which :func:`check_index` resolves to ``tpu:0`` (tensors report
    ``tpu:0``)."""
    local_rank = os.environ.get("LOCAL_RANK", "")
    return int(local_rank) if local_rank.isdigit() else None


def is_initialized() -> bool:
    return _device is not None


def device():
    """The JAX device that backs ``tpu:0`` (TPU if present, else GPU, else CPU)."""
    if _device is None:
        initialize()
    return _device


def jax_device(index: int):
    """The JAX device that backs ``tpu:index`` (checked)."""
    if index == 0:
        return device()
    return devices.local.state(check_index(index)).jax_device


def index_of(jax_device) -> int:
    """The tpu index of a local JAX device."""
    return devices.local.index_of(jax_device)


@contextlib.contextmanager
def placing(index: int):
    """Values made from no input array (a factory's) go to ``tpu:index``: JAX's default device
    and the index that ``runtime.context`` gives them, for this block."""
    import jax

    from .context import context

    previous = context.index
    context.index = index
    try:
        with jax.default_device(devices.local.state(index).jax_device):
            yield
    finally:
        context.index = previous


def mixed_devices(first, second) -> RuntimeError:
    """PyTorch's error (CPU's and CUDA's words) for an op given tensors on two devices."""
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{first} and {second}!"
    )


def use(index: int) -> None:
    """Note that ``tpu:index`` is in use (from then on ops look at their devices)."""
    if index and not flags.others_used:
        check_index(index)
        flags.others_used = True


def platform() -> str:
    return device().platform


def known_device_name() -> str | None:
    """:func:`device_name` where it is known without starting the device: a TPU chip's generation
    on the PCI bus (``"TPU v6e"``), the XLA:CPU stand-in; None otherwise (a GPU)."""
    if is_initialized():
        return device_name()
    from . import hardware

    chips = hardware.tpu_chips()
    if chips:
        return chips[0]
    return "XLA:CPU (stand-in)" if stand_in_is_cpu() else None


def stand_in_is_cpu() -> bool:
    """Whether the device will be XLA:CPU, known without starting it: asked for
    (``TORCH_TPU_PLATFORM``, ``JAX_PLATFORMS``), or no accelerator for JAX to pick (no TPU chip,
    no NVIDIA device)."""
    if is_initialized():
        return platform() == "cpu"
    asked = _PLATFORM_ALIASES.get(config.platform or "") or os.environ.get("JAX_PLATFORMS", "")
    if asked:
        return asked.split(",")[0] == "cpu"
    from . import hardware

    return not hardware.tpu_chips() and not os.path.exists("/dev/nvidiactl")


def device_name() -> str:
    d = device()
    if d.platform == "tpu":
        return getattr(d, "device_kind", "TPU")
    return f"XLA:{d.platform.upper()} (stand-in)"
