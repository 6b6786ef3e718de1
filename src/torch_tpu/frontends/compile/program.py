"""An FX graph of ATen ops as XLA executables: the eager lowerings traced into one ``jax.jit``.

:class:`Program` interprets the graph node by node through the same dispatcher and lowerings as
eager, on tpu tensors whose storages hold JAX tracers (:mod:`torch_tpu.execution.tracing`), so ``jax.jit``
sees the whole graph as one computation. Each input layout (the arguments' shapes, strides,
dtypes and which of them share a storage) is traced and compiled once; later calls with that
layout run the executable directly.

Inputs travel as their storages' values and are rebuilt inside the trace with their exact
geometry, so ``as_strided`` and views over shared storage mean what they meant when Dynamo traced
them. Outputs come back as storages too: an output over a new storage gets that storage, one that
aliases an input is a view of the real input, and inputs the graph writes (an optimizer's
parameters and state, when AOTAutograd keeps the mutation in the graph) have their new values
stored back, their old buffers donated to XLA so the update does not hold two copies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import numpy as np
import torch
from jax.extend.core import jaxpr_as_fun

from ... import config
from ...distributed import traced as collectives
from ...execution import fused, modes, tracing
from ...runtime import buffer, checks, compiler, memory, precision, random, tensor, transfer
from ...runtime.context import compiling, context
from ...runtime.flags import flags
from ...runtime.lru import LRU
from . import stored
from .symbolic import Symbolic

_TPU, _HOST, _CONST = range(3)
_FRESH, _INPUT = range(2)


@functools.cache
def _unused_key() -> jax.Array:
    """The key data of programs that draw no random numbers (calling them leaves the generator
    be): ``key(0)``'s, [0, 0], put on the device without compiling JAX's seeding program."""
    return jax.device_put(np.zeros(2, np.uint32))


class _Output(NamedTuple):
    kind: int  # _FRESH (a storage the program returns) or _INPUT (an input's)
    storage: int  # which one
    shape: tuple
    strides: tuple
    offset: int
    dtype: torch.dtype
    host: bool  # the graph computed it for the CPU (moved there after the call)


class _Traced:
    """What the trace of one layout found out: the outputs' structure, which inputs the graph
    wrote, the checks to report after each call, and whether it draws random numbers."""

    def __init__(self) -> None:
        self.outputs: list = []  # _Output, or a constant (None, an int...)
        self.written: tuple[int, ...] = ()
        self.checks: list[tuple[Callable, str]] = []
        self.random = False
        self.spmd: collectives.Spmd | None = None  # the program of a graph with collectives


class _Trace(NamedTuple):
    staged: jax.stages.Traced | None  # the graph traced for one layout (None: read from disk)
    traced: _Traced
    stored: str | None  # its key in the on-disk cache (:mod:`.stored`), None if not storable


class _Executable(NamedTuple):
    run: Callable
    traced: _Traced


#: Views whose strides a graph may have taken from another backend's kernels (torch.export on
#: CPU drops ``.contiguous()`` after an attention whose CPU output is already laid out that way).
#: The graphs are functional, so a view only needs its values: reshape gives them, copying only
#: when the tpu layout is not viewable.
_VALUE_SEMANTICS = {
    torch.ops.aten.view.default: torch.ops.aten.reshape.default,
    torch.ops.aten._unsafe_view.default: torch.ops.aten.reshape.default,
}


def _host_device(value: Any) -> Any:
    """Inside a trace every value lives on the device: a CPU device argument becomes the
    program's tpu device."""
    if isinstance(value, torch.device) and value.type == "cpu":
        return torch.device("tpu", context.index)
    return value


@contextlib.contextmanager
def _program_device(index: int) -> Iterator[None]:
    """Inside the trace, values made from no input (factories) belong to ``tpu:index``."""
    previous, context.index = context.index, index
    try:
        yield
    finally:
        context.index = previous


