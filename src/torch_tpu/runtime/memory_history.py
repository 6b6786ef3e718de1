"""Memory history: what allocated each live tpu storage, and every allocation and free over
time, in the format of CUDA's ``torch.cuda.memory._snapshot()`` (read by ``torch.cuda._memory_viz``
and https://pytorch.org/memory_viz).

How it is recorded: every path that gives a tpu storage its value sets one attribute of the
storage's Python object (``buffer.STORAGE_ATTR``), the C++ core's paths included. While
recording, ``torch.UntypedStorage`` carries a data descriptor for that attribute (:class:`_ValueSlot`):
the value still lives in the storage's ``__dict__``, and the first value a storage gets is an
allocation (with the Python stack that made it), a value of another size a resize (a free, then
an allocation); a weak reference to the storage notes its death (a free). With recording off the
descriptor is not there, so making and reading storages costs nothing more than without this
module.

What differs from CUDA: XLA owns the device memory and its allocator, invisible from here. Each
storage is one block in a segment of its own (reserved = allocated: no cache, no fragmentation to
see), of the bytes the storage holds (a padded value's padding is not counted; an unwritten
``torch.empty`` storage is counted, as PyTorch counts it, though XLA holds no buffer for it yet).
Addresses are the storages' ``data_ptr()`` handles (unique while they live, never dereferenced).
Frames are Python frames only (``stacks="all"`` adds no C++ frames).
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import threading
import time
import weakref
from types import CodeType
from typing import Any

import torch

#: How much gets a Python stack (CUDA's RecordContext): the live blocks ("state"), the trace's
#: allocations too ("alloc"), the trace's frees too, with the stack that freed them ("all")
CONTEXTS = {None: 0, "state": 1, "alloc": 2, "all": 3}
ENABLED = (None, "state", "all")
STACKS = ("python", "all")
#: CUDA's small pool holds allocations up to 1 MiB; a segment's type says which pool
_SMALL_SEGMENT = 1 << 20

#: The Python frames of a stack, innermost first, flat: (code, line, code, line, ...). Each
#: distinct stack is kept once (``History.stacks``): an allocation site repeats every step.
Stack = tuple


@dataclasses.dataclass(slots=True)
class Block:
    """A live tpu storage as the history knows it (its own segment)."""

    address: int
    size: int
    device: int
    frames: Stack  # where it was allocated (empty: before recording, or without context)


@dataclasses.dataclass(slots=True)
class Stat:
    """One counter as CUDA's allocator keeps it: now, its peak, and the totals added and removed."""

    current: int = 0
    peak: int = 0
    allocated: int = 0
    freed: int = 0

    def add(self, n: int, counted: bool = True) -> None:
        self.current += n
        self.peak = max(self.peak, self.current)
        self.allocated += n if counted else 0

    def remove(self, n: int) -> None:
        self.current -= n
        self.freed += n


