"""The ``tpu_dist`` process group: c10d's collectives on tpu tensors, run as XLA collectives.

A Python ``ProcessGroup`` (PyTorch's trampoline forwards every collective to these methods).
Each collective on tpu tensors reads its tensors' values, runs the collective's program over the
group's devices (``programs``), writes the results into the output tensors and hands the call
to the ``watchdog``, which bounds it by the group's timeout. Under
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` the ranks first meet on the store (``handshake``), and
mismatched calls raise on every rank. CPU tensors (object collectives, which PyTorch
stages on the CPU for a group with one device type) go to a gloo group on the same store, as
they would with ``"cpu:gloo,tpu:tpu_dist"``. Point-to-point calls travel through the hosts
over that gloo group: a program needs every rank of its mesh to call it, and two ranks that
both send before they receive (``batch_isend_irecv`` as pipeline schedules use it) would each
wait for the other's program.

Collectives complete when their program has been dispatched: the returned ``Work`` is already
done, and the outputs hold JAX's asynchronous results (the next read waits for them), as CUDA
streams order a NCCL collective before later kernels.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from ..runtime import dtypes, dynamo, platform
from ..runtime.checks import before_host_read
from ..runtime.tensor import is_tpu, read, wrap
from . import programs, runtime
from .handshake import Handshake
from .watchdog import Call, Ledger, watchdog

_OPS = {  # (by RedOpType: ReduceOp objects do not hash)
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "avg",
    dist.ReduceOp.PRODUCT: "product",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor",
}


def _done(result) -> dist.Work:
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _describe(tensors: Sequence[torch.Tensor]) -> str:
    return ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in tensors)


def _block(t: torch.Tensor):
    """A tensor's value as a program's block: its elements, flattened (row-major order is the
    order c10d splits and concatenates in)."""
    if not is_tpu(t):  # (torch_tpu.to_jax's words)
        raise ValueError(f"to_jax expects a tpu tensor, got a tensor on {t.device}")
    return before_host_read(read(t)).reshape(-1)


def _write(t: torch.Tensor, value) -> None:
    platform.start()  # (as torch_tpu.from_jax)
    t.copy_(wrap(value.reshape(t.shape)))


def _reduction(op, tensors: Sequence[torch.Tensor]) -> tuple[str, float | None]:
    if op.op == dist.ReduceOp.PREMUL_SUM:
        factor = op.factor
        return "premul_sum", float(factor.item() if isinstance(factor, torch.Tensor) else factor)
    name = _OPS.get(op.op)
    if name is None:
        raise ValueError(f"tpu_dist: unsupported reduce op {op}")
    for t in tensors:
        if name == "avg" and not (t.is_floating_point() or t.is_complex()):
            raise ValueError(f"tpu_dist: ReduceOp.AVG needs floating point or complex tensors, got {t.dtype}")
        if name in ("band", "bor", "bxor") and (t.is_floating_point() or t.is_complex()):
            raise ValueError(
                f"tpu_dist: ReduceOp.{name.upper()} needs integer or bool tensors, got {t.dtype}"
            )
        if name in ("min", "max") and t.is_complex():
            raise ValueError(
                f"tpu_dist: ReduceOp.{name.upper()} is not defined for complex tensors ({t.dtype})"
            )
    return name, None


def _counts_split(flat, counts: Sequence[int]) -> list:
    out, start = [], 0
    for c in counts:
        out.append(flat[start : start + c])
        start += c
    return out


@dataclasses.dataclass
class Entry:
    """A rank's entry into a collective: the call the watchdog bounds, and (in the debug mode)
    every member's details posted at the meeting."""

    call: Call
    posts: list | None


class HostReceive(dist._Work):
    """A receive into tpu tensors: gloo receives into host buffers, and waiting copies them in
    (``get_future`` waits first: the copy runs on the caller's thread, never on gloo's)."""

    def __init__(self, work: dist.Work, targets: list, staged: list, describe: str):
        super().__init__()
        self._work, self._targets, self._staged, self._describe = work, targets, staged, describe
        self._done = False

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        if not self._done:
            try:
                self._work.wait(timeout) if timeout else self._work.wait()
            except RuntimeError as error:
                raise dist.DistBackendError(f"tpu_dist: {self._describe} failed: {error}") from error
            with torch.no_grad():  # (the bytes arrive as a backend writes them: not an autograd op)
                for target, staged in zip(self._targets, self._staged, strict=True):
                    target.copy_(staged)
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done

    def get_future(self) -> torch.futures.Future:
        self.wait()
        future = torch.futures.Future()
        future.set_result(self._targets)
        return future


