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

_ABSENT = object()


class LRU:
    """A mapping that forgets its least recently used entries past ``maxsize``."""

    __slots__ = ("_entries", "maxsize")

    def __init__(self, maxsize: int | None = None):
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self.maxsize = config.cache_entries if maxsize is None else maxsize

    def get(self, key: Hashable, default: Any = None) -> Any:
        entries = self._entries
        value = entries.get(key, _ABSENT)  # (a miss without raising: many lookups miss)
        if value is _ABSENT:
            return default
        try:
            entries.move_to_end(key)
        except KeyError:  # (dropped meanwhile by another thread)
            pass
        return value

    def __setitem__(self, key: Hashable, value: Any) -> None:
        entries = self._entries
        entries[key] = value
        entries.move_to_end(key)
        while len(entries) > self.maxsize:
            entries.popitem(last=False)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def values(self):
        return self._entries.values()


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
