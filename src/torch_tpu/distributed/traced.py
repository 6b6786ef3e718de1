"""Functional collectives inside compiled graphs: XLA collectives in the graph's own program.

A graph that calls ``torch.ops._c10d_functional`` ops (DTensor, FSDP2, tensor parallelism and
``torch.distributed._functional_collectives`` under ``torch.compile``) is compiled as one SPMD
program over its group's devices: the whole graph is a ``shard_map`` body, every rank passes its
own inputs as its block, and each collective node is the same XLA collective as the eager
program's (``programs``), on values inside the program. Every rank runs the same graph, so every
rank calls the program, as SPMD needs. Each call is one collective of the group to the
watchdog, which bounds it by the group's timeout; in the debug mode the ranks meet on the
group's store before it (``handshake``), which catches ranks that run different graphs or
shapes.

(In eager, these ops need nothing from us: PyTorch's kernels for them call the process group.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import torch
import torch.distributed as dist
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..runtime import tensor
from . import programs
from .process_group import ProcessGroupTPU

NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")


def is_collective(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.namespace in NAMESPACES


def _group(name: Any) -> dist.ProcessGroup:
    if isinstance(name, dist.ProcessGroup):
        return name
    return dist.distributed_c10d._resolve_process_group(name)


def _group_argument(node: torch.fx.Node) -> Any:
    return node.kwargs.get("group_name", node.args[-1])


def graph_group(graph_module: torch.fx.GraphModule) -> dist.ProcessGroup | None:
    """The one group the graph's collectives run over (None: the graph has none)."""
    groups = {
        id(g): g
        for g in (
            _group(_group_argument(node))
            for node in graph_module.graph.nodes
            if is_collective(node.target) and not node.target._schema.name.endswith("::wait_tensor")
        )
    }
    if len(groups) > 1:
        ranks = [dist.get_process_group_ranks(g) for g in groups.values()]
        raise NotImplementedError(
            f"tpu_dist: a compiled graph runs collectives over one process group; this one uses "
            f"{len(groups)} (ranks {ranks}): break the graph between them (a 2-D device mesh in "
            "one compiled graph is not supported yet)"
        )
    return next(iter(groups.values()), None)


class Spmd:
    """A compiled graph's program over the devices of ``group`` (one block per rank), for one
    layout of its inputs (``avals``). ``code``: the graph's code, which every rank's must match
    (its ``name`` counts Dynamo frames, which ranks may compile in other orders)."""

    def __init__(self, group: dist.ProcessGroup, name: str, code: str, avals: tuple) -> None:
        # (c10d makes the backend's own object the group: the extended API returns it whole)
        backend = group
        if not isinstance(backend, ProcessGroupTPU):
            raise NotImplementedError(
                f"tpu_dist: a compiled tpu graph runs collectives over a tpu_dist group, not "
                f"{dist.get_backend(group)!r}"
            )
        self.backend = backend
        self.size = group.size()
        self.mesh = Mesh(np.array(backend._devices), (programs.AXIS,))
        self._sharding = NamedSharding(self.mesh, P(programs.AXIS))
        self._what = f"compiled graph {name}"
        self._agree = hashlib.sha256(repr((code, avals)).encode()).hexdigest()[:16]
        self.scalar_outputs: Any = None  # which outputs are scalars (found by the trace)

    def wrap(self, program: Callable, values: Sequence[jax.Array]) -> Callable:
        """``program(key_data, *values)`` as a function of every rank's blocks (the global
        arrays :meth:`arguments` makes of ``values``, this rank's). Blocks are split on their
        first dimension, so a scalar travels as one element."""
        scalars = [v.ndim == 0 for v in values]

        def body(*blocks):
            outputs = program(*(b.reshape(()) if s else b for b, s in zip(blocks, scalars)))
            self.scalar_outputs = jax.tree.map(lambda a: a.ndim == 0, outputs)
            return jax.tree.map(lambda a: a.reshape(1) if a.ndim == 0 else a, outputs)

        axis = P(programs.AXIS)
        return jax.shard_map(body, mesh=self.mesh, in_specs=axis, out_specs=axis)

    def arguments(self, values: Sequence[jax.Array]) -> list[jax.Array]:
        """This rank's values as its blocks of the program's global arguments (no copies, but
        for scalars)."""
        return [
            jax.make_array_from_single_device_arrays(
                (self.size * v.shape[0] if v.ndim else self.size, *v.shape[1:]),
                self._sharding,
                [v if v.ndim else v.reshape(1)],
            )
            for v in values
        ]

    def results(self, outputs: Any) -> Any:
        """This rank's blocks of the program's outputs."""
        return jax.tree.map(
            lambda a, s: a.addressable_shards[0].data.reshape(()) if s else a.addressable_shards[0].data,
            outputs,
            self.scalar_outputs,
        )

    def call(self, run: Callable, values: Sequence[jax.Array]) -> Any:
        """Call the program (``run``) with this rank's ``values``, as one collective of the
        group: the watchdog bounds it by the group's timeout (and in the debug mode every rank
        first checks that the others call this graph with this layout, else all raise);
        returns this rank's blocks of its outputs."""
        entry = self.backend._enter(self._what, self._agree)
        arguments = self.arguments(values)
        return self.results(self.backend._dispatch(entry, lambda: run(*arguments)))


