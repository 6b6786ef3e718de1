"""The sizes Dynamo made symbolic in a compiled graph, and which of them run through size buckets.

A graph traced with symbolic sizes (``dynamic=None`` once a size changed, ``dynamic=True``,
``mark_dynamic``) runs node by node in fused eager (:meth:`.program.Program._run_bucketed`),
its values padded along the dimensions whose size is dynamic, so one XLA program per bucket
serves every size in it. A size is dynamic when its symbol is: under Dynamo's automatic dynamic
shapes (the default) every symbol is, since Dynamo makes a size symbolic only once it changed
or was marked; under ``dynamic=True`` (every size symbolic), once the graph saw it take two
values, so a batch size that never changes is not padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from ...runtime import buffer, padding, tensor
from ...runtime.dtypes import JAX_TO_TORCH


class SymbolicDim(NamedTuple):
    """One dimension of a node's value whose size is symbolic."""

    dim: int
    bound: int | None  # the largest size it may take (``mark_dynamic(x, d, max=...)``), or None
    symbols: frozenset[str]  # the symbols of its size ("s0"; "s0" and "s1" for s0 * s1)
    exact: str | None  # the symbol the size is ("s0"), None for an expression


class Symbolic:
    """A graph's symbolic sizes: per node, its symbolic dims; per input, which symbol each of
    its sizes (or a number input) is; and which symbols are dynamic so far."""

    def __init__(self, dims: dict[str, tuple[SymbolicDim, ...]], numbers: dict[str, str], automatic: bool):
        self.dims = dims  # node name -> its symbolic dims
        self.numbers = numbers  # placeholder name -> the symbol it is (a SymInt input)
        self.automatic = automatic  # every symbol is dynamic (Dynamo's automatic dynamic shapes)
        self.first: dict[str, int] = {}  # symbol -> the first value the graph saw
        self.dynamic: frozenset[str] = frozenset()  # symbols seen to change
        self._padded: dict[frozenset, dict] = {}  # dynamic symbols -> per node (dim, bound)s

    @classmethod
    def of(cls, graph_module: torch.fx.GraphModule) -> Symbolic:
        dims, numbers = {}, {}
        for node in graph_module.graph.nodes:
            value = node.meta.get("val", node.meta.get("example_value"))
            if isinstance(value, torch.SymInt) and node.op == "placeholder":
                numbers[node.name] = str(value.node.expr)
            elif isinstance(value, torch.Tensor):
                symbolic = tuple(_dim(d, n) for d, n in enumerate(value.shape) if isinstance(n, torch.SymInt))
                if symbolic:
                    dims[node.name] = symbolic
        return cls(dims, numbers, automatic=torch._dynamo.config.assume_static_by_default)

    def __bool__(self) -> bool:
        return bool(self.dims or self.numbers)

    def __getstate__(self) -> dict:
        return {"dims": self.dims, "numbers": self.numbers, "automatic": self.automatic}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["dims"], state["numbers"], state["automatic"])

    def learn(self, names: Sequence[str], args: Sequence[Any]) -> None:
        """Note the values the inputs give the symbols; a symbol seen to change is dynamic."""
        if self.automatic:
            return
        changed = set()
        for name, arg in zip(names, args):
            for symbol, value in self._values(name, arg):
                if value is None or self.first.setdefault(symbol, value) != value:
                    changed.add(symbol)
        if not changed <= self.dynamic:
            self.dynamic = self.dynamic | changed

    def _values(self, name: str, arg: Any) -> list[tuple[str, int | None]]:
        """The (symbol, value) pairs an input gives; a dim marked dynamic (``mark_dynamic``,
        ``maybe_mark_dynamic``) gives None, a value no size equals: dynamic at once."""
        if name in self.numbers:
            return [(self.numbers[name], int(arg))]
        if not isinstance(arg, torch.Tensor):
            return []
        marked = _marked_dynamic(arg)
        return [
            (d.exact, None if d.dim in marked else arg.shape[d.dim])
            for d in self.dims.get(name, ())
            if d.exact is not None
        ]

    def padded_dims(self) -> dict[str, tuple[tuple[int, int | None], ...]]:
        """Per node, the dims to pad now ((dim, bound) each: :func:`padding.symbolic_layout`)."""
        dynamic = None if self.automatic else self.dynamic
        padded = self._padded.get(dynamic)
        if padded is None:
            padded = self._padded[dynamic] = {
                name: tuple((d.dim, d.bound) for d in dims if dynamic is None or d.symbols & dynamic)
                for name, dims in self.dims.items()
            }
        return padded

    def padded_inputs(self, names: Sequence[str | None], args: Sequence[Any]) -> list:
        """The inputs, those not yet padded along their dynamic dims padded (``names``: None
        for an input the graph writes, which stays the caller's tensor)."""
        padded = self.padded_dims()
        return [
            arg if name is None else _padded_input(arg, padded.get(name, ()))
            for name, arg in zip(names, args)
        ]


def _marked_dynamic(t: torch.Tensor) -> set[int]:
    """The dims of ``t`` marked dynamic for Dynamo (strongly or weakly)."""
    return getattr(t, "_dynamo_dynamic_indices", set()) | getattr(t, "_dynamo_weak_dynamic_indices", set())


def _dim(d: int, size: torch.SymInt) -> SymbolicDim:
    expr = size.node.expr
    return SymbolicDim(
        d,
        _upper_bound(size),
        frozenset(str(s) for s in expr.free_symbols),
        str(expr) if expr.is_Symbol else None,
    )


def _upper_bound(size: torch.SymInt) -> int | None:
    """The largest value Dynamo allows a symbolic size (None: unbounded or not known)."""
    try:
        upper = size.node.shape_env.bound_sympy(size.node.expr).upper
        return int(upper) if upper.is_integer and upper.is_finite else None
    except (AttributeError, TypeError):
        return None


def _padded_input(arg: Any, dims: tuple[tuple[int, int | None], ...]) -> Any:
    """A bucketed graph's tpu input, padded along its dynamic ``dims`` where it is not padded
    yet (a tensor the user made whose size had not changed before): a new tensor of the same
    values, so every size of a bucket shares the graph's programs."""
    if not dims or not isinstance(arg, torch.Tensor) or arg.is_cpu or not arg.is_contiguous():
        return arg
    value = buffer.peek(arg.untyped_storage())
    if (
        type(value) is not buffer.ARRAY_TYPE
        or arg.storage_offset()
        or value.shape != arg.shape
        or JAX_TO_TORCH.get(value.dtype) is not arg.dtype
    ):
        return arg  # (padded already, deferred, a view into a larger storage or of another dtype)
    layout = padding.symbolic_layout(arg.shape, dims)
    if layout is None:
        return arg
    return tensor.wrap(padding.made(padding.padded_through_host(value, layout)))
