"""Fused eager: ops recorded into a graph, compiled once per fingerprint, run as one computation.

In fused mode a jitted op does not run when called: :func:`call` records it as a node of the
current graph and returns :class:`Deferred` values (shape and dtype known, worked out once per
op and input signature). Storages hold those like any value. The graph runs when something needs
a concrete value (a host read, an op whose output shape depends on data, ``sync()``, the end of
``backward()`` or of ``optimizer.step()``, a mode switch) or when it reaches ``max_nodes``:
:func:`flush` traces the recorded nodes into one ``jax.jit``, keyed by the graph's fingerprint
(the op sequence with static arguments, how nodes connect, and the inputs' shapes and dtypes),
so a steady-state training step compiles nothing and XLA fuses across ops.

The graph keeps no reference to the values it produces, only to its inputs: a deferred value
that nothing references any more when the graph runs is not an output, and XLA is free to fuse
it away. Code that touches a deferred value directly (``value.astype``, ``float(value)``, a
jitted helper outside the table) gets the concrete array, which runs the graph first: correct
everywhere, and fast where the hot paths route through :func:`call`.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Optional

import jax
import numpy as np

#: Graphs are cut at this many recorded ops even without a sync point, so a loop with no host
#: reads stays bounded.
max_nodes = 5000

_lock = threading.RLock()


class Deferred:
    """One output of a recorded op: shape and dtype known, ``value`` filled when its graph runs."""

    __slots__ = ("shape", "dtype", "size", "weak_type", "graph", "node", "index", "value",
                 "__weakref__")

    def __init__(self, aval, graph, node: int, index: int):
        self.shape, self.dtype, self.size = aval.shape, aval.dtype, math.prod(aval.shape)
        self.weak_type = aval.weak_type
        self.graph, self.node, self.index = graph, node, index
        self.value: Optional[jax.Array] = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def concrete(self) -> jax.Array:
        if self.value is None:
            flush("a deferred value was used directly")
            if self.value is None:  # recorded in a graph that was dropped (an error mid-run)
                raise RuntimeError("tpu: a deferred value was lost when its graph failed")
        return self.value

    def __jax_array__(self) -> jax.Array:
        return self.concrete()

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.concrete(), dtype=dtype)

    def __getattr__(self, name: str) -> Any:  # .astype, .reshape, .T ...: the concrete array's
        return getattr(self.concrete(), name)

    def __repr__(self) -> str:
        state = "ready" if self.value is not None else "pending"
        return f"Deferred({self.shape}, {self.dtype}, {state})"


def _delegate(name: str) -> Callable:
    def method(self, *args):
        return getattr(self.concrete(), name)(*args)
    method.__name__ = name
    return method


for _name in ("__float__", "__int__", "__complex__", "__bool__", "__index__", "__len__",
              "__getitem__", "__iter__", "__neg__", "__pos__", "__abs__", "__invert__",
              "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__",
              "__rmod__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__", "__and__",
              "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__lt__", "__le__",
              "__gt__", "__ge__", "__eq__", "__ne__"):
    setattr(Deferred, _name, _delegate(_name))
Deferred.__hash__ = object.__hash__


def is_pending(x: Any) -> bool:
    """Whether ``x`` (a value or a list of them) holds a deferred value not computed yet."""
    if type(x) is Deferred:
        return x.value is None
    return isinstance(x, (list, tuple)) and any(type(v) is Deferred and v.value is None for v in x)


def resolved(x: Any) -> Any:
    """``x`` with any deferred value replaced by its concrete array (runs the graph if needed)."""
    if type(x) is Deferred:
        return x.concrete()
    if isinstance(x, (list, tuple)) and any(type(v) is Deferred for v in x):
        return type(x)(v.concrete() if type(v) is Deferred else v for v in x)
    return x


# ----------------------------------------------------------------------------- mode
_fused = False


def active() -> bool:
    return _fused


def set_active(enabled: bool) -> None:
    """Switch fused recording on or off; a switch runs whatever is pending first."""
    global _fused
    with _lock:
        sync()
        _fused = enabled


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Run ops directly, not recorded, without a sync point (a compiled program's trace)."""
    global _fused
    with _lock:
        outer, _fused = _fused, False
        try:
            yield
        finally:
            _fused = outer


