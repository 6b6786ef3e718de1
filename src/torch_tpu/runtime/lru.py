"""Bounded caches for everything torch_tpu keeps per shape, program or frame.

Each cache keeps at most ``TORCH_TPU_CACHE_ENTRIES`` entries (default 4096), dropping the least
recently used: a loop over thousands of distinct shapes (generation over every sequence length)
keeps memory bounded, at the price of recompiling a shape that comes back after being dropped.
"""

from __future__ import annotations

import collections
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
