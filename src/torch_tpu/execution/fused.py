"""Fused eager: ops recorded into a graph, compiled once per fingerprint, run as one computation.

In fused mode a jitted op does not run when called: its thread's :class:`Recorder` appends it to
the open :class:`Graph` and returns :class:`~torch_tpu.runtime.buffer.Deferred` values (shape and
dtype known, worked out once per op and input signature). Storages hold those like any value.
The graph runs when something needs a concrete value (a host read, an op whose output shape
depends on data, ``sync()``, the end of ``backward()`` or of ``optimizer.step()``, a mode
switch) or when it reaches ``flags.max_nodes``: :meth:`Graph.run` traces the recorded nodes into
one ``jax.jit``, keyed by the graph's fingerprint (the op sequence with static arguments, how
nodes connect, the inputs' shapes and dtypes), so a steady-state training step compiles nothing
and XLA fuses across ops.

Only references from outside the graph keep a value it produces: a deferred value that nothing
else references any more when the graph runs is not an output, and XLA is free to fuse it away.

A graph either runs completely or not at all, as far as tensors can tell:

- every storage it overwrites keeps its previous value in the graph's undo log, so if the graph
  fails (an error from XLA, out of memory) each of them gets its old value back and the process
  stays usable; only values the graph itself was to create are lost, with the error named;
- an interrupt (Ctrl-C) while the graph compiles leaves it pending, to run at the next sync; one
  while it runs is delivered once its results are stored.

Graphs belong to threads (each thread has its own recorder, in ``runtime.context``); another
thread that needs a value of this graph runs it, under the graph's lock.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax

from ..runtime import (
    buffer,
    checks,
    compiler,
    events,
    host_copies,
    memory,
    native,
    padding,
    platform,
    precision,
    profiling,
)
from ..runtime.buffer import Deferred
from ..runtime.context import compiling, context
from ..runtime.flags import flags
from ..runtime.lru import Kind, caches
from . import background

# Graphs are cut at ``flags.max_nodes`` recorded ops (5000) even without a sync point, so a loop
# with no host reads stays bounded (runtime/flags.py: the C++ core reads it there).


# ----------------------------------------------------------------------------- statistics
class CacheStats:
    """Graph compilation cache counters (``torch.tpu.compilation_cache_stats()``)."""

    def __init__(self) -> None:
        self._zero()  # (executables built before this module was imported still count)

    def reset(self) -> None:
        self._zero()
        platform.compile_events.clear()

    def _zero(self) -> None:
        self.requests = self.hits = self.misses = 0
        self.compile_seconds = self.flush_seconds = 0.0
        self.graphs_run = self.ops_run = self.ops_run_alone = 0
        self.donated_buffers = 0
        self.compiled_graphs = self.compiled_runs = 0
        self.background_compiles = self.graphs_run_by_op = 0
        self.captures = self.replays = 0  # (``torch.tpu.graph``: execution/capture.py)
        self.sync_reasons: collections.Counter = collections.Counter()

    def as_dict(self) -> dict:
        disk_hits = platform.compile_events["disk_hits"]
        return {
            "requests": self.requests,
            "hits": self.hits,
            "misses": self.misses,
            "compile_seconds": self.compile_seconds,
            "flush_seconds": self.flush_seconds,
            "graphs_run": self.graphs_run,
            "ops_run": self.ops_run,
            "ops_run_alone": self.ops_run_alone,
            "cached_graphs": len(_executables),
            "disk_hits": disk_hits,
            "donated_buffers": self.donated_buffers,
            "xla_compiles": platform.compile_events["executables_built"] - disk_hits,
            "cache_trims": platform.compile_events["cache_trims"],
            "compiled_graphs": self.compiled_graphs,
            "compiled_runs": self.compiled_runs,
            "background_compiles": self.background_compiles,
            "graphs_run_by_op": self.graphs_run_by_op,
            "captures": self.captures,
            "replays": self.replays,
            "sync_reasons": dict(self.sync_reasons),
        }


stats = CacheStats()


#: fingerprint -> compiled graph
_executables = caches.lru("fused.executables", Kind.PROGRAMS)
#: the origins of the graphs that ran (``Graph.origin``): one met again at new shapes compiles
#: in the background, where that is on
_origins = caches.lru("fused.origins", Kind.TRACES)


caches.on_clear(Kind.PROGRAMS, background.forget)


#: say why something compiles (logged; printed under ``TORCH_TPU_LOG_RECOMPILES=1``; told to
#: ``torch_tpu.diagnose``): :func:`torch_tpu.runtime.events.explain`
explain = events.explain


# ----------------------------------------------------------------------------- node specs
#: How a node's argument enters the graph, a spec: ``(_LEAF, leaf index)``, ``(_NODE, node
#: index, output index)``, ``(_STATIC, value, its key)``, ``(_SEQ, list or tuple, item specs)``,
#: ``(_VIEW, storage's spec, start's spec or None, shape, strides)``. Plain tuples: the C++ core
#: builds one per argument of every op it records (``PyTuple_New``), which a class would slow.
_LEAF, _NODE, _STATIC, _SEQ, _VIEW = range(5)
_STRIDED = buffer.StridedView
_ARRAY = buffer.ARRAY_TYPE
#: (fn, input signature) -> (how to build the outputs: None for one array, ``tuple`` for a tuple
#: of arrays, else their treedef; output avals)
_shapes = caches.lru("fused.shapes", Kind.TRACES)


class NodeCall(NamedTuple):
    """A recorded node's program, with no arrays in it (inputs are leaf indices), so it doubles
    as the node's part of the fingerprint (hashed and compared as a tuple)."""

    fn: Callable
    arg_specs: tuple
    #: ((keyword, spec), ...)
    kw_specs: tuple
    #: the float32 matmul precision's JAX name (None: "highest")
    matmul_precision: Any


class _Node:
    """A recorded node's :class:`NodeCall`, shared by every graph that records that op the same
    way (see ``_nodes``): a graph's fingerprint then hashes one cached hash per node, and meets
    the same objects again when it is looked up (compared by identity; by content only where
    ``_nodes`` forgot one in between)."""

    __slots__ = ("key", "_hash")

    def __init__(self, key: NodeCall):
        self.key, self._hash = key, hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is _Node and self._hash == other._hash and self.key == other.key)


class NodeEntry(NamedTuple):
    """What a graph keeps per recorded node (``_nodes``' values, a template's items). The C++
    core reads these fields by position (``FusedRecord.cpp``'s ``kEntryFieldNames``;
    ``configure_fused`` checks they agree) and compares ``key`` with the key it builds."""

    node: _Node
    #: how the outputs become the function's result (:func:`_outputs_built_by`)
    built: Any
    #: the outputs' avals (``buffer.aval_of``)
    avals: list
    #: (fn, input signature): the node's key in ``_shapes``, and its signature for churn
    signature: tuple
    #: ((fn, input signature), arg specs, kwarg specs, matmul precision): its key in ``_nodes``
    key: tuple