class ProcessGroupTPU(dist.ProcessGroup):
    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta, global_ranks: Sequence[int]):
        super().__init__(rank, size)
        self._global_ranks = tuple(global_ranks)
        self._devices = runtime.rank_devices(self._global_ranks)
        self._group_name = ""
        self._group_desc = ""
        self._timeout = timeout.total_seconds()
        # (torchrun's restarts share one store: an attempt's keys stay apart from the last's,
        # which a restarted rank would otherwise read before its peers overwrite them)
        store = dist.PrefixStore(
            f"tpu_dist/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store
        )
        describe = f"group of ranks {list(self._global_ranks)}"
        self._ledger = Ledger(store, rank, self._timeout, describe)
        watchdog.add_ledger(self._ledger)
        debug = dist.get_debug_level() == dist.DebugLevel.DETAIL
        self._handshake = Handshake(store, rank, timeout, describe) if debug else None
        self._members = tuple(range(size))
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("cpu/", store), rank, size, timeout)

    # -- naming (the trampoline's bookkeeping)
    def getBackendName(self) -> str:
        return "tpu_dist"

    def setGroupName(self, name: str) -> None:
        self._group_name = name
        self._ledger.describe = f"group {name!r} (ranks {list(self._global_ranks)})"
        if self._handshake is not None:
            self._handshake.describe = self._ledger.describe

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    # -- helpers
    def _on_cpu(self, *tensor_lists: Sequence[torch.Tensor]) -> bool:
        tensors = [t for ts in tensor_lists for t in ts]
        types = {t.device.type for t in tensors}
        if types <= {"tpu"}:
            for t in tensors:
                if t.device.index not in (None, 0):
                    raise ValueError(
                        f"tpu_dist: each rank drives its own tpu (tpu:0); got a tensor on {t.device}"
                    )
            return False
        if types == {"cpu"}:
            return True
        raise ValueError(f"tpu_dist: a collective takes tensors on one device type, got {sorted(types)}")

    def _enter(self, what: str, agree: str, mine: object = None) -> Entry:
        """This rank enters its next collective of the group: raises if an earlier one failed;
        in the debug mode, meets the other members first (``agree``: what they must all pass
        alike; ``mine``: this rank's details, every member's returned in :attr:`Entry.posts`)."""
        watchdog.check()
        members = self._members
        sequence = self._ledger.enter(members)
        posts = None
        if self._handshake is not None:
            posts = self._handshake.meet(what, agree, members, sequence, mine)
        deadline = time.monotonic() + self._timeout
        return Entry(Call(what, self._ledger, members, sequence, None, deadline), posts)

    def _run(self, entry: Entry, kind: str, block, option=None, factor=None):
        """Dispatch collective program ``kind`` (``programs.run``) as ``entry``'s call."""
        return self._dispatch(entry, lambda: programs.run(kind, self._devices, block, option, factor))

    def _dispatch(self, entry: Entry, program: Callable[[], Any]) -> Any:
        """``program()`` (it dispatches the entry's XLA program), bounded by the watchdog."""
        return watchdog.dispatch(entry.call, program)

    def _coalesced(self, entry: Entry, kind: str, inputs, outputs, option=None, factor=None) -> None:
        """Collective ``kind`` of every input into its output, as one program per dtype."""
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(inputs):
            by_dtype.setdefault(t.dtype, []).append(i)
        for indices in by_dtype.values():
            blocks = [_block(inputs[i]) for i in indices]
            run = functools.partial(programs.run_many, kind, self._devices, blocks, option, factor)
            for i, value in zip(indices, self._dispatch(entry, run), strict=True):
                _write(outputs[i], value)

    # -- reductions
    def allreduce(self, tensors, opts):
        if self._on_cpu(tensors):
            return self._gloo.allreduce(tensors, opts)
        op, factor = _reduction(opts.reduceOp, tensors)
        entry = self._enter("all_reduce", f"{op}: {_describe(tensors)}")
        for t in tensors:
            _write(t, self._run(entry, "all_reduce", _block(t), op, factor))
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts):
        if self._on_cpu(tensors):
            return self._gloo.allreduce_coalesced(tensors, opts)
        op, factor = _reduction(opts.reduceOp, tensors)
        entry = self._enter("all_reduce_coalesced", f"{op}: {_describe(tensors)}")
        self._coalesced(entry, "all_reduce", tensors, tensors, op, factor)
        return _done(tensors)

    def reduce(self, tensors, opts):
        if self._on_cpu(tensors):
            return self._gloo.reduce(tensors, opts)
        op, factor = _reduction(opts.reduceOp, tensors)
        entry = self._enter("reduce", f"{op} to rank {opts.rootRank}: {_describe(tensors)}")
        for t in tensors:
            result = self._run(entry, "all_reduce", _block(t), op, factor)
            if self.rank() == opts.rootRank:
                _write(t, result)
        return _done(tensors)

    def reduce_scatter(self, outputs, input_lists, opts):
        if self._on_cpu(outputs, *input_lists):
            return self._gloo.reduce_scatter(outputs, input_lists, opts)
        op, factor = _reduction(opts.reduceOp, outputs)
        entry = self._enter("reduce_scatter", f"{op}: {_describe(outputs)}")
        for out, inputs in zip(outputs, input_lists, strict=True):
            self._check_list("reduce_scatter", inputs, out)
            block = jnp.concatenate([_block(t) for t in inputs])
            _write(out, self._run(entry, "reduce_scatter", block, op, factor))
        return _done(outputs)

    def reduce_scatter_single(self, output, input, opts):
        if self._on_cpu([output, input]):
            return self._gloo._reduce_scatter_base(output, input, opts)
        op, factor = _reduction(opts.reduceOp, [input])
        self._check_numel("reduce_scatter_tensor", input, output.numel() * self.size())
        entry = self._enter("reduce_scatter_tensor", f"{op}: {_describe([input, output])}")
        _write(output, self._run(entry, "reduce_scatter", _block(input), op, factor))
        return _done([output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        if self._on_cpu(outputs, inputs):
            for output, input in zip(outputs, inputs, strict=True):
                self._gloo._reduce_scatter_base(output, input, opts).wait()
            return _done(outputs)
        op, factor = _reduction(opts.reduceOp, inputs)
        for output, input in zip(outputs, inputs, strict=True):
            self._check_numel("reduce_scatter_tensor_coalesced", input, output.numel() * self.size())
        entry = self._enter("reduce_scatter_tensor_coalesced", f"{op}: {_describe([*inputs, *outputs])}")
        self._coalesced(entry, "reduce_scatter", inputs, outputs, op, factor)
        return _done(outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # -- gathers and scatters
    def broadcast(self, tensors, opts):
        if self._on_cpu(tensors):
            return self._gloo.broadcast(tensors, opts)
        entry = self._enter("broadcast", f"from rank {opts.rootRank}: {_describe(tensors)}")
        for t in tensors:
            _write(t, self._run(entry, "broadcast", _block(t), opts.rootRank))
        return _done(tensors)

    def allgather(self, output_lists, inputs, opts):
        if self._on_cpu(inputs, *output_lists):
            return self._gloo.allgather(output_lists, inputs, opts)
        entry = self._enter("all_gather", _describe(inputs))
        for outputs, t in zip(output_lists, inputs, strict=True):
            self._check_list("all_gather", outputs, t)
            gathered = self._run(entry, "all_gather", _block(t))
            for out, value in zip(outputs, gathered.reshape(self.size(), -1)):
                _write(out, value)
        return _done(output_lists)

    def all_gather_single(self, output, input, opts):
        if self._on_cpu([output, input]):
            return self._gloo._allgather_base(output, input, opts)
        self._check_numel("all_gather_into_tensor", output, input.numel() * self.size())
        entry = self._enter("all_gather_into_tensor", _describe([input, output]))
        _write(output, self._run(entry, "all_gather", _block(input)))
        return _done([output])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts):
        if self._on_cpu(outputs, inputs):
            for output, input in zip(outputs, inputs, strict=True):
                self._gloo._allgather_base(output, input, opts).wait()
            return _done(outputs)
        for output, input in zip(outputs, inputs, strict=True):
            self._check_numel("all_gather_into_tensor_coalesced", output, input.numel() * self.size())
        entry = self._enter("all_gather_into_tensor_coalesced", _describe([*inputs, *outputs]))
        self._coalesced(entry, "all_gather", inputs, outputs)
        return _done(outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def gather(self, output_lists, inputs, opts):
        if self._on_cpu(inputs, *output_lists):
            return self._gloo.gather(output_lists, inputs, opts)
        root = opts.rootRank
        entry = self._enter("gather", f"to rank {root}: {_describe(inputs)}")
        gathered = self._run(entry, "all_gather", _block(inputs[0]))
        if self.rank() == root:
            self._check_list("gather", output_lists[0], inputs[0])
            for out, value in zip(output_lists[0], gathered.reshape(self.size(), -1)):
                _write(out, value)
        return _done(output_lists)

    def scatter(self, outputs, input_lists, opts):
        if self._on_cpu(outputs, *input_lists):
            return self._gloo.scatter(outputs, input_lists, opts)
        root, out = opts.rootRank, outputs[0]
        entry = self._enter("scatter", f"from rank {root}: {_describe(outputs)}")
        if self.rank() == root:
            self._check_list("scatter", input_lists[0], out)
            block = jnp.concatenate([_block(t) for t in input_lists[0]])
        else:
            block = jax.device_put(
                jnp.zeros(out.numel() * self.size(), dtypes.to_jax(out.dtype)), platform.device()
            )
        received = self._run(entry, "all_to_all", block).reshape(self.size(), -1)
        _write(out, received[root])
        return _done(outputs)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        if self._on_cpu([output, input]):
            return self._gloo.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)
        n = self.size()
        sends = self._row_counts("all_to_all_single", input, input_split_sizes)
        receives = self._row_counts("all_to_all_single", output, output_split_sizes)
        if not input_split_sizes and not output_split_sizes and sends == receives:
            # even splits on every rank: one all_to_all of the flat blocks as they are
            entry = self._enter("all_to_all_single", f"even: {_describe([input, output])}")
            _write(output, self._run(entry, "all_to_all", _block(input)))
            return _done([output])
        received = self._all_to_all("all_to_all_single", _block(input), sends, receives, input.dtype)
        _write(output, jnp.concatenate(received) if n > 1 else received[0])
        return _done([output])

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts):
        if self._on_cpu(outputs, inputs):
            return self._gloo.alltoall(outputs, inputs, opts)
        self._check_count("all_to_all", inputs)
        self._check_count("all_to_all", outputs)
        dtypes = {t.dtype for t in (*inputs, *outputs)}
        if len(dtypes) != 1:
            raise ValueError(
                f"tpu_dist: all_to_all needs tensors of one dtype, got {_describe([*inputs, *outputs])}"
            )
        block = jnp.concatenate([_block(t) for t in inputs])
        received = self._all_to_all(
            "all_to_all", block, [t.numel() for t in inputs], [t.numel() for t in outputs], inputs[0].dtype
        )
        for out, value in zip(outputs, received):
            _write(out, value)
        return _done(outputs)

    def _all_to_all(self, what: str, flat, sends: list, receives: list, dtype) -> list:
        """Every rank sends ``sends[j]`` elements of ``flat`` (in order) to rank ``j`` and gets
        ``receives[i]`` from rank ``i``: the blocks are padded to the longest and exchanged by
        one all_to_all."""
        entry = self._enter(what, str(dtype).removeprefix("torch."), [sends, receives])
        posts = entry.posts if entry.posts is not None else self._exchange_counts(sends, receives)
        me = self.rank()
        for i, (their_sends, _) in enumerate(posts):
            for j, (_, their_receives) in enumerate(posts):
                if their_sends[j] != their_receives[i]:
                    raise RuntimeError(
                        f"tpu_dist: {what}: rank {i} sends {their_sends[j]} elements to rank {j}, "
                        f"which expects {their_receives[i]} from it (split sizes disagree)"
                    )
        longest = max(c for their_sends, _ in posts for c in their_sends)
        if longest == 0:
            return [flat[:0] for _ in sends]
        pieces = _counts_split(flat, sends)
        padded = jnp.concatenate([jnp.pad(p, (0, longest - p.shape[0])) for p in pieces])
        exchanged = self._run(entry, "all_to_all", padded).reshape(self.size(), longest)
        return [exchanged[i, : posts[i][0][me]] for i in range(self.size())]

    def _exchange_counts(self, sends: list, receives: list) -> list:
        """Every rank's ``[sends, receives]`` (outside the debug mode's meeting: over the
        group's gloo part, host to host)."""
        n = self.size()
        mine = torch.tensor([*sends, *receives], dtype=torch.int64)
        every = [torch.empty_like(mine) for _ in range(n)]
        self._gloo.allgather([every], [mine]).wait()
        return [[t[:n].tolist(), t[n:].tolist()] for t in every]

    # -- point to point and barrier
    def _peer(self, peer: int) -> int:
        if not 0 <= peer < self.size() or peer == self.rank():
            raise ValueError(f"tpu_dist: invalid peer rank {peer} for rank {self.rank()} of {self.size()}")
        watchdog.check()
        return peer

    def send(self, tensors, dst: int, tag: int = 0):
        """Sends travel through the hosts over the group's gloo part: the value is read now, and
        the returned work completes when gloo has sent it (``isend`` is truly asynchronous, so
        ``batch_isend_irecv`` never deadlocks, whatever each rank's order)."""
        if self._on_cpu(tensors):
            return self._gloo.send(tensors, dst, tag)
        peer = self._peer(dst)
        staged = [t.detach().to("cpu").contiguous() for t in tensors]
        return self._gloo.send(staged, peer, tag)

    def recv(self, tensors, src: int, tag: int = 0):
        if self._on_cpu(tensors):
            return self._gloo.recv(tensors, src, tag)
        peer = self._peer(src)
        staged = [torch.empty(t.shape, dtype=t.dtype) for t in tensors]
        work = self._gloo.recv(staged, peer, tag)
        return HostReceive(work, tensors, staged, f"recv of {_describe(tensors)} from rank {src}")

    def recv_anysource(self, tensors, tag: int = 0):
        raise NotImplementedError("tpu_dist: recv from any source is not supported; pass src=")

    def barrier(self, opts):
        """Every rank has reached it, and the collectives before it have completed."""
        entry = self._enter("barrier", "")
        if self._handshake is None:
            self._run(entry, "all_reduce", programs.token(self._devices), "sum")
            watchdog.settle()
        return _done([])

    # -- argument checks (local, as c10d's own backends make them)
    def _check_count(self, what: str, tensors) -> None:
        if len(tensors) != self.size():
            raise ValueError(
                f"tpu_dist: {what} needs one tensor per rank ({self.size()}), got {len(tensors)}"
            )

    def _check_list(self, what: str, tensors, like: torch.Tensor) -> None:
        self._check_count(what, tensors)
        for t in tensors:
            if t.dtype != like.dtype or t.numel() != like.numel():
                raise ValueError(
                    f"tpu_dist: {what}: tensors {_describe(tensors)} do not match {_describe([like])}"
                )

    def _check_numel(self, what: str, t: torch.Tensor, numel: int) -> None:
        if t.numel() != numel:
            raise ValueError(
                f"tpu_dist: {what}: expected a tensor of {numel} elements (the group has "
                f"{self.size()} ranks), got {_describe([t])}"
            )

    def _row_counts(self, what: str, t: torch.Tensor, splits) -> list:
        """Elements per rank for the rows ``splits`` of ``t`` (even when ``splits`` is empty)."""
        rows = t.shape[0] if t.dim() else 1
        row = t.numel() // rows if rows else 0
        if not splits:
            if rows % self.size():
                raise ValueError(
                    f"tpu_dist: {what}: {rows} rows do not split evenly over {self.size()} ranks"
                )
            splits = [rows // self.size()] * self.size()
        if len(splits) != self.size() or sum(splits) != rows:
            raise ValueError(
                f"tpu_dist: {what}: split sizes {list(splits)} do not cover {rows} rows "
                f"over {self.size()} ranks"
            )
        return [s * row for s in splits]


def create(options, backend_options=None) -> ProcessGroupTPU:
    """c10d's factory for ``"tpu_dist"`` (extended API: it also gets the group's global ranks)."""
    ranks = list(options.global_ranks_in_group) or list(range(options.group_size))
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    else:
        rank, world_size = options.group_rank, options.group_size
    runtime.ensure_joined(rank, world_size, options.timeout, options.store)
    platform.initialize()
    dynamo.refresh()  # (Dynamo skips this package's code: the modules just loaded too)
    return ProcessGroupTPU(options.store, options.group_rank, options.group_size, options.timeout, ranks)