def _program_index(args: tuple) -> int:
    """The tpu index a program runs on: its tpu inputs' (JAX refuses two devices), else the
    current device."""
    for a in args:
        if isinstance(a, torch.Tensor) and not a.is_cpu:
            return a.get_device()
    return torch.accelerator.current_device_index()


@contextlib.contextmanager
def traced_ops(key: jax.Array) -> Iterator[tracing.Trace]:
    """Run tpu ops on traced values: each op goes straight through its lowering (not recorded by
    fused eager, not differentiated again, no autocast on top of what the graph already casts)."""
    with tracing.tracing(key) as trace, torch.no_grad(), torch.autocast("tpu", enabled=False):
        yield trace


class Interpreter(torch.fx.Interpreter):
    """Runs each node through the eager kernels and names the node in any error: on traced
    values into one program (``trace``), or on real tensors through fused eager's bucketed
    programs (``padded``: per node, the dims of its value to pad, with their bounds)."""

    def __init__(
        self,
        graph_module: torch.fx.GraphModule,
        trace: tracing.Trace | None,
        padded: dict[str, tuple] | None = None,
    ):
        super().__init__(graph_module, garbage_collect_values=True)
        self.trace = trace
        self.padded = padded or {}

    def call_function(self, target, args, kwargs):
        target = _VALUE_SEMANTICS.get(target, target)
        if self.trace is None:  # (real tensors: CPU ones stay where the graph computed them)
            return target(*args, **kwargs)
        args, kwargs = torch.utils._pytree.tree_map(_host_device, (args, kwargs))
        if collectives.is_collective(target):
            target = collectives.lowering(target)
        try:
            return target(*args, **kwargs)
        except tracing.NEEDS_VALUES as error:
            raise NotImplementedError(
                f"{target} needs its inputs' values on the host (an output shape that depends "
                "on data, or a host-side check), which one compiled tpu graph cannot do. Break "
                "the graph before it (torch._dynamo.graph_break()) or run this part eagerly."
            ) from error

    def run_node(self, node: torch.fx.Node) -> Any:
        if self.trace is not None:
            self.trace.origin = f"{node.target} ({_source_line(node)})"
        context.symbolic_dims = self.padded.get(node.name, ())
        try:
            return super().run_node(node)
        except Exception as error:  # noqa: BLE001  (same error, with the node that raised it)
            if not getattr(error, "_tpu_node_noted", False):
                error.add_note(
                    f"[torch_tpu] while {'tracing' if self.trace else 'running'} "
                    f"{node.format_node()} for a compiled tpu graph ({_source_line(node)})"
                )
                error._tpu_node_noted = True
            raise
        finally:
            context.symbolic_dims = None


def _source_line(node: torch.fx.Node) -> str:
    """Where the node came from: the user's line if Dynamo kept it, else the module it ran in."""
    trace = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip().startswith("File")]
    if lines:
        return lines[-1]
    modules = node.meta.get("nn_module_stack")
    if modules:
        path, kind = list(modules.values())[-1]
        return f"in {getattr(kind, '__name__', kind)} {path}"
    return "source unknown"


def _meta_device_is_host(node_value: Any) -> bool:
    return isinstance(node_value, torch.Tensor) and node_value.device.type == "cpu"