#: ((fn, input signature), arg specs, kwarg specs, matmul precision) -> its :class:`NodeEntry`:
#: what ``_shapes`` holds, and the node, in
#: one lookup per recorded op; a graph keeps these objects, not the ones built to look them up
#: (fewer objects alive per recorded op: fewer garbage collections)
_nodes = caches.lru("fused.nodes", Kind.TRACES)
#: first op of a graph and its line -> the ``_nodes`` entries of the last graphs that started
#: there, each in order, the most recent first: a graph recording the same ops again (a
#: training loop) compares each node's key with the one at its place in the first, which costs
#: a fifth of hashing it (its dtypes' hashes are not cached) and looking it up; where that
#: differs it takes another of them whose node there is equal (a loop taking turns between
#: batch shapes or sequence buckets). A graph that followed one node for node replaces it.
_templates = caches.lru("fused.templates", Kind.TRACES)
#: how many graphs :data:`_templates` keeps per start
TEMPLATES_PER_START = 4


def _outputs_built_by(treedef: Any, count: int) -> Any:
    """How a node's ``count`` deferred outputs become its function's result: None for one array,
    ``tuple`` for a flat tuple of them (unflattening costs a microsecond), else ``treedef``."""
    if treedef == jax.tree_util.tree_structure(0):
        return None
    if treedef == jax.tree_util.tree_structure((0,) * count):
        return tuple
    return treedef


def _typed(x: Any) -> Any:
    """A static argument as a cache key: 1, 1.0 and True (equal in Python, different programs)
    kept apart, and NaN equal to itself."""
    kind = type(x)
    if kind is float:  # (by value but for the floats equal to others: 0.0 and -0.0, NaN)
        return (kind, x) if x == x and x else (kind, repr(x))
    if kind is tuple or kind is list:
        if set(map(type, x)) <= _INT:  # (shapes, strides, dims: ints are their own key)
            return (kind, tuple(x))
        return (kind, tuple(map(_typed, x)))
    return (kind, x)


_INT = {int}
#: Static arguments whose key :func:`_typed` makes as (type, value)
_KEYED_AS_IS = frozenset({int, bool, str, type(None)})


#: Types of static arguments (shapes, dims, flags), told apart from arrays without isinstance
_PLAIN = frozenset({int, float, bool, str, type(None)})


def check_key(fn: Callable, args: tuple) -> tuple | None:
    """A value check's program and inputs as the key of its result while one graph records
    (``Graph.checked``, ``ops._helpers.apply_check``): arrays and pending values by identity
    (their values never change), static arguments as :func:`_typed` keys them; None for
    anything else. (A decoder layer's cache update checks the positions it writes for its
    keys, then for its values: one program for both.)"""
    key = [fn]
    for a in args:
        kind = type(a)
        if kind in _PLAIN:
            key.append(_typed(a))
        elif kind is Deferred or kind is _ARRAY:
            key.append(id(a))
        else:
            return None
    return tuple(key)


_taints = checks._taints


def _is_value(x: Any) -> bool:
    """Whether ``x`` is an array, a deferred value or a view of one (an input of the graph), not
    a static."""
    kind = type(x)
    return (
        kind is Deferred
        or kind is _ARRAY
        or kind is _STRIDED
        or (kind not in _PLAIN and isinstance(x, jax.Array))
    )


def _abstract(spec: tuple, signature_iter) -> Any:
    kind = spec[0]
    if kind is _STATIC:
        next(signature_iter)
        return spec[1]
    if kind is _SEQ:
        return spec[1](_abstract(s, signature_iter) for s in spec[2])
    if kind is _VIEW:
        next(signature_iter)  # (its geometry)
        buf = _abstract(spec[1], signature_iter)
        return _STRIDED(buf, spec[2] and _abstract(spec[2], signature_iter), spec[3], spec[4])
    shape, dtype, weak = next(signature_iter)
    return jax.ShapeDtypeStruct(shape, dtype, weak_type=weak)


def _resolve(spec: tuple, env: list, leaves: tuple) -> Any:
    kind = spec[0]
    if kind is _NODE:
        return env[spec[1]][spec[2]]
    if kind is _LEAF:
        return leaves[spec[1]]
    if kind is _SEQ:
        return spec[1](_resolve(s, env, leaves) for s in spec[2])
    if kind is _VIEW:
        start = spec[2] and _resolve(spec[2], env, leaves)
        return _STRIDED(_resolve(spec[1], env, leaves), start, spec[3], spec[4])
    return spec[1]


def _program(nodes: list, outputs: tuple) -> Callable:
    """The graph as one function of its leaves (traced once per fingerprint by ``jax.jit``)."""

    def run(*leaves):
        env: list = []
        for fn, arg_specs, kw_specs, matmul_precision in nodes:
            with precision.scope(matmul_precision):
                out = fn(
                    *(_resolve(s, env, leaves) for s in arg_specs),
                    **{k: _resolve(s, env, leaves) for k, s in kw_specs},
                )
            env.append(jax.tree_util.tree_leaves(out))
        return [env[n][i] for n, i in outputs]

    return run


def _specs_of(node: NodeCall) -> Iterator[tuple]:
    yield from node.arg_specs
    for _, spec in node.kw_specs:
        yield spec


def _refs(spec: tuple, kind: int) -> Iterator[int]:
    """The node (or leaf) indices a spec reads."""
    if spec[0] is kind:
        yield spec[1]
    elif spec[0] is _SEQ:
        for s in spec[2]:
            yield from _refs(s, kind)
    elif spec[0] is _VIEW:
        yield from _refs(spec[1], kind)
        if spec[2]:
            yield from _refs(spec[2], kind)


def _renumbered(spec: tuple, nodes: dict, leaves: dict) -> tuple:
    """``spec`` reading node ``nodes[n]`` for node ``n`` and leaf ``leaves[i]`` for leaf ``i``."""
    kind = spec[0]
    if kind is _NODE:
        return (kind, nodes[spec[1]], spec[2])
    if kind is _LEAF:
        return (kind, leaves[spec[1]])
    if kind is _SEQ:
        return (kind, spec[1], tuple(_renumbered(s, nodes, leaves) for s in spec[2]))
    if kind is _VIEW:
        start = spec[2] and _renumbered(spec[2], nodes, leaves)
        return (kind, _renumbered(spec[1], nodes, leaves), start, spec[3], spec[4])
    return spec