# ----------------------------------------------------------------------------- statistics
class CacheStats:
    """Graph compilation cache counters (``torch.tpu.compilation_cache_stats()``)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests = self.hits = self.misses = 0
        self.compile_seconds = 0.0
        self.graphs_run = self.ops_run = 0
        self.disk_hits = self.donated_buffers = 0
        self.executables_built = 0
        self.compiled_graphs = self.compiled_runs = 0
        self.sync_reasons: collections.Counter = collections.Counter()

    def as_dict(self) -> dict:
        return {"requests": self.requests, "hits": self.hits, "misses": self.misses,
                "compile_seconds": self.compile_seconds, "graphs_run": self.graphs_run,
                "ops_run": self.ops_run, "cached_graphs": len(_executables),
                "disk_hits": self.disk_hits, "donated_buffers": self.donated_buffers,
                "xla_compiles": self.executables_built - self.disk_hits,
                "compiled_graphs": self.compiled_graphs,
                "compiled_runs": self.compiled_runs, "sync_reasons": dict(self.sync_reasons)}


stats = CacheStats()


def _count_disk_hit(event: str, **_: object) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        stats.disk_hits += 1


def _count_xla_compile(event: str, duration: float, **_: object) -> None:
    # every executable JAX builds, whether XLA compiles it or the persistent cache has it
    # (``as_dict`` subtracts the disk hits)
    if event == "/jax/core/compile/backend_compile_duration":
        stats.executables_built += 1


jax.monitoring.register_event_listener(_count_disk_hit)
jax.monitoring.register_event_duration_secs_listener(_count_xla_compile)
#: fingerprint -> compiled graph
_executables: dict[tuple, Callable] = {}
#: why the last graph ran (for explanations and tests)
last_flush_reason: Optional[str] = None
log_recompiles = os.environ.get("TORCH_TPU_LOG_RECOMPILES", "0").lower() in ("1", "true", "on")
_log = logging.getLogger("torch_tpu")


def explain(message: str) -> None:
    """Say why something compiles: on the ``torch_tpu`` logger (INFO), and on stderr under
    ``TORCH_TPU_LOG_RECOMPILES=1``."""
    _log.info(message)
    if log_recompiles:
        print(f"[torch_tpu] {message}", file=sys.stderr)


# ----------------------------------------------------------------------------- recording
_LEAF, _NODE, _STATIC, _SEQ = range(4)


class _Graph:
    __slots__ = ("nodes", "leaves", "leaf_ids", "outputs", "sources", "checks")

    def __init__(self) -> None:
        # (fn, arg specs, kwarg specs): the program, with no arrays in it (inputs are leaf
        # indices), so it doubles as the node's part of the fingerprint
        self.nodes: list[tuple] = []
        self.leaves: list[jax.Array] = []  # concrete inputs, in first-use order
        self.leaf_ids: dict[int, int] = {}
        self.outputs: list[weakref.ref] = []
        self.sources: list[str] = []      # user source line per node (only when logging)
        # (values, callback, origin): host-side checks of recorded values, run after the graph
        self.checks: list[tuple] = []


_graph = _Graph()
#: (fn, input signature) -> (output treedef, output avals)
_shapes: dict[tuple, tuple] = {}


def _spec(x: Any, graph: _Graph, signature: list) -> tuple:
    """How a node argument enters the graph; appends its abstract signature to ``signature``."""
    kind = type(x)
    if kind is Deferred:
        if x.value is None and x.graph is graph:
            signature.append((x.shape, x.dtype, x.weak_type))
            return (_NODE, x.node, x.index)
        x = x.concrete()
        kind = type(x)
    if isinstance(x, jax.Array):
        index = graph.leaf_ids.get(id(x))
        if index is None:
            index = graph.leaf_ids[id(x)] = len(graph.leaves)
            graph.leaves.append(x)
        signature.append((x.shape, x.dtype, getattr(x, "weak_type", False)))
        return (_LEAF, index)
    if kind in (list, tuple) and any(type(v) is Deferred or isinstance(v, jax.Array) for v in x):
        return (_SEQ, kind, tuple(_spec(v, graph, signature) for v in x))
    key = _typed(x)
    signature.append(key)
    return (_STATIC, x, key)


def _typed(x: Any) -> Any:
    """A static argument as a cache key: 1, 1.0 and True (equal in Python, different programs)
    kept apart, and NaN equal to itself."""
    kind = type(x)
    if kind is float:
        return (kind, repr(x))
    if kind in (tuple, list):
        return (kind, tuple(_typed(v) for v in x))
    return (kind, x)


def _abstract(spec: tuple, signature_iter) -> Any:
    kind = spec[0]
    if kind is _STATIC:
        next(signature_iter)
        return spec[1]
    if kind is _SEQ:
        return spec[1](_abstract(s, signature_iter) for s in spec[2])
    shape, dtype, weak = next(signature_iter)
    return jax.ShapeDtypeStruct(shape, dtype, weak_type=weak)


_LIBRARY_DIRS = tuple(os.path.dirname(m.__file__) for m in (sys.modules[__package__], jax))


def _user_line() -> str:
    """The innermost caller outside torch_tpu, torch and jax: the line to blame for an op."""
    import torch
    skip = _LIBRARY_DIRS + (os.path.dirname(torch.__file__),)
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(skip) and not name.startswith("<frozen"):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def call(fn: Callable, args: tuple, kwargs: Optional[dict] = None, name: str = "") -> Any:
    """Record ``fn(*args, **kwargs)`` (a jitted, pure function) in the current graph; returns its
    outputs as deferred values in the structure ``fn`` returns."""
    kwargs = kwargs or {}
    with _lock:
        if len(_graph.nodes) >= max_nodes:
            flush("the graph reached max_nodes")
        graph = _graph
        signature: list = []
        arg_specs = tuple(_spec(a, graph, signature) for a in args)
        kw_specs = tuple((k, _spec(v, graph, signature)) for k, v in kwargs.items())
        signature_key = (fn, tuple(signature))
        try:
            shapes = _shapes.get(signature_key)
        except TypeError:  # an unhashable static argument: run this op eagerly
            return fn(*(resolved(a) for a in args), **{k: resolved(v) for k, v in kwargs.items()})
        if shapes is None:
            walk = iter(signature)
            abstract_args = [_abstract(s, walk) for s in arg_specs]
            abstract_kwargs = {k: _abstract(s, walk) for k, s in kw_specs}
            out = jax.eval_shape(fn, *abstract_args, **abstract_kwargs)
            leaves, treedef = jax.tree_util.tree_flatten(out)
            shapes = _shapes[signature_key] = (treedef, leaves)
        treedef, avals = shapes
        node = len(graph.nodes)
        graph.nodes.append((fn, arg_specs, kw_specs))
        if log_recompiles:
            graph.sources.append(f"{name or getattr(fn, '__name__', fn)} at {_user_line()}")
        outs = [Deferred(aval, graph, node, i) for i, aval in enumerate(avals)]
        graph.outputs.extend(weakref.ref(d) for d in outs)
        return jax.tree_util.tree_unflatten(treedef, outs)


# ----------------------------------------------------------------------------- execution
def _resolve(spec: tuple, env: list, leaves: tuple) -> Any:
    kind = spec[0]
    if kind is _NODE:
        return env[spec[1]][spec[2]]
    if kind is _LEAF:
        return leaves[spec[1]]
    if kind is _SEQ:
        return spec[1](_resolve(s, env, leaves) for s in spec[2])
    return spec[1]


def _program(nodes: list, outputs: tuple) -> Callable:
    """The graph as one function of its leaves (traced once per fingerprint by ``jax.jit``)."""
    def run(*leaves):
        env: list = []
        for fn, arg_specs, kw_specs in nodes:
            out = fn(*(_resolve(s, env, leaves) for s in arg_specs),
                     **{k: _resolve(s, env, leaves) for k, s in kw_specs})
            env.append(jax.tree_util.tree_leaves(out))
        return [env[n][i] for n, i in outputs]
    return run


_previous_by_start: dict = {}


def _explain_miss(fingerprint: tuple, graph: _Graph) -> None:
    """Say which recorded op made this graph differ from the last one that started the same
    way (``TORCH_TPU_LOG_RECOMPILES=1``)."""
    keys = fingerprint[0]
    start = keys[0] if keys else None
    previous = _previous_by_start.get(start)
    _previous_by_start[start] = (fingerprint, list(graph.sources))
    if previous is None:
        explain(f"compiling a new graph of {len(keys)} ops (first graph starting with "
                f"{graph.sources[0] if graph.sources else '?'})")
        return
    (old_keys, old_outputs, old_avals, _), old_sources = previous
    for i, (new, old) in enumerate(zip(keys, old_keys)):
        if new != old:
            explain(f"recompiling: op {i} differs from the previous graph: now "
                    f"{graph.sources[i]}, before {old_sources[i]}")
            return
    if len(keys) != len(old_keys):
        explain(f"recompiling: {len(keys)} ops instead of {len(old_keys)} "
                f"(ends at {graph.sources[-1]})")
    elif fingerprint[2] != old_avals:
        changed = next(i for i, (a, b) in enumerate(zip(fingerprint[2], old_avals)) if a != b)
        user = next((graph.sources[n] for n, (_, args, kwargs) in enumerate(graph.nodes)
                     if _uses_leaf((*args, *(s for _, s in kwargs)), changed)), "?")
        (old_shape, old_dtype, _), (shape, dtype, _) = old_avals[changed], fingerprint[2][changed]
        explain(f"recompiling: an input changed shape or dtype, {old_dtype}"
                f"{list(old_shape)} -> {dtype}{list(shape)}, first used by {user}")
    else:
        explain("recompiling: other values of the graph are used afterwards, or other inputs "
                "can be donated")


#: Give XLA the buffers of inputs that die inside a graph (see :func:`_dead_leaves`).
donate = True


def _dead_leaves(leaves: list) -> tuple[int, ...]:
    """Positions of the inputs nothing but the graph still references: a storage the graph
    overwrote (an updated parameter, optimizer state), a temporary. Their buffers can be donated,
    so XLA updates them in place instead of holding old and new values at once. A reference from
    anywhere else (a storage, a view's value, the user's ``to_jax`` result, a cache) keeps an
    input from being donated. Counted here: the list's reference and getrefcount's argument."""
    return tuple(i for i in range(len(leaves)) if sys.getrefcount(leaves[i]) == 2)


def _donatable(leaves: list, live: list) -> tuple[int, ...]:
    """The dead inputs (:func:`_dead_leaves`) that an output of the same shape and dtype can
    reuse, one input per output: XLA ignores any other donation, with a warning."""
    free = collections.Counter((d.shape, d.dtype) for d in live)
    chosen = []
    for i in _dead_leaves(leaves):
        aval = (leaves[i].shape, leaves[i].dtype)
        if free[aval]:
            free[aval] -= 1
            chosen.append(i)
    return tuple(chosen)


def _uses_leaf(specs, leaf: int) -> bool:
    return any((spec[0] is _LEAF and spec[1] == leaf)
               or (spec[0] is _SEQ and _uses_leaf(spec[2], leaf)) for spec in specs)


def _live_outputs(graph: _Graph) -> tuple[list[Deferred], tuple]:
    """The graph's values something still references (its outputs), and their (node, index)."""
    live = [d for ref in graph.outputs if (d := ref()) is not None and d.value is None]
    return live, tuple((d.node, d.index) for d in live)


