"""Capture and replay: ``torch.tpu.TPUGraph`` and ``torch.tpu.graph``, CUDA graphs' interface.

A captured region's ops are recorded as fused eager records them, into one graph that nothing
cuts, and compiled once into one XLA program. :meth:`TPUGraph.replay` runs that program again
without recording anything: on the *current* values of the tensors the region read, giving its
results to the tensors the region wrote or created. That is a CUDA graph's contract, with a
storage standing for an address:

- a tensor the region read is read again at each replay, whatever was copied into it since;
  everything else the region's ops took is fixed at capture: Python numbers, shapes, where a
  view starts, device scalars;
- a tensor the region wrote in place (a KV cache, a persistent output buffer) is written again,
  its old value donated to XLA where nothing else holds it; a tensor the region created and that
  is still alive when capture ends is its output, overwritten by every replay;
- what needs the host inside a capture raises, as CUDA's capture does: a read of a value
  (``.item()``, ``.cpu()``, printing), a random op (its key would be replayed);
- value checks (index bounds) run with every replay and are reported as fused eager reports
  them.

A replay takes no more host time than a call of the program: the region's tensors are found once,
at capture (the storages PyTorch keeps alive, searched through the garbage collector's objects).

Example::

    >>> import torch, torch_tpu
    >>> x = torch.zeros(4, device="tpu"); g = torch.tpu.TPUGraph()
    >>> with torch.tpu.graph(g):
    ...     y = x * 2 + 1
    >>> x.copy_(torch.arange(4.0)); g.replay(); y.cpu()
    tensor([1., 3., 5., 7.])
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax

from ..runtime import buffer, checks, compiler, host_copies, platform
from ..runtime.buffer import Deferred, Padded
from ..runtime.context import compiling, context
from . import fused

#: Flush reasons that mark a step's end rather than read a value: inside a capture they are
#: skipped (the captured region goes on), where anything else that runs the graph raises.
_BOUNDARIES = ("end of backward()", "end of optimizer.step()")


def _not_capturable(what: str) -> RuntimeError:
    return RuntimeError(
        f"{what} is not permitted while a tpu graph is being captured: a captured region runs as "
        "one XLA program, replayed without the host (move it outside torch.tpu.graph)"
    )


class _CapturedGraph(fused.Graph):
    """A fused graph that is never cut: it runs only when its capture ends."""

    churning = property(lambda self: None, lambda self, value: None)  # (no op runs alone)

    def __init__(self, index: int) -> None:
        super().__init__(index=index)
        self.ending = False

    def run(self, reason: str) -> None:
        if self.ending:
            return super().run(reason)
        if reason in _BOUNDARIES:
            return None
        raise _not_capturable(f"Reading a tensor's value (.item(), .cpu(), printing, a sync: {reason})")

    def computed_apart(self, fn: Callable, args: tuple) -> Any:
        return None  # (a result computed now would be the capture's, replayed as a constant)

    def abandon(self, error: BaseException) -> None:
        """Drop the recording: the storages it wrote get back what they held before it."""
        self.ending = True
        self._failed(error)


class _CaptureRecorder(fused.Recorder):
    def __init__(self, index: int) -> None:
        self.graph = _CapturedGraph(index)

    def open_graph(self) -> fused.Graph:
        return self.graph

    def _on_device(self, index: int | None) -> None:
        if index is not None and index != self.graph.index:
            raise _not_capturable(f"An op on tpu:{index} in a capture on tpu:{self.graph.index}")


@dataclasses.dataclass(frozen=True)
class _Input:
    """One input of the captured program: the storage it is read from at each replay, or (None)
    a constant of the capture (a device scalar, a view's start)."""

    storage: weakref.ref | None
    constant: jax.Array | None
    aval: tuple  # (shape, dtype)


@dataclasses.dataclass(frozen=True)
class _Check:
    """A value check of the captured region: its result arrays as output positions of the
    program (ints) or constants, rebuilt and queued at each replay."""

    values: Any
    callback: Callable[[Any], None]
    origin: str
    flags: list | None  # (``checks.Check.flags``, as positions or constants too)

    def made(self, values: list | dict) -> checks.Check:
        """The check of one run whose outputs are ``values`` (by position)."""

        def filled(v: Any) -> Any:
            return values[v] if type(v) is int else v

        flags = None if self.flags is None else [filled(f) for f in self.flags]
        return checks.Check(jax.tree_util.tree_map(filled, self.values), self.callback, self.origin, flags)


@dataclasses.dataclass
class _Program:
    """What a replay runs: the program, where its inputs come from and its outputs go."""

    function: Callable | None  # the captured nodes as one function of the inputs (None: no ops)
    specs: list  # the inputs' shapes, dtypes and placements, to compile it from
    inputs: list[_Input]
    holders: list[list[weakref.ref]]  # per output, the storages given it
    donated: tuple[int, ...]
    checks: list[_Check]  # each queued at every replay
    summarized: list[_Check]  # summed up by the program's last output (``checks.Summary``)
    index: int  # the tpu it runs on
    summary_reads: tuple[int, ...] = ()  # the outputs the summarized checks read
    executables: dict = dataclasses.field(default_factory=dict)  # donating? -> executable


class TPUGraph:
    """A captured region of tpu work (``torch.cuda.CUDAGraph``'s interface): capture it with
    :func:`graph` (or :meth:`capture_begin` / :meth:`capture_end`), run it with :meth:`replay`."""

    def __init__(self, keep_graph: bool = False) -> None:
        self._program: _Program | None = None
        self._recorder: _CaptureRecorder | None = None
        self._saved: fused.Recorder | None = None  # the thread's recorder before the capture
        self._host_copies: dict | None = None

    # ------------------------------------------------------------------ capture
    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        """Start recording this thread's tpu ops (what is pending runs first)."""
        if self._recorder is not None or context.capturing:
            raise RuntimeError("a tpu graph is already being captured in this thread")
        if self._program is not None:
            raise RuntimeError("this TPUGraph was captured already: call reset() first")
        fused.sync("a tpu graph capture begins")
        self._saved = context.recorder
        self._recorder = _CaptureRecorder(context.index)
        context.recorder, context.capturing = self._recorder, True
        # Host copies of small integer arrays let some ops compute on the host: inside a capture
        # their results would be constants of the program, so none is seen until it ends.
        self._host_copies = dict(host_copies.host_copies_by_id)
        host_copies.host_copies_by_id.clear()

    def capture_end(self) -> None:
        """Stop recording; compile the region and run it once (its outputs get their values)."""
        recorder = self._recorder
        if recorder is None:
            raise RuntimeError("capture_end() without capture_begin()")
        self._leave_capture()
        graph = recorder.graph
        if not graph.nodes:
            self._program = _Program(None, [], [], [], (), [], [], graph.index)
            return
        try:
            self._program, live = _captured(graph)
        except BaseException as error:  # (refused: the tensors it wrote get their old values)
            graph.abandon(error)
            raise
        _restore_overwritten(graph)
        _compile(self._program, bool(self._program.donated))  # (at capture, as CUDA's is)
        values = self._replay()
        for d, value in zip(live, values):  # the capture's own values, for whatever holds them
            d.value = value
        graph.state = fused._DONE
        graph._release()

    def _leave_capture(self) -> None:
        """This thread records as before the capture; host copies are seen again."""
        self._recorder = None
        context.recorder, context.capturing = self._saved, False
        for key, entry in self._host_copies.items():
            if entry[0]() is not None:
                host_copies.host_copies_by_id.setdefault(key, entry)
        self._host_copies = None

    def _abandon(self) -> None:
        """Leave a capture that raised: its recording is dropped."""
        recorder = self._recorder
        if recorder is not None:
            self._leave_capture()
            recorder.graph.abandon(RuntimeError("its capture raised"))

    # ------------------------------------------------------------------ replay
    def replay(self) -> None:
        """Run the captured region again on its tensors' current values."""
        if self._program is None:
            raise RuntimeError("replay() of a TPUGraph that was not captured")
        self._replay()

    def _replay(self) -> list:
        program = self._program
        if program.function is None:
            return []
        leaves = [_read(i) for i in program.inputs]
        donating = bool(program.donated) and all(sys.getrefcount(leaves[i]) <= 3 for i in program.donated)
        executable = program.executables.get(donating) or _compile(program, donating)
        fused.stats.replays += 1
        with fused.interrupts_held():
            values = fused._execute(executable, leaves)
            del leaves
            for holders, value in zip(program.holders, values):
                for ref in holders:
                    storage = ref()
                    if storage is not None:
                        buffer.put(storage, value)
        if program.summarized:
            values, flag = values[:-1], values[-1]
            _queue_checks(program, values, flag)
        elif program.checks:
            _queue_checks(program, values, None)
        else:
            checks.poll()  # (the checks of ops run before it report here, as at any op)
        return values

    def reset(self) -> None:
        """Forget the captured region (the next capture starts anew)."""
        self._program = None

    def pool(self) -> tuple[int, int]:
        return (0, id(self))  # (XLA owns its memory: a handle for APIs that pass one along)

    def enable_debug_mode(self) -> None:
        pass

    def debug_dump(self, path: str) -> None:
        program = self._program
        text = ""
        if program is not None and program.function is not None:
            text = jax.jit(program.function).lower(*program.specs).as_text()
        with open(path, "w") as f:
            f.write(text)

    @property
    def num_inputs(self) -> int:
        """How many tensors (and constants) the captured program reads (for tests and tools)."""
        return 0 if self._program is None else len(self._program.inputs)


# ----------------------------------------------------------------------------- capture's end
def _captured(graph: _CapturedGraph) -> tuple[_Program, list[Deferred]]:
    """The program of a captured graph: its inputs traced back to the storages they were read
    from, its live outputs (returned too) to the storages that hold them, its checks."""
    live, outputs = graph._live_outputs()
    read, held = {}, {id(d): [] for d in live}
    leaves = {id(leaf) for leaf in graph.leaves}
    for storage in buffer.live_storages():
        value = buffer.peek(storage)
        if type(value) is Deferred:
            if value.value is None:
                if id(value) in held:
                    held[id(value)].append(weakref.ref(storage))
                continue
            value = value.value
        elif type(value) is Padded:
            if id(value.array) in leaves:
                raise NotImplementedError(
                    "a tpu graph capture reading a tensor padded to a size bucket "
                    "(TORCH_TPU_BUCKETS=0 turns buckets off)"
                )
            continue
        read.setdefault(id(value), storage)
    for storage_ref, old in graph.undo:  # (overwritten by the graph: read as it was before)
        storage = storage_ref()
        if storage is not None and isinstance(old, jax.Array):
            read[id(old)] = storage
    inputs = [
        _Input(weakref.ref(read[id(leaf)]), None, aval[:2])
        if id(leaf) in read
        else _Input(None, leaf, aval[:2])
        for leaf, aval in zip(graph.leaves, graph.leaf_avals)
    ]
    overwritten = {id(old) for _, old in graph.undo}
    free = {(d.shape, d.dtype) for d in live}
    donated = tuple(
        i
        for i, leaf in enumerate(graph.leaves)
        if id(leaf) in overwritten and inputs[i].storage is not None and inputs[i].aval in free
    )
    captured_checks = _captured_checks(graph.checks, live)
    graph.checks = []
    graph.ending = True
    specs = [
        jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding, weak_type=aval[2])
        for leaf, aval in zip(graph.leaves, graph.leaf_avals)
    ]
    fused.stats.captures += 1
    summarized = [c for c in captured_checks if c.flags is not None]
    function = _summarizing(fused._program(graph.nodes, outputs), summarized)
    holders = [held[id(d)] for d in live]
    queued = [c for c in captured_checks if c.flags is None]
    reads = tuple(
        sorted({v for c in summarized for v in jax.tree_util.tree_leaves(c.values) if type(v) is int})
    )
    program = _Program(function, specs, inputs, holders, donated, queued, summarized, graph.index, reads)
    return program, live