def _renumbered_node(node: NodeCall, nodes: dict, leaves: dict) -> NodeCall:
    """``node`` reading node ``nodes[n]`` for node ``n`` and leaf ``leaves[i]`` for leaf ``i``."""
    return NodeCall(
        node.fn,
        tuple(_renumbered(s, nodes, leaves) for s in node.arg_specs),
        tuple((k, _renumbered(s, nodes, leaves)) for k, s in node.kw_specs),
        node.matmul_precision,
    )


#: most nodes a value check's inputs may take to compute apart from their graph, and most bytes
#: those nodes may read (computing them apart computes them twice: never a model's matmul)
APART_NODES = 4
APART_BYTES = 1 << 20
#: (the nodes computing a check's inputs, where its arguments come from, the check) -> program
_apart = caches.lru("fused.apart", Kind.PROGRAMS)


class _ApartInputs(NamedTuple):
    """Where the arguments of a value check computed apart come from (``Graph.computed_apart``)."""

    #: (node, output) of each argument the graph computes
    wanted: list
    #: per argument: ``(_NODE, i)``, the ``i``-th wanted; ``(_LEAF, i)``, the ``i``-th of
    #: ``extra``; or ``(_STATIC, value, key)``
    plan: list
    #: the arguments computed already
    extra: list


def _apart_program(key: tuple) -> Callable:
    nodes, outputs, plan, fn = key
    compute = _program(list(nodes), outputs)

    def run(*leaves):
        computed = compute(*leaves)
        return fn(
            *[computed[e[1]] if e[0] is _NODE else leaves[e[1]] if e[0] is _LEAF else e[1] for e in plan]
        )

    return jax.jit(run)


def _difference(new: NodeCall, old: NodeCall) -> str:
    """What differs between two recorded nodes: the op, or which static argument."""
    if new.fn is not old.fn:
        return "another op"
    if new.matmul_precision != old.matmul_precision:
        was, now = old.matmul_precision or "highest", new.matmul_precision or "highest"
        return f"the float32 matmul precision changed ({was} -> {now})"
    for position, (a, b) in enumerate(zip(_specs_of(new), _specs_of(old))):
        if a != b and a[0] is _STATIC and b[0] is _STATIC:
            return f"its static argument {position} (a shape, dim or dtype) changed: {b[1]!r} -> {a[1]!r}"
    return "its arguments come from other ops or inputs"


def _uses_leaf(specs, leaf: int) -> bool:
    return any(
        (spec[0] is _LEAF and spec[1] == leaf)
        or (spec[0] is _SEQ and _uses_leaf(spec[2], leaf))
        or (spec[0] is _VIEW and _uses_leaf([s for s in spec[1:3] if s], leaf))
        for spec in specs
    )


def _computed_elsewhere(args, graph: Graph) -> None:
    """Compute the inputs a graph other than ``graph`` still has to produce, before ``graph``'s
    lock is taken (the other graph may belong to a thread waiting for this one)."""
    for a in args:
        kind = type(a)
        if kind is _STRIDED:
            a = a.buf
            kind = type(a)
        if kind is Deferred:
            if a.value is None and a.graph is not graph:
                a.concrete()
        elif kind is list or kind is tuple:
            _computed_elsewhere(a, graph)