def flush(reason: str = "sync") -> None:
    """Run the pending graph (if any) and give every live deferred value its array."""
    global _graph, last_flush_reason
    with _lock:
        graph = _graph
        if not graph.nodes:
            return
        _graph = _Graph()
        live, outputs = _live_outputs(graph)
        donated = _donatable(graph.leaves, live) if donate else ()
        leaves = tuple(graph.leaves)
        graph.leaves.clear()
        fingerprint = (tuple(graph.nodes), outputs,
                       tuple((x.shape, x.dtype, getattr(x, "weak_type", False)) for x in leaves),
                       donated)
        stats.requests += 1
        executable = _executables.get(fingerprint)
        if executable is None:
            stats.misses += 1
            if log_recompiles:
                _explain_miss(fingerprint, graph)
            started = time.perf_counter()
            executable = jax.jit(_program(graph.nodes, outputs),
                                 donate_argnums=donated).lower(*leaves).compile()
            stats.compile_seconds += time.perf_counter() - started
            _executables[fingerprint] = executable
        else:
            stats.hits += 1
        last_flush_reason = reason
        stats.sync_reasons[reason] += 1
        stats.graphs_run += 1
        stats.ops_run += len(graph.nodes)
        stats.donated_buffers += len(donated)
        try:
            values = executable(*leaves)
        except Exception as error:  # noqa: BLE001  (name the ops, then re-raise the same type)
            ops = graph.sources or [getattr(fn, "__name__", str(fn)) for fn, _, _ in graph.nodes]
            raise type(error)(f"{error}\n[torch_tpu] while running a fused graph of "
                              f"{len(graph.nodes)} ops: {', '.join(ops[:20])}"
                              f"{' ...' if len(ops) > 20 else ''} (set TPU_LAUNCH_BLOCKING=1 "
                              f"to run op by op)") from error
        for d, value in zip(live, values):
            d.value = value
        _unreported.extend((values, callback, origin, reason)
                           for values, callback, origin in graph.checks)
        report_checks(block=False)