class Program:
    """``graph_module`` (ATen ops, functional or with input mutations) compiled for tpu.

    Called with the graph's inputs (tpu or CPU tensors, Python numbers); returns its outputs as
    tpu tensors (CPU where the graph computed a CPU tensor).
    """

    def __init__(
        self,
        graph_module: torch.fx.GraphModule,
        name: str = "graph",
        host_outputs: list | None = None,
        symbolic: Symbolic | None = None,
    ):
        self.graph_module = graph_module
        self.name = name
        #: run symbolic sizes through size buckets (``options={"bounded_dynamism": False}``: not)
        self.bounded_dynamism = True
        #: this program's torch.tpu.compiler options (``torch.compile``'s ``options=``)
        self.compiler_options: dict = {}
        self._traces = LRU()  # (layout, matmul precision) -> _Trace
        self._executables = LRU()  # (layout, matmul precision), donated inputs -> _Executable
        self._last_layout: tuple | None = None
        outputs = next(n for n in graph_module.graph.nodes if n.op == "output").args[0]
        if host_outputs is None:
            host_outputs = [
                _meta_device_is_host(getattr(o, "meta", {}).get("val"))
                for o in torch.utils._pytree.tree_leaves(outputs)
            ]
        self._host_outputs = host_outputs
        self._out_tree = torch.utils._pytree.tree_structure(outputs)
        self._collectives = any(collectives.is_collective(n.target) for n in graph_module.graph.nodes)
        self.symbolic = Symbolic.of(graph_module) if symbolic is None else symbolic
        written = {n.args[0] for n in graph_module.graph.nodes if n.target is torch.ops.aten.copy_.default}
        placeholders = graph_module.graph.find_nodes(op="placeholder")
        self._inputs = [n.name for n in placeholders]
        #: the same, None for those the graph writes (their tensors stay the caller's)
        self._paddable = [None if n in written else n.name for n in placeholders]

    def __reduce__(self) -> tuple:
        """Pickled as its graph (PyTorch's AOTAutograd cache stores it), node for node: the
        executables are not, a process finds them in :mod:`.stored` under the graph's code."""
        state = (self.name, self._host_outputs, self.symbolic, self.bounded_dynamism, self.compiler_options)
        return _unpickle, (*_graph_state(self.graph_module), *state)

    @property
    def bucketed(self) -> bool:
        """Whether calls run through size buckets (:meth:`_run_bucketed`): Dynamo made some of
        the graph's sizes symbolic (``dynamic=None`` after a size changed, ``dynamic=True``,
        ``mark_dynamic``), buckets are on, and the graph has no collectives."""
        return bool(self.symbolic) and self.bounded_dynamism and config.buckets and not self._collectives

    # ------------------------------------------------------------------ inputs
    def _gather(self, args) -> tuple[tuple, list, list]:
        """The call's layout and device (the compile key), the storage values to pass, and the
        storages (tpu) or host tensors (CPU) they came from."""
        device = _program_index(args) if flags.others_used else 0
        layout = []
        avals = []
        values: list = []
        sources: list = []
        seen: dict[int, int] = {}
        for a in args:  # (the per-call hot path: cheap flags and attributes only)
            if isinstance(a, torch.Tensor):
                if not a.is_cpu:
                    storage = a.untyped_storage()
                    index = seen.get(storage._cdata)
                    if index is None:
                        index = seen[storage._cdata] = len(values)
                        value = buffer.concrete(storage)
                        avals.append((value.shape, value.dtype, value.weak_type))
                        values.append(value)
                        sources.append(storage)
                    layout.append(
                        (
                            _TPU,
                            index,
                            a.shape,
                            a.stride(),
                            a.storage_offset(),
                            a.dtype,
                            a.is_conj(),
                            a.is_neg(),
                        )
                    )
                else:
                    value = transfer.to_device(a, device)
                    layout.append((_HOST, len(values), a.shape, a.dtype))
                    avals.append((value.shape, value.dtype, value.weak_type))
                    values.append(value)
                    sources.append(a)
            else:
                layout.append((_CONST, a))
        return (tuple(layout), tuple(avals), device), values, sources

    # ------------------------------------------------------------------ tracing
    def _traceable(self, layout: tuple, traced: _Traced, device: int) -> Callable:
        """The graph as a function of (random key data, storage values) for ``jax.jit`` on
        ``tpu:device``; tracing it fills in ``traced``."""

        def program(key_data, *values):
            with traced_ops(jax.random.wrap_key_data(key_data)) as trace, _program_device(device):
                storages = [tensor.wrap(v).untyped_storage() for v in values]
                results = Interpreter(self.graph_module, trace).run(*_arguments(layout, storages))
                traced.outputs, fresh = _outputs(
                    torch.utils._pytree.tree_leaves(results), self._host_outputs, storages
                )
                traced.written = tuple(
                    i for i, (s, v) in enumerate(zip(storages, values)) if buffer.get(s) is not v
                )
                written = [buffer.get_array(storages[i]) for i in traced.written]
                traced.checks = [(callback, origin) for _, callback, origin in trace.checks]
                traced.random = trace.draws > 0
                return fresh, written, [results for results, _, _ in trace.checks]

        return program

    def _trace(self, key: tuple, values: list, args: tuple) -> _Trace:
        """What the graph does for this layout: read from the disk cache if a process stored
        it, else traced once (Python through the lowerings); each donation variant is then
        compiled from that one trace."""
        if self._last_layout is not None:
            why = (
                "torch.set_float32_matmul_precision changed"
                if self._last_layout == key
                else _layout_change(self._last_layout, key)
            )
            fused.explain(f"recompiling compiled graph {self.name}: {why}")
        self._last_layout = key
        # (a program with collectives is one process's part of a multi-process program: not stored)
        graph = (
            None
            if self._collectives
            else stored.key(self.graph_module, self._host_outputs, key, args, precision.current())
        )
        findings = stored.load_findings(graph)
        if findings is not None:
            return _Trace(None, _from_findings(findings), graph)
        trace = self._staged(key, values, graph)
        if not trace.traced.checks:  # (a check's callback is a closure over this trace: traced again)
            stored.save_findings(graph, _findings(trace.traced))
        return trace

    def _staged(self, key: tuple, values: list, graph: str | None) -> _Trace:
        started = time.perf_counter()
        traced = _Traced()
        program = self._traceable(key[0], traced, key[2])
        args = [_unused_key(), *values]
        if self._collectives:
            traced.spmd = collectives.Spmd(
                collectives.graph_group(self.graph_module), self.name, self.graph_module.code, key[1]
            )
            program, args = traced.spmd.wrap(program, args), traced.spmd.arguments(args)
        with precision.current_scope():
            staged = jax.jit(program).trace(*args)
        fused.stats.compile_seconds += time.perf_counter() - started
        return _Trace(staged, traced, graph)

    def _compile(
        self, traced_key: tuple, trace: _Trace, values: list, donated: tuple[int, ...]
    ) -> _Executable:
        chosen = compiler.program_options(self.compiler_options)  # (the user's: stored apart)
        run = stored.load_executable(trace.stored, donated, traced_key[0][2], chosen)
        if run is None:
            if trace.staged is None:  # the findings were stored, this variant was not
                trace = self._traces[traced_key] = self._staged(traced_key[0], values, trace.stored)
            started = time.perf_counter()
            with precision.current_scope(), stored.compiling(trace.stored) as compiled:
                args = [_unused_key(), *values]
                args = trace.traced.spmd.arguments(args) if trace.traced.spmd else args
                lowered = _lower(trace.staged, args, donated)
                with compiling():
                    run = lowered.compile(compiler.optimized(self.compiler_options))
            fused.stats.compile_seconds += time.perf_counter() - started
            if compiled():
                stored.save_executable(trace.stored, donated, run, chosen)
        fused.stats.compiled_graphs += 1
        return _Executable(run, trace.traced)

    # ------------------------------------------------------------------ calls
    def __call__(self, *args: Any) -> Any:
        if self.bucketed:
            return self._run_bucketed(args)
        if context.capturing:
            return self._run_captured(args)
        key, values, sources = self._gather(args)
        traced_key = (key, precision.current())  # a program is built for one matmul setting
        trace = self._traces.get(traced_key)
        if trace is None:
            trace = self._traces[traced_key] = self._trace(key, values, args)
        traced = trace.traced
        donated = _donatable(values, traced.written)
        compiled_as = (traced_key, donated, compiler.token())
        executable = self._executables.get(compiled_as)
        if executable is None:
            executable = self._executables[compiled_as] = self._compile(traced_key, trace, values, donated)
        fused.stats.donated_buffers += len(donated)
        # The random key as raw key data, not a typed key: an executable read back from the
        # store carries its argument types unpickled, and a typed key's copy of the PRNG
        # implementation would then reach later keys, which ``jax.random.poisson`` refuses as
        # "not threefry" (it checks the implementation's identity)
        random_key = jax.device_put(random.next_key_data(key[2])) if traced.random else _unused_key()
        fused.stats.compiled_runs += 1
        inherited = checks.inherited(values)
        with fused.interrupts_held():  # the written inputs get their new values, whatever comes
            try:
                if traced.spmd is None:
                    fresh, written, results = executable.run(random_key, *values)
                else:  # (every rank calls it: one collective of the group)
                    fresh, written, results = traced.spmd.call(executable.run, [random_key, *values])
            except Exception as error:
                translated = memory.translate(error)
                if translated is error:
                    raise
                raise translated from error
            del values
            for index, value in zip(traced.written, written):
                _store(sources[index], value)
        if context.launch_blocking:  # debug eager: an execution error surfaces at this call
            jax.block_until_ready((fresh, written))
        program_checks = [
            checks.deferred(result, callback, f"{origin} in compiled graph {self.name}")
            for result, (callback, origin) in zip(results, traced.checks)
        ]
        checks.taint([*fresh, *written], (*program_checks, *inherited))
        if program_checks and context.launch_blocking:
            checks.report(program_checks, "at the call (TPU_LAUNCH_BLOCKING=1)")
        return torch.utils._pytree.tree_unflatten(
            [_output(o, fresh, sources) for o in traced.outputs], self._out_tree
        )

    def _run_bucketed(self, args: tuple) -> Any:
        """The graph run node by node on the real tensors in fused eager, padded to size
        buckets along its symbolic dimensions: one XLA program per bucket serves every size in
        it, at the cost of recording the graph's ops on each call (fused eager's host cost)."""
        if self._last_layout is None:
            self._last_layout = ()
            fused.explain(f"compiled graph {self.name} has symbolic sizes: it runs through size buckets")
        fused.stats.compiled_runs += 1
        self.symbolic.learn(self._inputs, args)
        args = self.symbolic.padded_inputs(self._paddable, args)
        recording = contextlib.nullcontext() if fused.active() else modes.eager_mode("fused")
        with recording, torch.no_grad(), torch.autocast("tpu", enabled=False):
            return Interpreter(self.graph_module, None, self.symbolic.padded_dims()).run(*args)

    def _run_captured(self, args: tuple) -> Any:
        """The graph's ops recorded, node by node, into the tpu graph being captured
        (``torch.tpu.graph``): the captured region becomes one program, this graph inside it."""
        fused.stats.compiled_runs += 1
        with torch.no_grad(), torch.autocast("tpu", enabled=False):
            return Interpreter(self.graph_module, None).run(*args)

    def stablehlo(self, *args: Any) -> str:
        """StableHLO text of this graph for these arguments (traced, not run)."""
        key, values, _ = self._gather(args)
        program = self._traceable(key[0], _Traced(), key[2])
        with precision.current_scope():
            return jax.jit(program).lower(_unused_key(), *values).as_text()


