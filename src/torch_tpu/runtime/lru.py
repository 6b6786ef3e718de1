"""Bounded caches for everything torch_tpu keeps per shape, program or frame, and their owner.

Each cache keeps at most ``TORCH_TPU_CACHE_ENTRIES`` entries (default 4096), dropping the least
recently used: a loop over thousands of distinct shapes (generation over every sequence length)
keeps memory bounded, at the price of recompiling a shape that comes back after being dropped.

Every such cache is made by and registered with :data:`caches`, under a name and a
:class:`Kind`, so that one object can list them and clear them by what they hold (tests start
afresh with ``caches.clear(Kind.SIZES)``; ``torch.tpu.compiler.reset()`` clears them all).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
from collections.abc import Callable, Hashable
from typing import Any

from .. import config


class LRU:
    """A mapping that forgets its least recently used entries past ``maxsize``.

    Recency is kept the "second chance" way (CLOCK): a hit only marks its entry used, and the
    entry is moved behind the others when it comes up for eviction, not at every hit. Moving
    an entry looks its key up again, which for the large keys of these caches (a graph's
    nodes, an op's arguments) costs as much as the hit itself. Evicted is the oldest entry not
    used since it was last moved: the least recently used one, or close to it.
    """

    __slots__ = ("_entries", "maxsize")

    def __init__(self, maxsize: int | None = None):
        self._entries: collections.OrderedDict = collections.OrderedDict()  # key -> [value, used]
        self.maxsize = config.cache_entries if maxsize is None else maxsize

    def get(self, key: Hashable, default: Any = None) -> Any:
        entry = self._entries.get(key)  # (a miss without raising: many lookups miss)
        if entry is None:
            return default
        entry[1] = True
        return entry[0]

    def __setitem__(self, key: Hashable, value: Any) -> None:
        entries = self._entries
        entries[key] = [value, False]
        entries.move_to_end(key)
        while len(entries) > self.maxsize:
            oldest, entry = entries.popitem(last=False)
            if entry[1] and oldest is not key:  # used since it was last moved: a second chance
                entry[1] = False
                entries[oldest] = entry

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def values(self):
        return (entry[0] for entry in self._entries.values())


def cached(fn: Callable) -> Callable:
    """``fn`` remembering its results in an :class:`LRU`, keyed by its (hashable) arguments.

    >>> @cached
    ... def square(n):
    ...     return n * n
    >>> square(3), len(square.cache)
    (9, 1)
    """
    cache, missing = LRU(), object()

    @functools.wraps(fn)
    def remembered(*args: Hashable) -> Any:
        value = cache.get(args, missing)
        if value is missing:
            value = cache[args] = fn(*args)
        return value

    remembered.cache = cache
    return remembered


# ----------------------------------------------------------------------------- the owner
class Kind(enum.Enum):
    """What a cache holds, which says what clearing it costs."""

    PROGRAMS = "compiled programs (dropping one costs a compile, or a persistent-cache read)"
    TRACES = "what tracing worked out: output shapes, recorded nodes, view plans (a retrace)"
    CONSTANTS = "small device values kept for reuse (a transfer)"
    SIZES = "learned: which dimensions change size (padded to buckets once they do)"
    CHURN = "learned: which fused ops change shape from graph to graph (run on their own)"


@dataclasses.dataclass(frozen=True)
class Registered:
    """One cache the owner knows: its name (``module.what``), its kind and the cache itself
    (anything with ``clear()`` and ``len()``)."""

    name: str
    kind: Kind
    cache: Any


class Caches:
    """The owner of torch_tpu's in-process caches (one instance, :data:`caches`)."""

    def __init__(self) -> None:
        self._registered: dict[str, Registered] = {}
        self._on_clear: list[tuple[Kind, Callable[[], None]]] = []

    def lru(self, name: str, kind: Kind, maxsize: int | None = None) -> LRU:
        """A new :class:`LRU`, registered as ``name``."""
        return self.register(name, kind, LRU(maxsize))

    def register(self, name: str, kind: Kind, cache: Any) -> Any:
        """Own ``cache`` (a mapping, or anything with ``clear()`` and ``len()``); returns it."""
        if name in self._registered:
            raise ValueError(f"a cache named {name!r} is already registered")
        self._registered[name] = Registered(name, kind, cache)
        return cache

    def on_clear(self, kind: Kind, forget: Callable[[], None]) -> None:
        """Call ``forget`` too whenever caches of ``kind`` are cleared (state kept beside them)."""
        self._on_clear.append((kind, forget))

    def clear(self, *kinds: Kind) -> None:
        """Clear the caches of these kinds (every cache when none is named)."""
        chosen = set(kinds or Kind)
        for registered in self._registered.values():
            if registered.kind in chosen:
                registered.cache.clear()
        for kind, forget in self._on_clear:
            if kind in chosen:
                forget()

    def sizes(self) -> dict[str, int]:
        """Each cache's number of entries, by name."""
        return {name: len(registered.cache) for name, registered in self._registered.items()}


#: The process's caches.
caches = Caches()
