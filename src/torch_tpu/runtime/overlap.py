"""Memory overlap between the tensors an op writes and the tensors it reads, checked as
PyTorch's ATen/MemoryOverlap.cpp checks it, so tpu raises where CPU raises.

A tpu op reads all its inputs before it writes (a functional lowering, then a write), so overlap
never corrupts our result; but CPU computes in place, element after element, and there overlap
makes its result depend on its loop order. CPU refuses what it can see (a written tensor with a
stride-0 dimension; an input that partially overlaps the output) and computes the rest ("too
hard" to tell: views that are not dense). Where such views really share memory CPU's result is
its loop's, which ours matches only when every shared element is read before it is written
(:func:`copies_in_order`, for copies); otherwise the exact answer decides and we raise CPU's
error rather than return a different result.

The geometry is pure data: a :class:`Layout` per tensor, compared only between tensors of the
same storage.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np
import torch

INTERNAL_OVERLAP = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)
PARTIAL_OVERLAP = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to "
    "a single memory location. Please clone() the tensor before performing the operation."
)

#: Ops whose CPU kernels refuse any overlap of their output with some of their inputs, full
#: overlap too (``assert_no_overlap``): those they read at positions other than the one they
#: write. op -> those inputs (the others, as ``scatter``'s ``self``, which an ``out=`` may be:
#: partial overlap only). The kernels check once their outputs have been resized, as well.
NO_OVERLAP_OPS: dict[str, tuple[str, ...]] = {
    "cat": ("tensors",),
    "stack": ("tensors",),
    "gather": ("self",),
    "take": ("self", "index"),
    "put": ("index", "source"),
    "index": ("self", "indices"),
    "index_select": ("self", "index"),
    "index_put": ("indices", "values"),
    "_index_put_impl": ("indices", "values"),
    "index_copy": ("index", "source"),
    "index_add": ("index", "source"),
    "index_reduce": ("index", "source"),
    "scatter": ("index", "src"),
    "scatter_add": ("index", "src"),
    "scatter_reduce": ("index", "src"),
    "masked_select": ("self", "mask"),
    "nonzero": ("self",),
    "kthvalue": ("self",),
    "linalg_cross": ("self", "other"),
}
#: Their ``out=`` overloads that PyTorch generates from the functional op (native_functions.yaml's
#: ``autogen``): computed into a new tensor, then copied, so only the output itself is checked.
GENERATED_OUT = frozenset({"put.out", "index_put.out", "_index_put_impl.out"})
#: Of those, ops whose check covers only some of their outputs (``kthvalue`` reads a clone of
#: its input, so its indices may go there).
NO_OVERLAP_OUTPUTS: dict[str, tuple[str, ...]] = {"kthvalue": ("values",)}


class Overlap(enum.Enum):
    NO = 0
    FULL = 1  # the same elements at the same positions: an in-place op may read what it writes
    PARTIAL = 2  # dense views sharing memory otherwise: CPU raises
    TOO_HARD = 3  # other views sharing memory: CPU computes in its loop order


class Layout(NamedTuple):
    """Where a tensor's elements lie in its storage (offset and strides in elements)."""

    offset: int
    sizes: tuple
    strides: tuple
    itemsize: int

    @property
    def numel(self) -> int:
        return int(np.prod(self.sizes, dtype=np.int64))


def layout(t: torch.Tensor) -> Layout:
    return Layout(t.storage_offset(), tuple(t.shape), t.stride(), t.element_size())