@dataclasses.dataclass(frozen=True)
class _Ref:
    """A node's argument that is an earlier node (by position), in a pickled graph. (Not a
    tuple: ``map_aggregate`` would take it apart.)"""

    position: int


class _Op(NamedTuple):
    """An operator target in a pickled graph, by name (operators do not pickle)."""

    name: str  # "aten::add.Tensor", "aten::sum" (default overload), "run_and_save_rng_state"


def _graph_state(graph_module: torch.fx.GraphModule) -> tuple[list, dict]:
    """The graph as picklable data: each node's op, name, target, arguments and source line, and
    the attributes the graph reads. (``GraphModule`` pickles as its code, which is traced again
    on loading: factory calls then become constants, and the graph, its code and its key in
    :mod:`.stored` differ from the process that compiled it.)"""
    position: dict[torch.fx.Node, int] = {}
    nodes = []
    for node in graph_module.graph.nodes:
        target = node.target
        if isinstance(target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
            target = _Op(target.name())
        arguments = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _Ref(position[n]))
        nodes.append((node.op, node.name, target, arguments, node.meta.get("stack_trace")))
        position[node] = len(position)
    attributes = {}
    for node in graph_module.graph.find_nodes(op="get_attr"):
        value = graph_module
        for name in node.target.split("."):
            value = getattr(value, name)
        attributes[node.target] = value
    return nodes, attributes