# ----------------------------------------------------------------------------- interrupts
@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) until the block ends, then deliver it: a graph that started running
    gets its results stored first. (Signals reach only the main thread; elsewhere a no-op.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:  # delivered again, to whatever handles it: Python's, SIG_DFL, SIG_IGN, C's
            signal.raise_signal(signal.SIGINT)


# ----------------------------------------------------------------------------- graphs
_OPEN, _DONE, _FAILED = range(3)
_NO_CHECKS: frozenset = frozenset()
#: Give XLA the buffers of inputs that die inside a graph (see :meth:`Graph._donatable`).
donate = True
#: why the last graph ran (for explanations and tests)
last_flush_reason: str | None = None
_previous_by_start = caches.lru("fused.previous_by_start", Kind.TRACES)


#: first op of a graph and its line -> {position of an op in it: the op}, for ops whose shapes
#: change from one graph to the next (a sequence growing by a token per step): they run alone, so
#: the rest of the graph keeps one shape and stays compiled (a graph looks its start up once)
_churning = caches.lru("fused.churning", Kind.CHURN)
#: first op of a graph and its line -> {position: (signatures seen there, graphs in a row that
#: brought a new one)} over the graphs that started there
_history = caches.lru("fused.history", Kind.CHURN)
#: graphs in a row with a new signature at a position before its op is taken out of graphs
CHURN_AFTER = 3
#: ... or one such graph, when the new signatures are at no more than this share of the graph's
#: positions: a few ops changing shape while the rest keep theirs is a sequence growing
#: inside a graph that is otherwise the same (a decoding step); a new batch size changes them all
CHURN_SHARE = 0.1


_RUN_GRAPH_FIRST = object()  # Graph.record: an op to run alone needs this graph's results
_NOW = object()  # Graph.record's matmul precision when its caller does not know it: read it


def _run_now(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """An op run at once on its inputs' values (strict eager's way) instead of recorded: a
    churning one, or one with an unhashable static argument. Its results depend on the checks
    its inputs depend on, as a recorded node's would."""
    args = tuple(buffer.resolved(a) for a in args)
    kwargs = {k: buffer.resolved(v) for k, v in kwargs.items()}
    out = precision.call(fn, *args, **kwargs)
    inherited = checks.inherited(jax.tree_util.tree_leaves((args, kwargs)))
    if inherited:
        checks.taint(jax.tree_util.tree_leaves(out), inherited)
    return out


def _learn_churn(graph: Graph) -> None:
    """On a cache miss, find the ops that made it: those at a position where the graphs that
    start the same way keep meeting shapes never seen there before (not a few recurring
    shapes, which each compile once and are then cached). From then on they run alone when
    their inputs are ready, at the price of one small program per shape."""
    history = _history.get(graph.start)
    if history is None:
        history = _history[graph.start] = {}
    novel_at = []
    # Past an op other than the one these graphs had at its position, this graph is another
    # sequence of ops (an evaluation after training steps that start on the same line): an op
    # met there at a position it shares with them says nothing about its shapes
    diverged = False
    for position, signature in zip(graph.positions, graph.signatures):
        if signature[0] in padding.BUCKETED_PROGRAMS:
            continue
        seen, novel = history.get(position, (frozenset(), 0))
        if signature in seen or _without_scalars(signature) in {_without_scalars(s) for s in seen}:
            history[position] = (seen | {signature} if len(seen) < 16 else seen, 0)
            continue
        if not (seen and next(iter(seen))[0] is signature[0]):  # another op here: start over
            diverged |= bool(seen)
            seen, novel = frozenset(), 0
        elif not diverged:
            novel += 1
            novel_at.append((position, signature[0], novel))
        history[position] = ((seen | {signature}) if len(seen) < 16 else frozenset({signature}), novel)
    few = len(novel_at) <= CHURN_SHARE * len(graph.positions)
    for position, fn, novel in novel_at:
        if few or novel >= CHURN_AFTER:
            here = _churning.get(graph.start)
            if here is None:
                here = _churning[graph.start] = {}
            if position in here:
                continue
            here[position] = fn
            if flags.log_recompiles:
                name = getattr(fn, "__name__", fn)
                explain(f"op {position} ({name}) has new shapes in every graph: it now runs on its own")


def _without_scalars(signature: tuple) -> tuple:
    """A node's signature without its zero-dimensional arrays: a view of another slice of one
    buffer (each layer's part of a shared KV cache, read with a start offset or without) is
    the same op on the same shapes, no churn."""
    entries = tuple(e for e in signature[1] if not (type(e[0]) is tuple and e[0] == ()))
    return signature[0], entries


def _new_entry(fn: Callable, signature: list, key: tuple) -> NodeEntry:
    """The entry of a node ``_nodes`` does not hold (met first, or forgotten since), kept there
    under ``key``; ``signature``: its inputs' abstract signatures, in order."""
    signature_key, arg_specs, kw_specs, matmul_precision = key
    shapes = _shapes.get(signature_key)
    if shapes is None:
        shapes = _shapes[signature_key] = _output_shapes(fn, signature, arg_specs, kw_specs)
    built, avals = shapes
    node = _Node(NodeCall(fn, arg_specs, kw_specs, matmul_precision))
    entry = _nodes[key] = NodeEntry(node, built, avals, signature_key, key)
    return entry


def _output_shapes(fn: Callable, signature: list, arg_specs: tuple, kw_specs: tuple) -> tuple:
    """``fn``'s outputs on inputs of ``signature`` (``jax.eval_shape``): how they become its
    result (:func:`_outputs_built_by`), and their avals; what ``_shapes`` keeps."""
    walk = iter(signature)
    abstract_args = [_abstract(s, walk) for s in arg_specs]
    abstract_kwargs = {k: _abstract(s, walk) for k, s in kw_specs}
    out = jax.eval_shape(fn, *abstract_args, **abstract_kwargs)
    leaves, treedef = jax.tree_util.tree_flatten(out)
    return _outputs_built_by(treedef, len(leaves)), [buffer.aval_of(leaf) for leaf in leaves]


class Fingerprint(NamedTuple):
    """What a graph's compiled program depends on: the key of :data:`_executables`."""

    nodes: tuple  # its interned nodes (``_Node``)
    outputs: tuple  # (node, output) of each live value it returns
    leaf_avals: tuple  # its inputs' (shape, dtype, weak type)
    donated: tuple  # the inputs XLA may reuse (``Graph._donatable``)
    index: int  # the tpu it runs on (an executable runs on the device it was compiled for)
    compiler_token: Any  # the compiler options then (``compiler.token()``)


def _execute(executable: Callable, leaves: list) -> list:
    """Run a compiled graph (the one place XLA runs it: tests make it fail here)."""
    return executable(*leaves)


class Graph:
    """The ops one thread recorded since its last sync point."""

    def __init__(self, continuing: Graph | None = None, index: int = 0) -> None:
        self.nodes: list[NodeCall] = []
        self.leaves: list[jax.Array] = []  # concrete inputs, in first-use order
        self.leaf_avals: list[tuple] = []  # their (shape, dtype, weak type): the fingerprint's
        self.interned: list[_Node] = []  # the nodes as the fingerprint has them
        self.entries: list[NodeEntry] = []  # their ``_nodes`` entries (the next graph's template)
        #: the entries of the last graph with this one's start (a graph cut from another: none),
        #: or of another recent one (:data:`_templates`), where that one's matched
        self.template: list[NodeEntry] = []
        self.recent: list[list[NodeEntry]] = []  # the start's recent graphs' entries, this one's first
        self.leaf_ids: dict[int, int] = {}
        #: its deferred values, alive while anything else references them (see _live_outputs)
        self.outputs: list[Deferred] = []
        self.sources: list[str] = []  # user source line per node (only when logging)
        self.checks: list[checks.Check] = []
        #: per node, the checks its outputs depend on (its op's own, and its inputs')
        self.taints: list[frozenset] = []
        #: value checks' results while it records (``ops._helpers.apply_check``): a check of
        #: the same values runs once
        self.checked: dict[tuple, tuple] = {}
        self._unclaimed: list[checks.Check] = []  # added by the op being recorded
        #: (storage, the value it had before this graph first wrote it)
        self.undo: list[tuple[weakref.ref, Any]] = []
        self.state = _OPEN
        self.lock = threading.RLock()
        #: ops met so far (recorded, or run alone as churning), the first one's function and line, and
        #: per node its position among them and its signature (see :func:`_learn_churn`); a
        #: graph cut to run a churning op alone is continued by the next one
        self.seen = 0 if continuing is None else continuing.seen
        self.start: tuple | None = None if continuing is None else continuing.start
        #: the start with a padded op's program as the op's own: the same graph at any sizes
        self.origin: tuple | None = None if continuing is None else continuing.origin
        #: the ops learned to churn in graphs of this start, by position (None: none)
        self.churning: dict | None = None if continuing is None else continuing.churning
        self.positions: list[int] = []
        self.signatures: list[tuple] = []
        #: whether a churning op had to be recorded (this graph changes shape anyway: it is
        #: not cut for the next one)
        self.churned = False
        #: whether a miss of this graph teaches churn (not in a thread whose shapes recur)
        self.learns_churn = not context.shapes_recur
        self._unreported = context.checks  # the recording thread's list
        #: the tpu index the graph runs on (all its inputs' device)
        self.index = index if continuing is None else continuing.index

    # ------------------------------------------------------------------ recording
    def _specs(self, values: Any, signature: list, depends: list) -> tuple:
        """How each node argument in ``values`` enters the graph; appends their abstract
        signatures, and adds the checks their values depend on to ``depends``. (One frame for all
        of a node's arguments: a call per argument was a fifth of recording one.)"""
        specs = []
        for x in values:
            kind = type(x)
            if kind is Deferred:
                if x.value is None:  # (another graph's were computed first: _computed_elsewhere)
                    signature.append((x.shape, x.dtype, x.weak_type))
                    taints = self.taints[x.node]
                    if taints:
                        depends.extend(taints)
                    specs.append((_NODE, x.node, x.index))
                    continue
                x = x.value
                kind = type(x)
            if kind is _STRIDED:  # a view its op's program reads: the storage's array and its geometry
                signature.append((x.shape, x.strides))
                if x.start is None:
                    (buf,) = self._specs((x.buf,), signature, depends)
                    specs.append((_VIEW, buf, None, x.shape, x.strides))
                else:
                    buf, start = self._specs((x.buf, x.start), signature, depends)
                    specs.append((_VIEW, buf, start, x.shape, x.strides))
            elif kind is _ARRAY or (
                kind not in _PLAIN and kind is not tuple and kind is not list and isinstance(x, jax.Array)
            ):
                if kind is _ARRAY:  # (its ``shape``, ``dtype``, ``weak_type`` are Python properties
                    described = x.aval  # reading ``aval``)
                    aval = (described.shape, described.dtype, described.weak_type)
                else:
                    aval = (x.shape, x.dtype, getattr(x, "weak_type", False))
                index = self.leaf_ids.get(id(x))
                # Scalars get a leaf per use: most are cached numbers (``transfer.device_scalar``,
                # one array per value), and sharing leaves would make the graph's structure depend
                # on which numbers happen to be equal (a sequence length meeting a dimension)
                if index is None or not aval[0]:
                    index = self.leaf_ids[id(x)] = len(self.leaves)
                    self.leaves.append(x)
                    self.leaf_avals.append(aval)
                signature.append(aval)
                if _taints:  # (mostly empty: no array depends on a pending check)
                    depends.extend(checks.taint_of(x))
                specs.append((_LEAF, index))
            elif (kind is list or kind is tuple) and any(map(_is_value, x)):
                specs.append((_SEQ, kind, self._specs(x, signature, depends)))
            else:
                key = (kind, x) if kind in _KEYED_AS_IS else _typed(x)
                signature.append(key)
                specs.append((_STATIC, x, key))
        return tuple(specs)

    def record(self, fn: Callable, args: tuple, kwargs: dict, name: str, matmul_precision: Any = _NOW) -> Any:
        """Append ``fn(*args, **kwargs)``; its outputs as deferred values, or None if the graph
        was run (by another thread) before the node could be added. ``matmul_precision``: the
        float32 matmul precision's JAX name (:func:`precision.current`), where the caller knows
        it."""
        with self.lock:
            if self.state is not _OPEN:
                return None
            position = self.seen
            if position == 0:  # graphs that start with this op at this line: the same loop, mostly
                self._start_with(fn)
            churning = self.churning is not None and self.churning.get(position) is fn
            if churning and not self._unclaimed:
                if not any(map(self._computes, (*args, *kwargs.values()))):
                    self.seen += 1
                    stats.ops_run_alone += 1
                    return _run_now(fn, args, kwargs)
                if not self.churned:  # the graph so far keeps its shapes: cut it here
                    return _RUN_GRAPH_FIRST
            self.churned |= churning
            self.seen += 1
            depends = list(self._unclaimed)
            entry = self._entry(fn, args, kwargs, matmul_precision, depends)
            # (appended here, not by a method: one more call per op was 2% of recording it here)
            node_spec, node = entry.node, len(self.nodes)
            self.nodes.append(node_spec.key)
            self.interned.append(node_spec)
            self.entries.append(entry)
            self.positions.append(position)
            self.signatures.append(entry.signature)
            self.taints.append(frozenset(depends) if depends else _NO_CHECKS)
            self._unclaimed.clear()
            if flags.log_recompiles:
                self.sources.append(f"{name or getattr(fn, '__name__', fn)} at {checks.user_line()}")
            built, avals = entry.built, entry.avals
            if built is None:
                out = Deferred(avals[0], self, node, 0)
                self.outputs.append(out)
                return out
            outs = [Deferred(aval, self, node, i) for i, aval in enumerate(avals)]
            self.outputs.extend(outs)
            return tuple(outs) if built is tuple else jax.tree_util.tree_unflatten(built, outs)

    def _start_with(self, fn: Callable) -> None:
        """This graph starts with ``fn`` at the user's line: what graphs that started there
        learned (churning ops, their entries as templates), and this one's entries the first
        template of the next."""
        self.start = (fn, checks.user_line())
        self.origin = (getattr(fn, "padded_from", fn), self.start[1])
        self.churning = _churning.get(self.start)
        recent = self.recent = _templates.get(self.start) or []
        self.template = recent[0] if recent else self.template
        recent.insert(0, self.entries)  # (the next graph that starts here reads them first)
        del recent[TEMPLATES_PER_START:]
        _templates[self.start] = recent

    def _entry(
        self, fn: Callable, args: tuple, kwargs: dict, matmul_precision: Any, depends: list
    ) -> NodeEntry:
        """The entry of the node ``fn(*args, **kwargs)``: its template's, another recent graph's,
        ``_nodes``', or a new one. Adds its new leaves to the graph and the checks its inputs
        depend on to ``depends``; where it raises (an unhashable static argument), leaves no
        input behind."""
        signature: list = []
        known = len(self.leaves)
        try:
            arg_specs = self._specs(args, signature, depends)
            kw_specs = tuple(zip(kwargs, self._specs(kwargs.values(), signature, depends))) if kwargs else ()
            signature_key = (fn, tuple(signature))
            if matmul_precision is _NOW:
                matmul_precision = precision.current()
            node_key = (signature_key, arg_specs, kw_specs, matmul_precision)
            node = len(self.nodes)
            template = self.template
            if node < len(template) and template[node].key == node_key:
                return template[node]
            entry = self._from_other_template(node, node_key) or _nodes.get(node_key)
            return entry if entry is not None else _new_entry(fn, signature, node_key)
        except BaseException:  # not recorded (run alone, or an error): leaves no input behind
            for x in self.leaves[known:]:
                self.leaf_ids.pop(id(x), None)
            del self.leaves[known:], self.leaf_avals[known:]
            raise

    def _from_other_template(self, node: int, node_key: tuple) -> NodeEntry | None:
        """The entry at ``node`` of another recent graph of this start whose node there has
        ``node_key``; that graph is this one's template from now on. None if none has."""
        for entries in self.recent:
            if entries is not self.template and entries is not self.entries:
                if node < len(entries) and entries[node].key == node_key:
                    self.template = entries
                    return entries[node]
        return None

    def _replace_template(self) -> None:
        """This graph's entries (among its start's recent graphs) replace those of the template
        it followed node for node: the recent graphs stay different ones."""
        template = self.template
        if template is not self.entries and len(template) == len(self.entries):
            if all(a is b for a, b in zip(template, self.entries)):
                for i, entries in enumerate(self.recent):
                    if entries is template:
                        del self.recent[i]
                        break

    def computed_apart(self, fn: Callable, args: tuple) -> Any:
        """``fn(*args)`` computed now, apart from the graph: at once when its arguments are
        computed already (a batch from the host), or as a small program of its own when the
        arguments this graph computes take at most :data:`APART_NODES` of its nodes, reading
        at most :data:`APART_BYTES` of inputs that are ready (a value check over
        ``torch.arange``'s positions, or over a view of a batch): its result is then ready
        without running, or waiting for, the whole graph. None when they are not (the caller
        records ``fn``)."""
        with self.lock:
            inputs = self._apart_inputs(args)
            if inputs is None:
                return None
            if not inputs.wanted:  # all computed already: no node to compute again
                if not all(x.is_ready() for x in inputs.extra):
                    return None
                return fn(*[inputs.extra[e[1]] if e[0] is _LEAF else e[1] for e in inputs.plan])
            order = self._cone(inputs.wanted)
            if order is None:
                return None
            used = sorted({i for n in order for spec in _specs_of(self.nodes[n]) for i in _refs(spec, _LEAF)})
            leaves = [self.leaves[i] for i in used] + inputs.extra
            if sum(buffer.nbytes(self.leaves[i]) for i in used) > APART_BYTES:
                return None
            if not all(x.is_ready() for x in leaves):
                return None
            key = self._apart_key(order, used, inputs, fn)
        try:
            program = _apart.get(key)
            if program is None:
                program = _apart[key] = _apart_program(key)
        except TypeError:  # an unhashable static argument
            return None
        with jax.default_device(platform.jax_device(self.index)):
            return program(*leaves)

    def _apart_inputs(self, args: tuple) -> _ApartInputs | None:
        """Where a value check's arguments come from (see :class:`_ApartInputs`); None where one
        is another graph's pending value, or no array or plain static."""
        inputs = _ApartInputs([], [], [])
        for a in args:
            if type(a) is Deferred and a.value is None:
                if a.graph is not self or self.state is not _OPEN:
                    return None
                inputs.plan.append((_NODE, len(inputs.wanted)))
                inputs.wanted.append((a.node, a.index))
            elif type(a) is Deferred or type(a) is _ARRAY:
                inputs.plan.append((_LEAF, len(inputs.extra)))
                inputs.extra.append(buffer.resolved(a))
            elif type(a) in _PLAIN:
                inputs.plan.append((_STATIC, a, _typed(a)))  # (1 and True: different programs)
            else:
                return None
        return inputs

    def _cone(self, wanted: list) -> list[int] | None:
        """The nodes that compute the ``(node, output)`` values ``wanted``, in order; None where
        they are more than :data:`APART_NODES`."""
        cone, stack = set(), [n for n, _ in wanted]
        while stack:
            n = stack.pop()
            if n not in cone:
                cone.add(n)
                stack.extend(r for spec in _specs_of(self.nodes[n]) for r in _refs(spec, _NODE))
                if len(cone) > APART_NODES:
                    return None
        return sorted(cone)

    def _apart_key(self, order: list, used: list, inputs: _ApartInputs, fn: Callable) -> tuple:
        """The key of the program computing ``fn`` over the nodes ``order`` apart (see
        :data:`_apart`): its nodes read their leaves ``used`` as its first inputs, then the
        check's computed arguments."""
        node_at = {n: i for i, n in enumerate(order)}
        leaf_at = {i: j for j, i in enumerate(used)}
        nodes = tuple(_renumbered_node(self.nodes[n], node_at, leaf_at) for n in order)
        plan = tuple((_LEAF, e[1] + len(used)) if e[0] is _LEAF else e for e in inputs.plan)
        return (nodes, tuple((node_at[n], i) for n, i in inputs.wanted), plan, fn)

    def _computes(self, value: Any) -> bool:
        """Whether ``value`` (or an element of a list of them) is one this graph computes."""
        for v in value if type(value) in (list, tuple) else (value,):
            if type(v) is _STRIDED:
                v = v.buf
            if type(v) is Deferred and v.value is None and v.graph is self:
                return True
        return False

    def overwrote(self, storage, old: Any) -> None:
        """``storage`` now holds a value of this graph; ``old`` is put back if the graph fails."""
        with self.lock:
            if self.state is _OPEN:
                self.undo.append((weakref.ref(storage), old))

    def add_check(self, check: checks.Check) -> None:
        """A check of the op being recorded: the outputs of its next node depend on it."""
        with self.lock:
            self.checks.append(check)
            self._unclaimed.append(check)

    # ------------------------------------------------------------------ running
    def run(self, reason: str) -> None:
        """Compute every live value of this graph (at most once; any thread may ask)."""
        with self.lock:
            if self.state is not _OPEN:
                return
            if not self.nodes:
                self.state = _DONE
                return
            self._run(reason)

    def _live_outputs(self) -> tuple[list[Deferred], tuple]:
        # (a value is live if referenced beyond the list, the loop's variable and getrefcount's
        # argument: held by a storage, a view, the user; a reference count, not a weak reference
        # per value, as these are the most numerous objects a recording creates)
        live = [d for d in self.outputs if sys.getrefcount(d) > 3 and d.value is None]
        return live, tuple((d.node, d.index) for d in live)

    def _donatable(self, live: list) -> tuple[int, ...]:
        """Inputs nothing but this graph still references (a storage the graph overwrote -- an
        updated parameter, optimizer state -- or a temporary), one per output of the same shape
        and dtype that can reuse its buffer: XLA updates them in place instead of holding old
        and new values at once. Any other reference (a storage, a view's value, the user's
        ``to_jax`` result, a cache) keeps an input from being donated. Counted here: the leaf
        list, getrefcount's argument, and the undo log's entries (which, if the run fails, find
        a donated buffer deleted only when XLA had already consumed it)."""
        held = collections.Counter(id(old) for _, old in self.undo)
        free = collections.Counter((d.shape, d.dtype) for d in live)
        leaves, avals, chosen = self.leaves, self.leaf_avals, []
        # (each count: the list's reference and getrefcount's argument; ``get``, not Counter's
        # Python-level __missing__, for the many leaves that are in neither counter)
        for i, count in enumerate(map(sys.getrefcount, leaves)):
            if count == 2 + held.get(id(leaves[i]), 0):
                aval = avals[i][:2]
                if free.get(aval):
                    free[aval] -= 1
                    chosen.append(i)
        return tuple(chosen)

    def _run(self, reason: str) -> None:
        global last_flush_reason
        flush_started, compiled_before = time.perf_counter(), stats.compile_seconds
        profiled = time.time_ns() if profiling.active else 0
        live, outputs = self._live_outputs()
        donated = self._donatable(live) if donate else ()
        fingerprint = Fingerprint(
            tuple(self.interned), outputs, tuple(self.leaf_avals), donated, self.index, compiler.token()
        )
        stats.requests += 1
        executable = self._executable(fingerprint, outputs, donated)
        if self.origin is not None:
            _origins[self.origin] = True
        with interrupts_held():
            try:
                if executable is None:  # (compiling in the background)
                    stats.graphs_run_by_op += 1
                    values = self._run_by_op(outputs)
                else:
                    values = _execute(executable, self.leaves)
            except BaseException as error:
                error = memory.translate(error, sum(buffer.nbytes(d) for d in live))
                raise self._failed(error) from error
            for d, value in zip(live, values):
                d.value = value
            host_copies.pass_host_copies(live)
            self.state = _DONE
            self._release()
            self._replace_template()
        last_flush_reason = reason
        stats.sync_reasons[reason] += 1
        stats.graphs_run += 1
        stats.ops_run += len(self.nodes)
        stats.donated_buffers += len(donated)
        ran, self.checks = self.checks, []  # (a check's callback may refer to this graph's values)
        for check in ran:
            checks.queue(check, self._unreported)
        for d in live:
            if self.taints[d.node]:
                checks.taint([d.value], self.taints[d.node])
        self.taints = []
        checks.poll()
        stats.flush_seconds += time.perf_counter() - flush_started - (stats.compile_seconds - compiled_before)
        if profiled:
            profiling.note(profiling.FUSED_GRAPH, profiled, self._profile_metadata(reason))

    def _profile_metadata(self, reason: str) -> dict[str, str]:
        """What a profile's trace says of this graph's run: its ops (with their lines where
        reasons are explained) and why it ran."""
        ops = self.sources or [getattr(node.fn, "__name__", str(node.fn)) for node in self.nodes]
        return {"ops": ", ".join(ops), "op_count": str(len(ops)), "reason": reason}

    def _executable(self, fingerprint: Fingerprint, outputs: tuple, donated: tuple) -> Any:
        """The graph's compiled program: cached, compiled in the background and ready now, or
        compiled now; None while it compiles in the background (this run goes op by op)."""
        executable = _executables.get(fingerprint)
        if executable is not None:
            stats.hits += 1
            return executable
        if background.compiling(fingerprint):
            executable = background.take(fingerprint, lambda: self._compile(outputs, donated))
        else:
            stats.misses += 1
            if flags.log_recompiles:
                self._explain_miss(fingerprint)
            if self.learns_churn:
                _learn_churn(self)
            in_background = self.origin in _origins and background.enabled()
            executable = self._compile(outputs, donated, fingerprint if in_background else None)
        if executable is not None:
            _executables[fingerprint] = executable
        return executable

    def _compile(self, outputs: tuple, donated: tuple, in_background: tuple | None = None) -> Any:
        """The graph's executable; or, given its fingerprint ``in_background``, None, its
        program lowered now and compiled on the worker thread (:mod:`.background`)."""
        started = time.perf_counter()
        try:  # (an interrupt here leaves the graph pending: it runs at the next sync)
            with jax.default_device(platform.jax_device(self.index)):  # (no input may say)
                lowered = jax.jit(_program(self.nodes, outputs), donate_argnums=donated).lower(*self.leaves)
                if in_background is not None:
                    background.submit(in_background, lowered, compiler.optimized())
                    stats.background_compiles += 1
                    if flags.log_recompiles:
                        explain("compiling it in the background; its ops run one by one meanwhile")
                    return None
                with compiling():
                    return lowered.compile(compiler.optimized())
        except Exception as error:
            raise self._failed(error) from error
        finally:
            stats.compile_seconds += time.perf_counter() - started

    def _run_by_op(self, outputs: tuple) -> list:
        """The graph's outputs computed op by op, each op's own program run on its inputs (as
        strict eager runs them), while the graph's program compiles in the background."""
        with jax.default_device(platform.jax_device(self.index)):
            return _program(self.nodes, outputs)(*self.leaves)

    def _release(self) -> None:
        # (its outputs refer to it: dropping them breaks the cycle, so the graph goes with the
        # last of them rather than at a garbage collection)
        self.leaves, self.leaf_avals, self.leaf_ids, self.undo, self.outputs = [], [], {}, [], []
        self.checked = {}

    def _failed(self, error: BaseException) -> BaseException:
        """Undo the graph: storages it overwrote get their old values back; values it was to
        create are lost, naming ``error``. Returns the exception to raise (same type, naming
        the graph's ops)."""
        lost = f"the fused graph computing it failed ({type(error).__name__}: {error})"
        for d in self.outputs:
            if d.value is None:
                d.error = lost
        for storage_ref, old in self.undo:
            storage = storage_ref()
            if storage is None:
                continue
            current = buffer.get(storage)
            if type(current) is not Deferred or current.graph is not self:
                continue  # written again since, by another graph
            if isinstance(old, jax.Array) and old.is_deleted():
                continue  # donated and consumed before the failure: keeps the error above
            buffer.restore(storage, old)
        self.state = _FAILED
        self._release()
        if not isinstance(error, Exception):  # an interrupt: delivered as it is
            return error
        ops = self.sources or [getattr(node.fn, "__name__", str(node.fn)) for node in self.nodes]
        try:
            return type(error)(
                f"{error}\n[torch_tpu] while running a fused graph of "
                f"{len(self.nodes)} ops: {', '.join(ops[:20])}"
                f"{' ...' if len(ops) > 20 else ''} (set TPU_LAUNCH_BLOCKING=1 "
                f"to run op by op)"
            )
        except Exception:  # noqa: BLE001  (an exception type with another signature)
            return error

    def _explain_miss(self, fingerprint: Fingerprint) -> None:
        """Say which recorded op made this graph differ from the last one that started the same
        way (``TORCH_TPU_LOG_RECOMPILES=1``)."""
        keys = [node.key for node in fingerprint.nodes]
        if len(self.sources) != len(keys):  # (explaining began while this graph recorded)
            return
        start = keys[0].fn if keys else None  # the first op's function, whatever its arguments
        previous = _previous_by_start.get(start)
        _previous_by_start[start] = (fingerprint, list(self.sources))
        if previous is None:
            explain(
                f"compiling a new graph of {len(keys)} ops (first graph starting with "
                f"{self.sources[0] if self.sources else '?'})"
            )
            return
        before, old_sources = previous
        old_keys = [node.key for node in before.nodes]
        for i, (new, old) in enumerate(zip(keys, old_keys)):
            if new != old:
                explain(f"recompiling: op {i} differs from the previous graph: {_difference(new, old)}")
                explain(f"  now {self.sources[i]}, before {old_sources[i]}")
                return
        if len(keys) != len(old_keys):
            explain(f"recompiling: {len(keys)} ops instead of {len(old_keys)} (ends at {self.sources[-1]})")
        elif fingerprint.leaf_avals != before.leaf_avals:
            changed = next(
                i for i, (a, b) in enumerate(zip(fingerprint.leaf_avals, before.leaf_avals)) if a != b
            )
            user = next(
                (
                    self.sources[n]
                    for n, node in enumerate(self.nodes)
                    if _uses_leaf(_specs_of(node), changed)
                ),
                "?",
            )
            (old_shape, old_dtype, _), (shape, dtype, _) = (
                before.leaf_avals[changed],
                fingerprint.leaf_avals[changed],
            )
            explain(
                f"recompiling: an input changed shape or dtype, {old_dtype}"
                f"{list(old_shape)} -> {dtype}{list(shape)}, first used by {user}"
            )
        else:
            explain(
                "recompiling: other values of the graph are used afterwards, or other inputs can be donated"
            )

    def stablehlo(self) -> str | None:
        with self.lock:
            if self.state is not _OPEN or not self.nodes:
                return None
            _, outputs = self._live_outputs()
            return jax.jit(_program(self.nodes, outputs)).lower(*self.leaves).as_text()


class Recorder:
    """One thread's fused-eager recording: the open graph, replaced once it has run."""

    def __init__(self) -> None:
        self.graph = Graph()

    def record(
        self,
        fn: Callable,
        args: tuple,
        kwargs: dict | None = None,
        name: str = "",
        matmul_precision: Any = _NOW,
    ) -> Any:
        """Record ``fn(*args, **kwargs)`` (a jitted, pure function); returns its outputs as
        deferred values in the structure ``fn`` returns. ``matmul_precision``: the float32 matmul
        precision's JAX name, where the caller knows it (the core, which plans calls only under
        "highest", passes None); else read now."""
        if not kwargs:
            outs = _record_repeated(self.graph, fn, args, matmul_precision)
            if outs is not NotImplemented:
                return outs
        graph = self.graph
        _computed_elsewhere(args, graph)
        kwargs = kwargs or {}
        if kwargs:
            _computed_elsewhere(kwargs.values(), graph)
        if flags.others_used:
            self._on_device(_index_of((args, kwargs)))
        while True:
            graph = self.open_graph()
            try:
                outs = graph.record(fn, args, kwargs, name, matmul_precision)
            except TypeError:  # an unhashable static argument: run this op eagerly
                return _run_now(fn, args, kwargs)
            if outs is _RUN_GRAPH_FIRST:  # (its results are dispatched, not waited for)
                graph.run("an op whose shapes change in every graph runs alone")
                self.graph = Graph(continuing=graph)
                continue
            if outs is not None:
                return outs

    def open_graph(self) -> Graph:
        """The graph the next op is recorded into (a new one if the last has run or is full)."""
        graph = self.graph
        if graph.state is not _OPEN:
            graph = self.graph = Graph(index=graph.index)
        elif len(graph.nodes) >= flags.max_nodes:
            graph.run("the graph reached max_nodes")
            graph = self.graph = Graph(index=graph.index)
        return graph

    def _on_device(self, index: int | None) -> None:
        """Record the next op into a graph on ``tpu:index``: a graph holds one device's ops (one
        XLA program), so the open one runs first if it has ops of another device."""
        graph = self.graph
        if index is None:  # (a factory's op: on its device)
            index = context.index
        if graph.index != index:
            if graph.state is _OPEN and graph.nodes:
                graph.run("the ops moved to another device")
            if graph.state is not _OPEN:
                graph = self.graph = Graph()
            graph.index = index

    def flush(self, reason: str) -> None:
        self.graph.run(reason)

    def pending(self) -> int:
        graph = self.graph
        return len(graph.nodes) if graph.state is _OPEN else 0

    def has_checks(self) -> bool:
        graph = self.graph
        return graph.state is _OPEN and bool(graph.checks)


def _index_of(values: Any, found: int | None = None) -> int | None:
    """The tpu index of the arrays among ``values`` (nested lists, tuples, dicts); None if
    there are none. Arrays of two devices are PyTorch's device error, raised at the op."""
    for x in values.values() if type(values) is dict else values:
        kind = type(x)
        if kind is Deferred and x.value is None:
            index = x.graph.index
        elif kind is Deferred or kind is _ARRAY:
            value = x.value if kind is Deferred else x
            if not value.committed:  # (a random key: goes where the program runs)
                continue
            index = platform.index_of(value.sharding._device)
        elif kind in (list, tuple, dict):
            index = _index_of(x, found)
        elif kind is _STRIDED:
            index = _index_of((x.buf,), found)
        else:
            continue
        if found is None:
            found = index
        elif index is not None and index != found:
            raise platform.mixed_devices(f"tpu:{found}", f"tpu:{index}")
    return found


def _graph_records(graph: Graph, fn: Callable, args: Any, matmul_precision: Any) -> Any:
    return NotImplemented


# ``flags.record_in_core``: whether the C++ core records a node that repeats the one at its place
# in the graph's template (``Graph.record``'s path in a loop, without its Python); tests switch
# it off to compare.
flags.record_in_core = native.available()
if native.available():
    native._C.configure_fused(globals(), vars(checks), Deferred, _STRIDED, _ARRAY, jax.Array, NodeEntry)
#: ``_record_repeated(graph, fn, args, matmul_precision)``: the node's outputs where the core
#: recorded it, else NotImplemented (``Graph.record`` decides)
_record_repeated = native._C.record_repeated if native.available() else _graph_records


# ----------------------------------------------------------------------------- this thread
def active() -> bool:
    return context.recorder is not None


def set_active(enabled: bool) -> None:
    """Switch this thread's fused recording on or off; a switch runs whatever is pending first
    and reports its checks."""
    sync()
    context.recorder = Recorder() if enabled else None


def flush(reason: str = "sync") -> None:
    """Run this thread's pending graph (if any) and give every live deferred value its array."""
    recorder = context.recorder
    if recorder is not None:
        recorder.flush(reason)


def sync(reason: str = "sync") -> None:
    """A blocking sync point: run the pending graph, then report every check of this thread."""
    flush(reason)
    checks.report_all()


def pending() -> int:
    recorder = context.recorder
    return recorder.pending() if recorder is not None else 0


def stablehlo() -> str | None:
    """StableHLO text of this thread's pending graph, without running it (None when nothing
    is pending)."""
    recorder = context.recorder
    return recorder.graph.stablehlo() if recorder is not None else None
