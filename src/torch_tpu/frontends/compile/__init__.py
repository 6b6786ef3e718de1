"""``torch.compile(model, backend="tpu")``: Dynamo graphs compiled by XLA, not Inductor.

Dynamo captures FX graphs; AOTAutograd turns each into forward and backward graphs of ATen ops
(functional, with input mutations such as an optimizer's parameter updates kept in the graph);
:class:`~torch_tpu.frontends.compile.program.Program` traces each graph through the *same* lowerings as
eager into one ``jax.jit`` and calls the XLA executable from then on. Graph breaks work (each
piece is its own graph), and compiled graphs land in the same persistent cache as fused eager.

Shapes are static, as XLA's are: a new input shape compiles a new executable, logged with the
reason on the ``torch_tpu`` logger (and on stderr under ``TORCH_TPU_LOG_RECOMPILES=1``). A graph
Dynamo traced with symbolic sizes (``dynamic=None`` once a size changed, ``dynamic=True``) runs
through size buckets instead, one program per bucket (:meth:`Program._run_bucketed`;
``options={"bounded_dynamism": False}`` turns that off). :func:`pad_to_bucket` pads inputs to a
few sizes by hand.

PyTorch finds the backend through the ``torch_dynamo_backends`` entry point, so importing
torch_tpu does not import Dynamo.

Example::

    >>> import torch, torch_tpu
    >>> f = torch.compile(lambda x: (x.sin() * 2).sum(), backend="tpu")
    >>> round(f(torch.zeros(3, device="tpu")).item(), 4)
    0.0
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch._inductor.output_code import OutputCode

from ... import config
from ...execution import fused, modes
from ...runtime import compiler, dynamo, precision
from ...runtime.lru import Kind, caches
from . import stored
from .program import Program, tensor_text

__all__ = ["backend", "Program", "bucket_size", "pad_to_bucket"]

#: ``torch.compile`` modes: XLA always optimizes fully and each graph is already one launch (what
#: "reduce-overhead" gets from CUDA graphs), so every mode compiles the same way.
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class CompiledGraph(OutputCode):
    """One of AOTAutograd's graphs (forward, backward or inference) compiled for tpu, in the form
    PyTorch's AOTAutograd cache stores: it pickles as its graph (:meth:`Program.__reduce__`), so a
    later process reads AOTAutograd's work back instead of tracing the model again, and finds the
    executables in our own store (:mod:`.stored`)."""

    def __init__(self, program: Program, kind: str):
        self.program = program
        self.kind = kind
        # AOTAutograd's calling convention: one list of arguments, which the callee empties so
        # the caller's references (saved activations) die as early as possible. (Set on the
        # instance: the wrapper Dynamo puts around a backward copies only the instance's dict.)
        self._boxed_call = True

    def __call__(self, args: list) -> Any:
        values = list(args)
        args.clear()
        return self.program(*values)

    def prepare_for_serialization(self) -> None:
        """Nothing to drop: the program pickles without its executables."""

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        """Read back from AOTAutograd's cache: named after the Dynamo graph compiled now. (Read
        back with a precompiled function, ``torch.compiler.load_compiled_function``, outside any
        compile: it keeps the name it was saved with.)"""
        if _naming.name is not None:
            self.program.name = f"{_naming.name} ({self.kind})"


class _Naming(threading.local):
    #: the name of the Dynamo graph being compiled on this thread (None outside :func:`backend`)
    name: str | None = None


_naming = _Naming()


@contextlib.contextmanager
def _compiling(name: str) -> Iterator[None]:
    previous, _naming.name = _naming.name, name
    try:
        yield
    finally:
        _naming.name = previous


def _compiler(name: str, kind: str, bounded: bool, xla: dict) -> Callable:
    def compile_graph(graph_module: torch.fx.GraphModule, example_inputs) -> CompiledGraph:
        program = Program(graph_module, f"{name} ({kind})")
        program.bounded_dynamism = bounded
        program.compiler_options = xla
        return CompiledGraph(program, kind)

    if not config.cache_dir:  # no persistent cache: AOTAutograd's is not asked either
        return compile_graph
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    return SerializableAOTDispatchCompiler(CompiledGraph, compile_graph)


@contextlib.contextmanager
def _aot_cache(options: dict) -> Iterator[None]:
    """AOTAutograd's cache, set up for our graphs: entries that hold the graphs themselves
    ("bundled"; unbundled ones point into Inductor's FX graph cache), the backward compiled
    with the forward (so the entry is written while these settings hold), and keys that also
    cover what our programs depend on (:func:`cache_key`) and this call's compiler ``options``
    (an entry holds its programs with the options they were made with)."""
    tag = f"{torch.compiler.config.cache_key_tag}|{cache_key()}|{sorted(options.items())}"
    with (
        torch._functorch.config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True),
        torch.compiler.config.patch(cache_key_tag=tag),
    ):
        yield


def cache_key() -> str:
    """Ours in AOTAutograd's cache keys (PyTorch's covers the graph, the inputs' shapes, strides,
    dtypes, devices and requires_grad, grad mode, and its own versions and configs): torch_tpu's
    sources and versions (:func:`.stored.environment`), the float32 matmul precision, the tpu
    autocast state and the eager mode."""
    text = repr(
        (
            stored.environment(),
            precision.current(),
            compiler.token(),
            torch.is_autocast_enabled("tpu"),
            torch.get_autocast_dtype("tpu"),
            modes.get_eager_mode().value,
        )
    )
    return "torch_tpu " + hashlib.sha256(text.encode()).hexdigest()


# Dynamo frame id -> the placeholders (name, shape, dtype) of its last compiled graph
_last_inputs_by_frame = caches.lru("compile.last_inputs_by_frame", Kind.TRACES)


def _describe_inputs(graph_module: torch.fx.GraphModule) -> list:
    described = []
    for node in graph_module.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor):
            described.append((node.name, tensor_text(value.dtype, value.shape)))
        else:
            described.append((node.name, repr(value)))
    return described


def _graph_name(graph_module: torch.fx.GraphModule) -> str:
    """``frame 0/1``: the Dynamo frame and how many times it was compiled before; explains why a
    frame compiled again (:func:`torch_tpu.execution.fused.explain`)."""
    compile_id = torch._guards.CompileContext.current_compile_id()
    if compile_id is None:
        return "graph"
    frame, attempt = compile_id.frame_id, compile_id.frame_compile_id
    inputs = _describe_inputs(graph_module)
    previous = _last_inputs_by_frame.get(frame)
    _last_inputs_by_frame[frame] = inputs
    if attempt and previous is not None:
        before = dict(previous)
        change = next(
            (
                f"{name}: {before[name]} -> {now}"
                for name, now in inputs
                if name in before and before[name] != now
            ),
            f"inputs {[n for n, _ in previous]} -> {[n for n, _ in inputs]}",
        )
        fused.explain(f"Dynamo recompiles frame {frame} (compile {attempt}): {change}")
    return f"frame {frame}/{attempt}"


def backend(
    graph_module: torch.fx.GraphModule,
    example_inputs: list,
    *,
    mode: str | None = None,
    options: dict | None = None,
) -> Callable:
    """The Dynamo backend registered as ``"tpu"`` (``torch.compile(model, backend="tpu")``).

    ``mode`` is any of :data:`MODES` (all compile the same way). ``options`` takes
    ``{"bounded_dynamism": bool}`` (upstream TorchTPU's name; on by default where size buckets
    are, ``TORCH_TPU_BUCKETS``): a graph whose sizes Dynamo made symbolic runs through size
    buckets, one XLA program per bucket; off, it compiles per concrete size. Any other key is a
    ``torch.tpu.compiler`` option for this call's programs (``optimization_level``, an XLA
    debug option ``xla_...``), over the process's.
    """
    from torch._dynamo.backends.common import aot_autograd

    if mode is not None and mode not in MODES:
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: {', '.join(MODES)}")
    bounded, xla = _split_options(options or {})
    dynamo.refresh()  # (this module and the program's loaded after the device started)
    name = _graph_name(graph_module)
    compile_graphs = aot_autograd(
        fw_compiler=_compiler(name, "forward", bounded, xla),
        bw_compiler=_compiler(name, "backward", bounded, xla),
        inference_compiler=_compiler(name, "inference", bounded, xla),
        keep_inference_input_mutations=True,
    )
    with _compiling(name), _aot_cache(xla) if config.cache_dir else contextlib.nullcontext():
        return compile_graphs(graph_module, example_inputs)


#: ``torch.compile(backend="tpu", options=...)`` keys, with their defaults
OPTIONS = {"bounded_dynamism": True}


def _split_options(options: dict) -> tuple[bool, dict]:
    """``bounded_dynamism``, and the call's ``torch.tpu.compiler`` options (checked)."""
    xla = {k: v for k, v in options.items() if k not in OPTIONS}
    unknown = sorted(k for k in xla if not compiler.is_option(k))
    if unknown:
        raise RuntimeError(
            f"torch.compile(backend='tpu') got unknown options {unknown}; it takes "
            f"{sorted(OPTIONS)} and torch.tpu.compiler's options: {compiler.known_names()}"
        )
    try:
        compiler.check(xla, per_call=True)
    except ValueError as error:
        raise RuntimeError(f"torch.compile(backend='tpu'): {error}") from None
    bounded = options.get("bounded_dynamism", OPTIONS["bounded_dynamism"])
    if not isinstance(bounded, bool):
        raise TypeError(f"options['bounded_dynamism'] must be a bool, got {type(bounded).__name__}")
    return bounded, xla