def _captured_checks(recorded: list[checks.Check], live: list[Deferred]) -> list[_Check]:
    """The region's checks, their results as the program's output positions."""
    position = {id(d): i for i, d in enumerate(live)}

    def at(v: Any) -> Any:
        return position.get(id(v), v)

    return [
        _Check(
            jax.tree_util.tree_map(at, c.values),
            c.callback,
            c.origin,
            None if c.flags is None else [at(f) for f in c.flags],
        )
        for c in recorded
    ]


def _summarizing(function: Callable, summarized: list[_Check]) -> Callable:
    """``function`` with one more output where checks are summarized: whether any of their
    flags is set (``checks.Summary``)."""
    if not summarized:
        return function

    def run(*leaves):
        outputs = function(*leaves)
        flags = [
            jax.numpy.asarray(outputs[f] if type(f) is int else f, bool).reshape(())
            for c in summarized
            for f in c.flags
        ]
        return [*outputs, jax.numpy.any(jax.numpy.stack(flags))]

    return run


def _restore_overwritten(graph: _CapturedGraph) -> None:
    """Put back what the storages the capture wrote held before it (the first run reads them),
    and drop the graph's references to its inputs (held, none could be donated)."""
    for storage_ref, old in graph.undo:
        storage = storage_ref()
        if storage is not None:
            buffer.restore(storage, old)
    graph.leaves, graph.leaf_ids, graph.undo = [], {}, []