def _operator(op: _Op) -> Callable:
    namespace, _, name = op.name.rpartition("::")
    if not namespace:
        return getattr(torch.ops.higher_order, name)
    packet, _, overload = name.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


def _unpickle(
    nodes: list,
    attributes: dict,
    name: str,
    host_outputs: list,
    symbolic: Symbolic | None = None,
    bounded_dynamism: bool = True,
    compiler_options: dict | None = None,
) -> Program:
    graph = torch.fx.Graph()
    made: list[torch.fx.Node] = []
    for op, node_name, target, arguments, stack_trace in nodes:
        args, kwargs = torch.fx.node.map_aggregate(
            arguments, lambda a: made[a.position] if isinstance(a, _Ref) else a
        )
        target = _operator(target) if isinstance(target, _Op) else target
        node = graph.create_node(op, target, tuple(args), dict(kwargs), name=node_name)
        if stack_trace:
            node.meta["stack_trace"] = stack_trace
        made.append(node)
    program = Program(
        torch.fx.GraphModule(attributes, graph), name, host_outputs, symbolic or Symbolic({}, {}, True)
    )
    program.bounded_dynamism = bounded_dynamism
    program.compiler_options = compiler_options or {}
    return program


def _lower(staged: jax.stages.Traced, args: list, donated: tuple[int, ...]) -> jax.stages.Lowered:
    """The traced graph lowered with ``donated`` inputs' buffers given to XLA (``args``: the
    key and the storage values); a donating variant is rebuilt from the trace's jaxpr, not by
    tracing the graph again."""
    if not donated:
        return staged.lower()
    flat, out_tree = jaxpr_as_fun(staged.jaxpr), staged.out_tree

    def program(*args):
        return jax.tree.unflatten(out_tree, flat(*args))

    # positions shift by one: the key is the program's first argument
    return jax.jit(program, donate_argnums=tuple(i + 1 for i in donated)).lower(*args)