# ----------------------------------------------------------------------------- the nodes
def _reduce_op(name: str) -> str:
    op = name.lower()
    if op not in ("sum", "avg", "product", "min", "max", "band", "bor", "bxor"):
        raise ValueError(f"tpu_dist: unsupported reduce op {name!r}")
    return op


def _run(kind: str, x: torch.Tensor, size: int, option=None) -> jax.Array:
    """Collective ``kind`` on ``x``'s value inside the program (flattened, as the eager program
    takes its block)."""
    body = programs._body(kind, size, option)
    block = tensor.read(x).reshape(-1)
    if kind in ("all_reduce", "reduce_scatter"):
        return body(block, jax.numpy.asarray(1, block.dtype))
    return body(block)


def _all_reduce(x, op, group):
    return tensor.wrap(_run("all_reduce", x, _group(group).size(), _reduce_op(op)).reshape(x.shape))


def _all_gather(x, group_size, group):
    shape = (x.shape[0] * group_size, *x.shape[1:]) if x.dim() else (group_size,)
    return tensor.wrap(_run("all_gather", x, group_size).reshape(shape))


def _reduce_scatter(x, op, group_size, group):
    if not x.dim() or x.shape[0] % group_size:
        raise ValueError(
            f"tpu_dist: reduce_scatter_tensor: dim 0 of {list(x.shape)} does not split over "
            f"{group_size} ranks"
        )
    shape = (x.shape[0] // group_size, *x.shape[1:])
    return tensor.wrap(_run("reduce_scatter", x, group_size, _reduce_op(op)).reshape(shape))


def _all_to_all_single(x, output_split_sizes, input_split_sizes, group):
    size = _group(group).size()
    even = [x.shape[0] // size] * size if x.dim() and x.shape[0] % size == 0 else None
    if list(input_split_sizes or even or []) != even or list(output_split_sizes or even or []) != even:
        raise NotImplementedError(
            "tpu_dist: all_to_all_single with uneven split sizes in a compiled graph (split "
            f"sizes {list(input_split_sizes)} -> {list(output_split_sizes)} for {list(x.shape)}); "
            "run it eagerly"
        )
    return tensor.wrap(_run("all_to_all", x, size).reshape(x.shape))


def _broadcast(x, src, group):
    # (``src`` is the group rank, as PyTorch's kernel passes it on as the root)
    return tensor.wrap(_run("broadcast", x, _group(group).size(), src).reshape(x.shape))


def _coalesced(one: Callable) -> Callable:
    return lambda inputs, *rest: [one(x, *rest) for x in inputs]


def _in_place(one: Callable) -> Callable:
    def run(x, *rest):
        for t, value in zip(x if isinstance(x, list) else [x], _listed(one(x, *rest))):
            tensor.write(t, tensor.read(value))
        return x

    return run


def _out(one: Callable) -> Callable:
    def run(*args, out):
        tensor.write(out, tensor.read(one(*args)))
        return out

    return run


def _listed(value):
    return value if isinstance(value, list) else [value]


_ALL_REDUCE_COALESCED = _coalesced(_all_reduce)
LOWERINGS: dict[str, Callable] = {
    "all_reduce": _all_reduce,
    "all_reduce_": _in_place(_all_reduce),
    "all_reduce_coalesced": _ALL_REDUCE_COALESCED,
    "all_reduce_coalesced_": _in_place(_ALL_REDUCE_COALESCED),
    "all_gather_into_tensor": _all_gather,
    "all_gather_into_tensor_out": _out(_all_gather),
    "all_gather_into_tensor_coalesced": _coalesced(_all_gather),
    "reduce_scatter_tensor": _reduce_scatter,
    "reduce_scatter_tensor_out": _out(_reduce_scatter),
    "reduce_scatter_tensor_coalesced": _coalesced(_reduce_scatter),
    "all_to_all_single": _all_to_all_single,
    "broadcast": _broadcast,
    "broadcast_": _in_place(_broadcast),
    # the program's values are ready when the next node reads them: nothing to wait for
    "wait_tensor": lambda x: x,
}


def lowering(target: torch._ops.OpOverload) -> Callable:
    name = target._schema.name.split("::")[1]
    try:
        return LOWERINGS[name]
    except KeyError:
        raise NotImplementedError(
            f"tpu_dist: {target._schema.name} in a compiled tpu graph is not supported"
        ) from None
