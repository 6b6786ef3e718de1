"""The collectives as XLA programs: each is a jitted ``shard_map`` over a one-axis mesh of the
group's devices (one per rank, in group rank order), so XLA's own collectives (``psum``,
``all_gather``, ``psum_scatter``, ``all_to_all``) carry the data. Every rank calls
the same program with its local block (a one-dimensional array, on its device) and
gets its own block of the result back. Programs are cached per kind, mesh and static options;
shapes and dtypes are ``jax.jit``'s own cache.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = "ranks"

#: reductions XLA has as collectives (on bool, sum is "any rank true" and product "all true",
#: as NCCL reduces bool)
_NATIVE = {"sum": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}
_BOOL = {"sum": "max", "product": "min", "max": "max", "min": "min"}
#: reductions applied to every rank's block, in rank order, after an all_gather
_GATHERED = {
    "product": jnp.multiply,
    "band": jnp.bitwise_and,
    "bor": jnp.bitwise_or,
    "bxor": jnp.bitwise_xor,
}
#: every reduction as a fold of the ranks' blocks (the reduce-scatter of the CPU stand-in)
_FOLDS = {
    "sum": jnp.add,
    "avg": jnp.add,
    "premul_sum": jnp.add,
    "max": jnp.maximum,
    "min": jnp.minimum,
    **_GATHERED,
}


@functools.cache
def runs_inline() -> bool:
    """Whether XLA runs a collective's program on the calling thread (the CPU client runs cheap
    programs inline), where a rank that never comes holds the caller."""
    return _on_gloo()


@functools.cache
def _on_gloo() -> bool:
    """Whether the collectives travel over JAX's gloo CPU collectives (the CPU stand-in).

    There XLA's reduce-scatter is gloo's halving-doubling algorithm: 2-3x slower than an
    all_to_all of the same blocks, and it leaves gloo's connections slow for the all-reduces
    that follow (a 4 MB all_reduce took 50-90 ms instead of 6 after one 16 KB reduce-scatter:
    measured with plain ``jax.shard_map`` programs, two processes), so reduce-scatters are
    all_to_alls and a fold on this platform."""
    return jax.devices()[0].platform == "cpu"


def _reduce(x, op: str, n: int, factor):
    """The all-reduce of ``x`` over the axis (``op`` as in ``ReduceOp``, lower case)."""
    if x.dtype == jnp.bool_ and op in _BOOL:
        op = _BOOL[op]
    if op == "premul_sum":
        return jax.lax.psum(x * factor.astype(x.dtype), AXIS)
    if op == "avg":
        return (jax.lax.psum(x, AXIS) / n).astype(x.dtype)
    if op in _NATIVE:
        return _NATIVE[op](x, AXIS)
    blocks = jax.lax.all_gather(x, AXIS)
    return functools.reduce(_GATHERED[op], [blocks[i] for i in range(n)])


def _fold_scatter(x, op: str, n: int, factor):
    """Reduce-scatter as one all_to_all (rank ``i`` receives every rank's block ``i``) and a
    fold of the received blocks in rank order."""
    if x.dtype == jnp.bool_ and op in _BOOL:
        op = _BOOL[op]
    if op == "premul_sum":
        x = x * factor.astype(x.dtype)
    blocks = jax.lax.all_to_all(x.reshape(n, -1), AXIS, 0, 0, tiled=True)
    out = functools.reduce(_FOLDS[op], [blocks[i] for i in range(n)])
    return (out / n).astype(x.dtype) if op == "avg" else out


def token(devices: tuple) -> jax.Array:
    """A one-element block on this rank's device, for collectives that carry no data (the
    barrier)."""
    if devices not in _tokens:
        mine = next(d for d in devices if d.process_index == jax.process_index())
        _tokens[devices] = jax.device_put(np.zeros(1, np.int32), mine)
    return _tokens[devices]


_tokens: dict = {}


def _bits(dtype) -> np.dtype:
    return np.dtype(f"uint{np.dtype(dtype).itemsize * 8}")


def _body(kind: str, n: int, option):
    if kind == "all_reduce":
        return lambda x, factor: _reduce(x, option, n, factor)
    if kind == "reduce_scatter":

        def reduce_scatter(x, factor):
            if _on_gloo():
                return _fold_scatter(x, option, n, factor)
            if option in ("sum", "avg", "premul_sum") and x.dtype != jnp.bool_:
                if option == "premul_sum":
                    x = x * factor.astype(x.dtype)
                out = jax.lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True)
                return (out / n).astype(x.dtype) if option == "avg" else out
            k = x.shape[0] // n
            return jax.lax.dynamic_slice_in_dim(
                _reduce(x, option, n, factor), jax.lax.axis_index(AXIS) * k, k
            )

        return reduce_scatter
    if kind == "all_gather":
        return lambda x: jax.lax.all_gather(x, AXIS, axis=0, tiled=True)
    if kind == "all_to_all":
        return lambda x: jax.lax.all_to_all(x, AXIS, 0, 0, tiled=True)
    if kind == "broadcast":
        # Exact for every dtype: the root's bits, summed with zeros from every other rank.
        def broadcast(x):
            bits = jax.lax.bitcast_convert_type(x, _bits(x.dtype)) if x.dtype != jnp.bool_ else x
            mine = jnp.where(jax.lax.axis_index(AXIS) == option, bits, jnp.zeros_like(bits))
            total = jax.lax.psum(mine, AXIS) if x.dtype != jnp.bool_ else jax.lax.pmax(mine, AXIS)
            return jax.lax.bitcast_convert_type(total, x.dtype) if x.dtype != jnp.bool_ else total

        return broadcast
    raise ValueError(f"unknown collective program {kind!r}")


def _pack(kind: str, n: int, blocks: tuple):
    """Several blocks as one: concatenated, except that a reduce-scatter's blocks are
    interleaved by rank (rank ``r``'s part of every block, in order, is the packed block's
    part ``r``)."""
    if len(blocks) == 1:
        return blocks[0]
    if kind == "reduce_scatter":
        return jnp.concatenate([b.reshape(n, -1) for b in blocks], axis=1).reshape(-1)
    return jnp.concatenate(blocks)


def _unpack(kind: str, n: int, blocks: tuple, out) -> tuple:
    """The packed result ``out`` split back into one result per block of ``blocks``."""
    if len(blocks) == 1:
        return (out,)
    sizes = [b.shape[0] // n if kind == "reduce_scatter" else b.shape[0] for b in blocks]
    bounds = list(zip(np.cumsum([0, *sizes[:-1]]), np.cumsum(sizes)))
    if kind == "all_gather":  # (rank r's packed block is row r)
        rows = out.reshape(n, -1)
        return tuple(rows[:, a:b].reshape(-1) for a, b in bounds)
    return tuple(out[a:b] for a, b in bounds)


@functools.lru_cache(maxsize=256)
def _program(kind: str, devices: tuple, option, count: int):
    mesh = Mesh(np.array(devices), (AXIS,))
    n = len(devices)
    body = _body(kind, n, option)

    def packed(blocks, factor):
        whole = _pack(kind, n, blocks)
        out = body(whole, factor) if kind in ("all_reduce", "reduce_scatter") else body(whole)
        return _unpack(kind, n, blocks, out)

    blocks_spec = (P(AXIS),) * count
    shard = jax.shard_map(packed, mesh=mesh, in_specs=(blocks_spec, P()), out_specs=blocks_spec)
    return mesh, jax.jit(shard)


def run(kind: str, devices: tuple, block: jax.Array, option=None, factor=None) -> jax.Array:
    """This rank's block of collective ``kind`` over the ranks of ``devices``, given its block
    ``block`` (one dimension, on this rank's device). ``option``: the reduction
    (``all_reduce``, ``reduce_scatter``) or the root's group rank (``broadcast``); ``factor``:
    the ``premul_sum`` factor."""
    return run_many(kind, devices, [block], option, factor)[0]


def run_many(kind: str, devices: tuple, blocks: list, option=None, factor=None) -> list:
    """:func:`run` for several blocks of one dtype (the ``*_coalesced`` collectives): one
    program, one collective of the blocks packed together, a result per block."""
    mesh, program = _program(kind, devices, option, len(blocks))
    n, sharding = len(devices), NamedSharding(mesh, P(AXIS))
    wholes = tuple(jax.make_array_from_single_device_arrays((n * b.shape[0],), sharding, [b]) for b in blocks)
    outs = program(wholes, _one() if factor is None else jnp.asarray(factor))
    return [out.addressable_shards[0].data for out in outs]


@functools.cache
def _one() -> jax.Array:
    return jnp.asarray(1)