def _findings(traced: _Traced) -> tuple:
    """What a trace found out, to store (only for graphs without value checks: a check's
    callback is a closure over its trace)."""
    return traced.outputs, traced.written, traced.random


def _from_findings(findings: tuple) -> _Traced:
    traced = _Traced()
    traced.outputs, traced.written, traced.random = findings
    return traced


def _arguments(layout: tuple, storages: list) -> list:
    """The graph's arguments inside the trace: tensors over the traced storages with the
    geometry (and lazy conjugate/negative bits) the real arguments had, constants as they were."""
    args = []
    for spec in layout:
        if spec[0] == _TPU:
            _, index, shape, strides, offset, dtype, conj, neg = spec
            t = tensor.over_storage(storages[index], shape, strides, offset, dtype)
            t = t.conj() if conj else t
            args.append(t._neg_view() if neg else t)
        elif spec[0] == _HOST:
            _, index, shape, dtype = spec
            strides = tensor.row_major_strides(shape)
            args.append(tensor.over_storage(storages[index], shape, strides, 0, dtype))
        else:
            args.append(spec[1])
    return args


def _outputs(flat: list, host_outputs: list, storages: list) -> tuple[list, list]:
    """How to rebuild each output after the call (:class:`_Output`, or a constant), and the
    values of the new storages the outputs live in (one per storage, however many views)."""
    inputs = {s._cdata: i for i, s in enumerate(storages)}
    fresh: dict[int, int] = {}
    values, specs = [], []
    for out, host in zip(flat, host_outputs):
        if not isinstance(out, torch.Tensor):
            specs.append(out)
            continue
        out = out.resolve_conj().resolve_neg()
        storage = out.untyped_storage()
        if storage._cdata in inputs and not host:
            kind, index = _INPUT, inputs[storage._cdata]
        else:
            kind, index = _FRESH, fresh.get(storage._cdata)
            if index is None:
                index = fresh[storage._cdata] = len(values)
                values.append(buffer.get_array(storage))
        specs.append(
            _Output(kind, index, tuple(out.shape), out.stride(), out.storage_offset(), out.dtype, host)
        )
    return specs, values