#: The op being recorded, for errors of its deferred checks (set by the dispatcher).
current_op: str = ""


def when_ready(values: Any, callback: Callable[[Any], None]) -> None:
    """Call ``callback`` with the host copy of ``values`` (a pytree of arrays): now if they are
    concrete, else once their graph has run, the way CUDA reports a failed device-side assert at
    a later sync point. An exception from ``callback`` then names the op that recorded it."""
    if not any(type(v) is Deferred and v.value is None for v in jax.tree_util.tree_leaves(values)):
        callback(jax.device_get(jax.tree_util.tree_map(resolved, values)))
        return
    origin = f"{current_op or 'an op'} at {_user_line()}"
    with _lock:
        _graph.checks.append((values, callback, origin))


#: Checks whose graph has run, not yet reported: (values, callback, origin, sync reason).
_unreported: list[tuple] = []
#: Past this many unreported checks, flushes wait for the oldest (bounded memory).
max_unreported_checks = 64


def report_checks(block: bool = True) -> None:
    """Run the callbacks of checks whose graphs have run: all of them when ``block`` (a host
    read, ``synchronize()``: the program waits anyway), else only those whose values are ready,
    so a flush never waits for its graph to finish."""
    with _lock:
        while _unreported:
            values, callback, origin, reason = _unreported[0]
            leaves = [resolved(v) for v in jax.tree_util.tree_leaves(values)]
            if not (block or len(_unreported) > max_unreported_checks
                    or all(leaf.is_ready() for leaf in leaves)):
                break
            _unreported.pop(0)
            try:
                callback(jax.device_get(jax.tree_util.tree_map(resolved, values)))
            except Exception as error:  # noqa: BLE001  (same type, with where it came from)
                raise type(error)(f"{error} (raised by {origin}; a device-side check is "
                                  f"reported at a later sync point, after the graph that ran at: "
                                  f"{reason}; set TPU_LAUNCH_BLOCKING=1 to stop there)") from error