def _compile(program: _Program, donating: bool) -> Any:
    """The captured program's executable, donating its overwritten inputs or not."""
    jitted = jax.jit(program.function, donate_argnums=program.donated if donating else ())
    with jax.default_device(platform.jax_device(program.index)), compiling():
        executable = jitted.lower(*program.specs).compile(compiler.optimized())
    program.executables[donating] = executable
    return executable


def _read(source: _Input) -> jax.Array:
    if source.storage is None:
        return source.constant
    storage = source.storage()
    if storage is None:
        raise RuntimeError("a tensor a captured tpu graph reads has been freed: replay needs it alive")
    value = buffer.concrete(storage)
    shape, dtype = source.aval
    if value.shape != shape and value.dtype == dtype and value.size == math.prod(shape):
        value = _reshape(value, shape)  # (the same elements, written by an op of another shape)
        buffer.put(storage, value)
    if (value.shape, value.dtype) != source.aval:
        raise RuntimeError(
            f"a tensor a captured tpu graph reads changed from {source.aval[1]}{list(source.aval[0])} "
            f"to {value.dtype}{list(value.shape)}: replay reads the tensors the capture read, as they were"
        )
    return value


_reshape = jax.jit(jax.numpy.reshape, static_argnums=1)


def _queue_checks(program: _Program, values: list, flag: jax.Array | None) -> None:
    """Queue a replay's checks, tainting its outputs: those the program summed up in ``flag``
    as one ``checks.Summary``, the others one by one."""
    made = [c.made(values) for c in program.checks]
    if flag is not None:
        summarized = program.summarized
        results = {i: values[i] for i in program.summary_reads}  # (not the rest: a KV cache)
        made.append(checks.Summary(flag, lambda: [c.made(results) for c in summarized], summarized[0].origin))
    for check in made:
        checks.queue(check)
    checks.taint(values, made)
    checks.poll()


# ----------------------------------------------------------------------------- the interface
@contextlib.contextmanager
def graph(
    tpu_graph: TPUGraph, pool: Any = None, stream: Any = None, capture_error_mode: str = "global"
) -> Iterator[TPUGraph]:
    """Capture the block's tpu work into ``tpu_graph`` (``torch.cuda.graph``'s interface; the
    pool and stream are accepted and unused: XLA owns memory and orders work)."""
    tpu_graph.capture_begin(pool, capture_error_mode)
    try:
        yield tpu_graph
    except BaseException:
        tpu_graph._abandon()
        raise
    tpu_graph.capture_end()


def is_current_stream_capturing() -> bool:
    return context.capturing


def graph_pool_handle() -> tuple[int, int]:
    return (0, 0)
