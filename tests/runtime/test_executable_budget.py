"""A process that loads ever more executables stays under the kernel's memory-mapping limit: past
the budget the in-memory compilation caches are cleared, and results stay right."""

from __future__ import annotations

import pytest
import torch

import torch_tpu
from torch_tpu.runtime import executable_budget

pytestmark = pytest.mark.skipif(executable_budget.limit is None, reason="no /proc/self/maps here")

#: mappings allowed above the count at the test's start before the caches must be cleared
_ROOM = 100


def _sums(lengths) -> list[int]:
    # each length compiles its own four programs (arange, the arithmetic, the sum)
    return [(torch.arange(n, device="tpu") * 3 + 1).sum().item() for n in lengths]


def test_executables_are_released_past_the_mapping_budget(monkeypatch):
    # (many executables are the point here: without size buckets, each length compiles its own)
    monkeypatch.setattr(torch_tpu.config, "buckets", False)
    start = executable_budget.mapping_count()
    monkeypatch.setattr(executable_budget, "limit", int((start + _ROOM) / executable_budget.BUDGET))
    monkeypatch.setattr(executable_budget, "CHECK_EVERY", 8)
    trims = torch.tpu.compilation_cache_stats()["cache_trims"]
    lengths = range(1, 41)

    sums = _sums(lengths)

    assert torch.tpu.compilation_cache_stats()["cache_trims"] > trims
    # without the trims, the ~160 executables built here add ~500 mappings
    assert executable_budget.mapping_count() < start + 2.5 * _ROOM
    assert sums == [sum(3 * i + 1 for i in range(n)) for n in lengths]
    assert _sums([7, 40]) == [70, 2380]  # programs cleared from memory run again
