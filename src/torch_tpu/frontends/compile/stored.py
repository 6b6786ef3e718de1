"""Compiled graphs kept on disk (``TORCH_TPU_CACHE_DIR/graphs``), so a fresh process skips
tracing a graph through the lowerings, JAX's lowering and XLA's compilation.

JAX's persistent cache alone still needs the traced program: its key is a hash of the lowered
module, so every process traced each graph again (Python through every lowering) just to find
the executable. Here the key is computed before any tracing, from everything the program can
depend on:

- the graph: its code, the values of the tensors it holds (``get_attr``), which outputs it
  computes for the CPU;
- the call's layout (shapes, strides, offsets, dtypes, conjugate/negative bits, storage sharing,
  the storages' avals, constant arguments) and which inputs require grad;
- the float32 matmul precision, the donated inputs, ``TORCH_TPU_CHECK_META``;
- the versions of torch, JAX and jaxlib, the XLA device, and the torch_tpu sources themselves
  (any edit to a lowering gives new keys).

An entry holds what the trace found out (outputs, written inputs, random draws, where its value
checks come from) and the serialized executable. Entries are written and verified like the XLA
cache's (:class:`~torch_tpu.runtime.compilation_cache.VerifiedFileCache`: a corrupted or
swapped file is a miss). A key that cannot be made stable (a constant argument whose ``repr``
names a memory address) is never stored.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import pathlib
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jaxlib
import torch

from ... import config
from ...runtime import platform
from ...runtime.flags import flags

_log = logging.getLogger("torch_tpu")
#: A new entry layout gets a new version (old entries are then never found).
FORMAT = "torch_tpu compiled graph v3"


@functools.cache
def _sources() -> str:
    """A hash of torch_tpu's sources: a changed lowering must not reuse a stored program."""
    root = pathlib.Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for file in sorted(root.rglob("*.py")):
        digest.update(file.relative_to(root).as_posix().encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


@functools.cache
def _cache():
    if not config.cache_dir:
        return None
    from ...runtime.compilation_cache import VerifiedFileCache

    try:
        return VerifiedFileCache(str(pathlib.Path(config.cache_dir) / "graphs"))
    except OSError as error:  # an unwritable directory: no stored graphs, as with no cache
        _log.warning("compiled graphs are not stored: %s", error)
        return None


def _graph_text(graph_module: torch.fx.GraphModule) -> str:
    """The graph's code and the tensors it reads from its attributes (constants AOTAutograd
    left in the graph), values included."""
    parts = [graph_module.code]
    for node in graph_module.graph.find_nodes(op="get_attr"):
        value = graph_module
        for name in node.target.split("."):
            value = getattr(value, name)
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().contiguous()
            data = value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b""
            parts.append(
                f"{node.target}: {value.dtype}{list(value.shape)} {hashlib.sha256(data).hexdigest()}"
            )
        elif isinstance(value, torch.fx.GraphModule):  # a subgraph (``torch.cond``'s branches)
            parts.append(f"{node.target}: {{\n{_graph_text(value)}\n}}")
        elif isinstance(value, torch.nn.Module):  # its repr omits its state: this process only
            parts.append(f"{node.target}: {type(value).__qualname__} at {id(value)}")
        else:
            parts.append(f"{node.target}: {value!r}")
    return "\n".join(parts)


def environment() -> tuple:
    """What every compiled program depends on besides its graph and its call: torch_tpu's
    sources, the versions, the XLA device, the switches that change lowerings."""
    return (
        FORMAT,
        _sources(),
        torch.__version__,
        jax.__version__,
        jaxlib.__version__,
        str(platform.device().platform),
        getattr(platform.device(), "device_kind", ""),
        jax.config.jax_enable_x64,
        flags.check_meta,
    )


def key(
    graph_module: torch.fx.GraphModule, host_outputs: list, layout: tuple, args: tuple, matmul: Any
) -> str | None:
    """The key of this graph's program for this call (None: not storable, or no cache)."""
    if _cache() is None:
        return None
    text = repr(
        (
            *environment(),
            matmul,
            layout,
            tuple(a.requires_grad if isinstance(a, torch.Tensor) else None for a in args),
            tuple(host_outputs),
        )
    )
    if " at 0x" in text:  # an object without a stable repr among the constants
        return None
    return hashlib.sha256((text + _graph_text(graph_module)).encode()).hexdigest()


def _get(graph: str | None, part: str) -> Any:
    cache = _cache()
    if graph is None or cache is None:
        return None
    data = cache.get(hashlib.sha256(f"{graph} {part}".encode()).hexdigest())
    try:
        return None if data is None else pickle.loads(data)
    except Exception as error:  # noqa: BLE001  (an unreadable entry is a miss)
        _log.warning("stored compiled graph %s (%s) is unusable (%s): compiled again", graph, part, error)
        return None


def _put(graph: str | None, part: str, value: Callable[[], Any]) -> None:
    cache = _cache()
    if graph is None or cache is None:
        return
    try:
        cache.put(hashlib.sha256(f"{graph} {part}".encode()).hexdigest(), pickle.dumps(value()))
    except Exception as error:  # noqa: BLE001  (not storable: the next process compiles it)
        _log.debug("compiled graph %s (%s) not stored: %s", graph, part, error)


def load_findings(graph: str | None) -> Any:
    """What tracing ``graph`` found out (outputs, written inputs...), if stored."""
    return _get(graph, "findings")


def save_findings(graph: str | None, findings: Any) -> None:
    _put(graph, "findings", lambda: findings)


def _executable_part(donated: tuple[int, ...], options: dict | None) -> str:
    """The stored executable's name in its graph's entry: one per donation, and per set of the
    user's compiler options (``torch.tpu.compiler``)."""
    part = f"executable donating {donated}"
    return f"{part} compiled with {sorted(options.items())}" if options else part


def load_executable(
    graph: str | None, donated: tuple[int, ...], index: int, options: dict | None = None
) -> jax.stages.Compiled | None:
    """The executable stored for ``graph`` with inputs ``donated`` (and compiler ``options``), if
    any, loaded for ``tpu:index`` (the device it was compiled for: ``graph``'s key includes it)."""
    stored = _get(graph, _executable_part(donated, options))
    if stored is None:
        return None
    from jax.experimental.serialize_executable import deserialize_and_load

    from ...runtime import compilation_cache, executable_budget

    try:
        # (JAX's compile event, by which the process's memory mappings stay under the kernel's
        # limit, does not fire for this load: it is counted here)
        compilation_cache.note_executable(stored[0])
        run = deserialize_and_load(*stored, execution_devices=[platform.jax_device(index)])
    except Exception as error:  # noqa: BLE001  (e.g. another XLA build's executable)
        _log.warning("stored executable of compiled graph %s is unusable (%s): compiled again", graph, error)
        return None
    executable_budget.executable_loaded()
    platform.compile_events["executables_built"] += 1  # built from the cache, not by XLA
    platform.compile_events["disk_hits"] += 1
    return run


@contextlib.contextmanager
def compiling(graph: str | None) -> Iterator[Callable[[], bool]]:
    """Compile ``graph``'s executable with XLA even if JAX's persistent cache has it, so it can
    be stored (:func:`~torch_tpu.runtime.compilation_cache.reads_bypassed`). Yields whether
    XLA did compile it (a JAX cache of the user's own choosing still answers reads)."""
    if graph is None or _cache() is None:
        yield lambda: False
        return
    from ...runtime import compilation_cache

    hits = platform.compile_events["disk_hits"]
    with compilation_cache.reads_bypassed():
        yield lambda: platform.compile_events["disk_hits"] == hits


def save_executable(
    graph: str | None, donated: tuple[int, ...], run: jax.stages.Compiled, options: dict | None = None
) -> None:
    from jax.experimental.serialize_executable import serialize

    _put(graph, _executable_part(donated, options), lambda: serialize(run))