# ----------------------------------------------------------------------------- static shapes
def bucket_size(length: int, buckets: Sequence[int] | None = None, multiple: int = 64) -> int:
    """The size to pad ``length`` to: the smallest of ``buckets`` that fits, else the next
    multiple of ``multiple``. Few distinct sizes mean few compiled executables.

    Example::

        >>> from torch_tpu.frontends.compile import bucket_size
        >>> bucket_size(100), bucket_size(100, buckets=(128, 256, 512)), bucket_size(600, (128, 256))
        (128, 128, 640)
    """
    if length < 0:
        raise ValueError(f"length must be non-negative, got {length}")
    for size in sorted(buckets or ()):
        if length <= size:
            return size
    return -(-length // multiple) * multiple if length else multiple


def pad_to_bucket(
    tensor: torch.Tensor,
    dim: int = -1,
    buckets: Sequence[int] | None = None,
    multiple: int = 64,
    value: float = 0,
) -> torch.Tensor:
    """``tensor`` padded with ``value`` at the end of ``dim`` up to :func:`bucket_size`, so a
    compiled model sees a few shapes instead of one per sequence length. Pad the attention mask
    with 0 (and labels with -100) so the padding changes no result.

    Example::

        >>> import torch
        >>> from torch_tpu.frontends.compile import pad_to_bucket
        >>> ids = torch.ones(2, 100, dtype=torch.long)
        >>> pad_to_bucket(ids, buckets=(128, 256)).shape
        torch.Size([2, 128])
        >>> mask = pad_to_bucket(torch.ones(2, 100, dtype=torch.long), buckets=(128, 256), value=0)
        >>> int(mask.sum())
        200
    """
    dim = dim % tensor.dim()
    missing = bucket_size(tensor.shape[dim], buckets, multiple) - tensor.shape[dim]
    if not missing:
        return tensor
    pad = [0, 0] * (tensor.dim() - 1 - dim) + [0, missing]
    return torch.nn.functional.pad(tensor, pad, value=value)