#: References to a storage value while a program is called: the storage's attribute, the list
#: of values passed, and ``sys.getrefcount``'s own argument.
_HELD_ONLY_BY_ITS_STORAGE = 3


def _donatable(values: list, written: tuple[int, ...]) -> tuple[int, ...]:
    """The written inputs whose buffers nothing but their own storage holds: their storage gets
    the new value right after the call, so XLA may update the old buffer in place. A buffer
    another storage shares (``a.copy_(b)`` can make two storages hold one array) is kept."""
    return tuple(i for i in written if sys.getrefcount(values[i]) == _HELD_ONLY_BY_ITS_STORAGE)


def _store(source: Any, value: jax.Array) -> None:
    """An input's new value after the program wrote it: into its storage, or back to the host."""
    if isinstance(source, torch.Tensor):  # a CPU input (e.g. a non-capturable optimizer step)
        source.copy_(transfer.to_host(value).view(source.dtype).reshape(source.shape))
        return
    buffer.put(source, value)
    tensor.ensure_storage_nbytes(source)


def _output(spec: Any, fresh: list, sources: list) -> Any:
    if not isinstance(spec, _Output):
        return spec
    if spec.kind == _INPUT:
        storage = sources[spec.storage]
    else:
        storage = fresh[spec.storage]
        if isinstance(storage, jax.Array):  # the first output over this new storage makes it
            storage = fresh[spec.storage] = tensor.wrap(storage).untyped_storage()
    output = tensor.over_storage(storage, spec.shape, spec.strides, spec.offset, spec.dtype)
    return output.cpu() if spec.host else output


def _layout_change(old: tuple, new: tuple) -> str:
    """Which argument made a new layout differ from the previous one."""
    (old_layout, old_avals, old_device), (new_layout, new_avals, new_device) = old, new
    if old_device != new_device:
        return f"its inputs moved from tpu:{old_device} to tpu:{new_device}"
    for i, (a, b) in enumerate(zip(old_layout, new_layout)):
        if a != b:
            return f"argument {i} changed from {_describe(a)} to {_describe(b)}"
    for i, (a, b) in enumerate(zip(old_avals, new_avals)):
        if a != b:
            return f"storage {i} changed from {a[1]}{list(a[0])} to {b[1]}{list(b[0])}"
    return "inputs that could be donated before cannot be now (or the reverse)"


def tensor_text(dtype: torch.dtype, shape) -> str:
    """``float32[2, 8]``: how recompile explanations name a tensor."""
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"


def _describe(spec: tuple) -> str:
    if spec[0] == _CONST:
        return repr(spec[1])
    if spec[0] == _HOST:
        return f"a CPU tensor {tensor_text(spec[3], spec[2])}"
    _, _, shape, strides, offset, dtype, _, _ = spec
    return f"{tensor_text(dtype, shape)} (strides {list(strides)}, offset {offset})"