def report_later(values: Any, callback: Callable[[Any], None], origin: str, reason: str) -> None:
    """Queue a check whose values a program already computed (a compiled graph's bounds checks):
    reported when ready or at the next blocking sync, like fused eager's own checks."""
    with _lock:
        _unreported.append((values, callback, origin, reason))
    report_checks(block=False)


def sync(reason: str = "sync") -> None:
    """A blocking sync point: run the pending graph, then report every check it recorded."""
    flush(reason)
    report_checks()


def for_host(x: Any) -> Any:
    """The concrete array of ``x`` for a host read (a sync point, so named)."""
    if type(x) is Deferred and x.value is None:
        flush("host read")
    report_checks()
    return resolved(x)


def apply(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` for a jitted helper: recorded in fused mode (or when an input is still
    deferred), called directly otherwise."""
    if _fused or any(type(a) is Deferred for a in args):
        if _fused:
            return call(fn, args)
        args = tuple(resolved(a) for a in args)
    return fn(*args)


def pending() -> int:
    return len(_graph.nodes)


def stablehlo() -> Optional[str]:
    """StableHLO text of the pending graph, without running it (None when nothing is pending)."""
    with _lock:
        graph = _graph
        if not graph.nodes:
            return None
        _, outputs = _live_outputs(graph)
        return jax.jit(_program(graph.nodes, outputs)).lower(*graph.leaves).as_text()