def is_dense(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """PyTorch's ``is_non_overlapping_and_dense``: a permutation of a contiguous layout."""
    expected = 1
    for size, stride in sorted(((n, s) for n, s in zip(sizes, strides) if n > 1), key=lambda pair: pair[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _separated(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether each stride outreaches all smaller-stride dimensions together, which makes every
    element's offset distinct (slices, transposes and permutations of dense tensors do)."""
    reach = 0
    for size, stride in sorted(((n, s) for n, s in zip(sizes, strides) if n > 1), key=lambda pair: pair[1]):
        if stride <= reach:
            return False
        reach += (size - 1) * stride
    return True


def _byte_offsets(view: Layout) -> np.ndarray:
    """The byte offset of every element of ``view``, in row-major order of its positions."""
    offsets = np.array(view.offset, dtype=np.int64)
    for size, stride in zip(view.sizes, view.strides):
        offsets = np.add.outer(offsets, np.arange(size, dtype=np.int64) * stride)
    return offsets.reshape(-1) * view.itemsize


def _extent(view: Layout) -> tuple[int, int]:
    """The bytes ``[start, end)`` that ``view``'s elements span (strides are never negative)."""
    start = view.offset * view.itemsize
    last = view.offset + sum((n - 1) * s for n, s in zip(view.sizes, view.strides))
    return start, (last + 1) * view.itemsize


def has_internal_overlap(view: Layout) -> bool:
    """Whether two elements of ``view`` share memory (exactly: CPU's "too hard" cases, such as
    overlapping ``as_strided`` windows, are counted)."""
    if view.numel < 2 or _separated(view.sizes, view.strides):
        return False
    if any(n > 1 and s == 0 for n, s in zip(view.sizes, view.strides)):
        return True  # (CPU's own "yes": an expanded dimension)
    starts = np.sort(_byte_offsets(view))
    return bool(np.any(np.diff(starts) < view.itemsize))


def _share_bytes(a: Layout, b: Layout) -> bool:
    a_starts, b_starts = np.sort(_byte_offsets(a)), np.sort(_byte_offsets(b))
    # for each element of a, the last element of b starting before a's element ends
    before = np.searchsorted(b_starts, a_starts + a.itemsize, side="left")
    candidate = b_starts[np.maximum(before - 1, 0)]
    return bool(np.any((before > 0) & (candidate + b.itemsize > a_starts)))


def overlap(a: Layout, b: Layout) -> Overlap:
    """How two views of one storage overlap: CPU's ``get_overlap_status``, with its "too hard"
    told exactly (NO unless the views share a byte)."""
    if not a.numel or not b.numel:
        return Overlap.NO
    if a == b:
        return Overlap.FULL
    (a_start, a_end), (b_start, b_end) = _extent(a), _extent(b)
    if a_end <= b_start or b_end <= a_start:
        return Overlap.NO
    if is_dense(a.sizes, a.strides) and is_dense(b.sizes, b.strides):
        if (a_start, a_end) == (b_start, b_end):
            return Overlap.FULL if a.strides == b.strides else Overlap.PARTIAL
        return Overlap.PARTIAL
    return Overlap.TOO_HARD if _share_bytes(a, b) else Overlap.NO


def copies_in_order(dst: Layout, src: Layout) -> bool:
    """Whether copying ``src`` (broadcast to ``dst``'s shape) into ``dst`` element by element, in
    ``dst``'s memory order as CPU's loop runs, reads every shared element before it changes:
    memmove's forward case (``x[:, :-1] = x[:, 1:]``), where CPU's result is the clone's.
    (``dst`` has no internal overlap: each address is written at one position.)"""
    if dst.itemsize != src.itemsize:
        return False
    pad = len(dst.sizes) - len(src.sizes)
    src = src._replace(
        sizes=dst.sizes, strides=(0,) * pad + tuple(s if n > 1 else 0 for n, s in zip(src.sizes, src.strides))
    )
    written, read = _byte_offsets(dst), _byte_offsets(src)
    readers = np.flatnonzero(np.isin(read, written))  # positions reading a written address
    order = np.argsort(written)
    writers = order[np.searchsorted(written, read[readers], sorter=order)]
    # a reader is safe if its address is written later, or rewritten with its own value
    safe = (written[readers] <= read[readers]) | (read[writers] == written[writers])
    return bool(np.all(safe))


# ----------------------------------------------------------------------------- checks on tensors
_same_storage = torch._C._is_alias_of


def _tensors(value) -> Sequence[torch.Tensor]:
    """The tensors of an argument: a tensor, a tensor list (``None`` entries left out), or none."""
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return ()


def _pairs(written, read) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """(written tensor, read tensor) pairs: lists of one length pair up by position, as the
    per-tensor loop of a ``_foreach`` op sees them; anything else pairs every way."""
    if isinstance(written, (list, tuple)) and isinstance(read, (list, tuple)) and len(written) == len(read):
        return (
            (w, r)
            for w, r in zip(written, read)
            if isinstance(w, torch.Tensor) and isinstance(r, torch.Tensor)
        )
    return itertools.product(_tensors(written), _tensors(read))


def check_writes(written: Sequence, read: Iterable, no_overlap: bool = False, copy: bool = False) -> None:
    """Raise PyTorch's error if a tensor in ``written`` overlaps itself, or partially overlaps a
    tensor in ``read`` (any overlap at all when ``no_overlap``; for a ``copy``, overlap CPU
    cannot see passes when :func:`copies_in_order`). Both hold tensors or tensor lists; only
    tensors sharing a storage are compared, so the common case costs little."""
    read = [r for r in read if _tensors(r)]
    for target in written:
        for t in _tensors(target):
            if not t.is_contiguous() and has_internal_overlap(layout(t)):
                raise RuntimeError(INTERNAL_OVERLAP)
        for source in read:
            for w, r in _pairs(target, source):
                if w is r:
                    status = Overlap.FULL
                elif _same_storage(w, r):
                    status = overlap(layout(w), layout(r))
                else:
                    continue
                if status is Overlap.TOO_HARD and copy and copies_in_order(layout(w), layout(r)):
                    continue
                if status in (Overlap.PARTIAL, Overlap.TOO_HARD) or (no_overlap and status is Overlap.FULL):
                    raise RuntimeError(PARTIAL_OVERLAP)


def writes_checker(
    schema: torch._C.FunctionSchema, resized: bool = False
) -> Callable[[list, tuple, dict], None] | None:
    """For an in-place or ``out=`` overload: ``check(written, args, kwargs)`` runs
    :func:`check_writes` on its written arguments (in schema order) against the tensors it
    reads. ``resized``: the check of the outputs once resized (a resize can move an ``out=``
    onto an input, as ``gather(x, 0, i[1:], out=i[:1])``), which only ``NO_OVERLAP_OPS``'
    kernels make (None for the others: TensorIterator checks before it resizes)."""
    name = schema.name.split("::")[-1].removesuffix("_")
    strict = NO_OVERLAP_OPS.get(name, ())
    if f"{name}.{schema.overload_name}" in GENERATED_OUT:
        return None if resized else lambda written, args, kwargs: check_writes(written, ())
    if resized and not strict:
        return None
    is_written = [arg.alias_info is not None and arg.alias_info.is_write for arg in schema.arguments]
    read = [
        (i, arg.name)
        for i, arg in enumerate(schema.arguments)
        if "Tensor" in str(arg.type) and not is_written[i]
    ]
    written_names = [arg.name for arg, w in zip(schema.arguments, is_written) if w]
    covered = NO_OVERLAP_OUTPUTS.get(name, written_names)
    strict_targets = [i for i, n in enumerate(written_names) if n in covered]

    def check(written: list, args: tuple, kwargs: dict) -> None:
        values = {arg: args[i] if i < len(args) else kwargs.get(arg) for i, arg in read}
        check_writes(written, [v for arg, v in values.items() if arg not in strict])
        if strict:
            strict_written = [written[i] for i in strict_targets]
            check_writes(strict_written, [values[arg] for arg in strict if arg in values], no_overlap=True)

    return check