@dataclasses.dataclass(slots=True)
class Counts:
    """What the history counted on one device: the bytes and the number of the storages it knows
    (those alive when recording started count as current, not as allocated)."""

    bytes: Stat = dataclasses.field(default_factory=Stat)
    blocks: Stat = dataclasses.field(default_factory=Stat)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What :func:`record` was last asked for."""

    enabled: str | None = None
    context: int = 0  # a value of CONTEXTS
    max_entries: int = sys.maxsize
    skip_actions: frozenset = frozenset()


class History:
    """The one owner of the recorded state: the settings, the storages watched (by ``id``: a weak
    reference to each), the blocks they hold, the stacks seen, the trace and the counts per device.

    A trace entry is a plain tuple, (action, address, size, stack, time in µs) (made in
    :meth:`_trace`, read in :func:`_entry`): the collector stops tracking a tuple of atoms, so a
    long history does not lengthen every full collection, as a million objects would."""

    def __init__(self) -> None:
        self.settings = Settings()
        self.watched: dict[int, _Watch] = {}
        self.blocks: dict[int, Block] = {}
        self.stacks: dict[Stack, Stack] = {}
        self.traces: dict[int, collections.deque] = {}
        self.counts: dict[int, Counts] = collections.defaultdict(Counts)
        self.slot: _ValueSlot | None = None  # installed on torch.UntypedStorage while recording
        # (reentrant: a storage may die, and its callback run, while the lock is held)
        self.lock = threading.RLock()

    # ------------------------------------------------------------------------- settings
    def start(self, settings: Settings, clear: bool) -> None:
        with self.lock:
            self.settings = settings
            if clear:
                self.traces.clear()
            for index, trace in self.traces.items():
                self.traces[index] = collections.deque(trace, maxlen=settings.max_entries)
            if self.slot is None:
                self.slot = _ValueSlot(self)
                setattr(torch.UntypedStorage, self.slot.name, self.slot)
            self._adopt_live_storages()

    def stop(self) -> None:
        """Recording off; as CUDA's allocator, the trace is dropped and live blocks keep their stacks."""
        with self.lock:
            if self.slot is not None:
                delattr(torch.UntypedStorage, self.slot.name)
                self.slot = None
            self.settings = Settings()
            self.traces.clear()
            self.stacks.clear()  # (the live blocks keep theirs)

    # ------------------------------------------------------------------------- events
    def value_set(self, storage: Any, value: Any, had_value: bool) -> None:
        """``storage`` was given ``value`` (``had_value``: it held one before)."""
        key = id(storage)
        size = _value_bytes(storage, value)
        block = self.blocks.get(key)
        if block is not None and block.size == size:
            return  # a write: the same storage, the same bytes
        with self.lock:
            block = self.blocks.get(key)
            if key not in self.watched:
                self._watch(storage, key)
                if had_value:  # made while recording was off: known from now on, without stack
                    self._adopt(storage, key, size)
                    return
            if block is not None:  # resized
                self._free(key, self._stack(CONTEXTS["all"]))
            if size:
                self._allocate(storage, key, size)

    def died(self, watch: _Watch) -> None:
        with self.lock:
            if self.watched.get(watch.key) is not watch:
                return
            del self.watched[watch.key]
            if watch.key in self.blocks:
                self._free(watch.key, self._stack(CONTEXTS["all"]))

    def _allocate(self, storage: Any, key: int, size: int) -> None:
        frames = self._stack(CONTEXTS["state"])
        block = Block(self._address(storage, key), size, storage.get_device(), frames)
        self.blocks[key] = block
        counts = self.counts[block.device]
        counts.bytes.add(size)
        counts.blocks.add(1)
        self._trace(block, "segment_alloc", frames)
        self._trace(block, "alloc", frames)

    def _free(self, key: int, frames: Stack) -> None:
        block = self.blocks.pop(key)
        counts = self.counts[block.device]
        counts.bytes.remove(block.size)
        counts.blocks.remove(1)
        frames = frames or block.frames
        for action in ("free_requested", "free_completed", "segment_free"):
            self._trace(block, action, frames)

    def _stack(self, context: int) -> Stack:
        """The calling stack (one object per distinct stack) if ``context`` is recorded, else ()."""
        if self.settings.context < context:
            return ()
        stack = _stack()
        return self.stacks.setdefault(stack, stack)

    def _trace(self, block: Block, action: str, frames: Stack) -> None:
        settings = self.settings
        if settings.enabled != "all" or action in settings.skip_actions:
            return
        trace = self.traces.get(block.device)
        if trace is None:
            trace = self.traces[block.device] = collections.deque(maxlen=settings.max_entries)
        frames = frames if settings.context >= CONTEXTS["alloc"] else ()
        trace.append((action, block.address, block.size, frames, time.time_ns() // 1000))

    # ------------------------------------------------------------------------- storages
    def _watch(self, storage: Any, key: int) -> None:
        self.watched[key] = _Watch(storage, self.died, key)

    def _address(self, storage: Any, key: int) -> int:
        """The storage's handle; in a resize from 0 bytes (no handle yet), the one it had last."""
        watch = self.watched[key]
        handle = storage.data_ptr()
        if handle or not watch.address:
            watch.address = handle or id(storage)
        return watch.address

    def _adopt(self, storage: Any, key: int, size: int) -> None:
        """Know a storage allocated before recording started: no stack, no trace entry."""
        if not size:
            return
        block = Block(self._address(storage, key), size, storage.get_device(), ())
        self.blocks[key] = block
        counts = self.counts[block.device]
        counts.bytes.add(size, counted=False)
        counts.blocks.add(1, counted=False)

    def _adopt_live_storages(self) -> None:
        from . import buffer

        for storage in _live_storages():
            key = id(storage)
            if key not in self.watched:
                self._watch(storage, key)
                self._adopt(storage, key, _value_bytes(storage, buffer.peek(storage)))

    def block_of(self, storage: Any) -> Block | None:
        """The block of a live storage: the one recorded, else one made now without a stack."""
        key = id(storage)
        ref = self.watched.get(key)
        if ref is not None and ref() is storage:
            return self.blocks.get(key)
        from . import buffer

        size = _value_bytes(storage, buffer.peek(storage))
        return Block(_address(storage), size, storage.get_device(), ()) if size else None

    # ------------------------------------------------------------------------- snapshot
    def snapshot(self) -> dict:
        """CUDA's snapshot: every live storage a segment of one block, and each device's trace."""
        from . import platform

        with self.lock:
            blocks = [b for b in map(self.block_of, _live_storages()) if b is not None]
            traces = {index: list(trace) for index, trace in self.traces.items()}
        frames = _FrameDicts()
        segments = sorted((_segment(b, frames) for b in blocks), key=lambda s: (s["device"], s["address"]))
        devices = max([platform.known_device_count(), *(i + 1 for i in traces)])
        return {
            "segments": segments,
            "device_traces": [[_entry(e, frames) for e in traces.get(i, ())] for i in range(devices)],
        }


# ----------------------------------------------------------------------------- storages
class _Watch(weakref.ref):
    """A weak reference to a watched storage that knows its key (the storage's ``id``) and its
    last address."""

    __slots__ = ("key", "address")

    def __new__(cls, storage: Any, callback: Any, key: int) -> _Watch:
        return super().__new__(cls, storage, callback)

    def __init__(self, storage: Any, callback: Any, key: int) -> None:
        super().__init__(storage, callback)
        self.key = key
        self.address = 0


class _ValueSlot:
    """``torch.UntypedStorage``'s storage-value attribute while recording: reads and writes the
    value in the storage's ``__dict__`` (where it is without the descriptor) and tells the history
    of each write."""

    def __init__(self, history: History) -> None:
        from .buffer import STORAGE_ATTR

        self.name = STORAGE_ATTR
        self.history = history

    def __get__(self, storage: Any, owner: type | None = None) -> Any:
        if storage is None:
            return self
        try:
            return storage.__dict__[self.name]
        except KeyError:
            raise AttributeError(self.name) from None

    def __set__(self, storage: Any, value: Any) -> None:
        values = storage.__dict__
        had_value = self.name in values
        values[self.name] = value
        self.history.value_set(storage, value, had_value)

    def __delete__(self, storage: Any) -> None:
        try:
            del storage.__dict__[self.name]
        except KeyError:
            raise AttributeError(self.name) from None


# ----------------------------------------------------------------------------- helpers
def _live_storages() -> list:
    """The live tpu storages (none before the device started: no JAX imported to ask)."""
    from . import platform

    if not platform.is_initialized():
        return []
    from . import buffer

    return buffer.live_storages()


def _value_bytes(storage: Any, value: Any) -> int:
    """The bytes a storage holds with ``value`` (a padded value: its logical elements')."""
    from . import buffer

    if type(value) is buffer.Padded:
        return value.size * value.dtype.itemsize
    try:
        return buffer.nbytes(value)
    except (AttributeError, TypeError):  # (a value of another kind: the storage's own count)
        return storage.nbytes()


def _address(storage: Any) -> int:
    """The storage's handle (the C++ core's), else a number unique while it lives."""
    return storage.data_ptr() or id(storage)


def _stack() -> Stack:
    """The calling Python stack, innermost first, without this module's frames."""
    frames = []
    append = frames.append
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_filename != __file__:
            append(code)
            append(frame.f_lineno)
        frame = frame.f_back
    return tuple(frames)


class _FrameDicts(dict):
    """CUDA's frame dicts for a snapshot's stacks, each made once."""

    def __missing__(self, frame: tuple[CodeType, int]) -> dict:
        code, line = frame
        made = self[frame] = {"filename": code.co_filename, "line": line, "name": code.co_name}
        return made

    def of(self, stack: Stack) -> list[dict]:
        return [self[frame] for frame in zip(stack[::2], stack[1::2])]


def _segment(block: Block, frames: _FrameDicts) -> dict:
    stack = frames.of(block.frames)
    return {
        "device": block.device,
        "address": block.address,
        "total_size": block.size,
        "allocated_size": block.size,
        "active_size": block.size,
        "requested_size": block.size,
        "stream": 0,
        "segment_type": "small" if block.size <= _SMALL_SEGMENT else "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": stack,
        "blocks": [
            {
                "address": block.address,
                "size": block.size,
                "requested_size": block.size,
                "state": "active_allocated",
                "frames": list(stack),
            }
        ],
    }


def _entry(entry: tuple, frames: _FrameDicts) -> dict:
    action, addr, size, stack, time_us = entry  # (History._trace's tuple)
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 0,
        "frames": frames.of(stack),
        "time_us": time_us,
    }


# ----------------------------------------------------------------------------- the module's API
history = History()


def record(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    clear_history: bool = False,
    skip_actions: list[str] | None = None,
) -> None:
    """Start (``enabled`` "state" or "all") or stop (None) recording; the arguments are
    ``torch.cuda.memory._record_memory_history``'s, checked with its words."""
    _check(enabled, ENABLED, "expected state to be 'state', 'all', or None")
    _check(context, tuple(CONTEXTS), "expected context to be 'state', 'alloc', 'all', or None")
    _check(stacks, STACKS, "expected stacks to be 'python', or 'all'")
    if enabled is None:
        history.stop()
        return
    settings = Settings(enabled, CONTEXTS[context], max(1, int(max_entries)), frozenset(skip_actions or ()))
    history.start(settings, clear_history)


def _check(option: Any, valid: tuple, message: str) -> None:
    if option not in valid:
        raise RuntimeError(message)


def is_recording() -> bool:
    return history.settings.enabled is not None


def snapshot() -> dict:
    return history.snapshot()


def counts(index: int = 0) -> Counts:
    """The counts of ``tpu:index`` (zeros where nothing was ever recorded)."""
    with history.lock:
        known = history.counts[index]
        return Counts(dataclasses.replace(known.bytes), dataclasses.replace(known.blocks))
