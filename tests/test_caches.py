"""In-process caches are bounded (``TORCH_TPU_CACHE_ENTRIES``): a loop over ever new shapes keeps
a fixed number of compiled graphs, programs, shape signatures and constants."""

from __future__ import annotations

import json

from torch_tpu.runtime.lru import LRU


def test_lru_forgets_the_least_recently_used():
    cache = LRU(maxsize=2)
    cache["a"], cache["b"] = 1, 2
    assert cache.get("a") == 1  # "a" is now the most recent
    cache["c"] = 3
    assert "b" not in cache and cache.get("a") == 1 and cache.get("c") == 3 and len(cache) == 2


def test_a_loop_over_new_lengths_keeps_the_caches_bounded(run_python):
    out = run_python(
        """
        import json, torch, torch_tpu
        from torch_tpu.execution import fused
        from torch_tpu.runtime import devices
        step = torch.compile(lambda x: (x.sin() * 2).sum(), backend="tpu", dynamic=False)
        sizes = {}
        with torch_tpu.eager_mode("fused"):
            for n in range(1, 13):  # 12 lengths (8 are kept), as a generation loop sees them
                x = torch.arange(float(n), device="tpu")
                (x.cos() + n * 0.5).sum().item()  # a new graph and a new constant each time
        for n in range(1, 13):
            step(torch.ones(n, device="tpu")).item()
        programs = [len(p._executables) for p in __import__("gc").get_objects()
                    if type(p).__name__ == "Program"]
        print(json.dumps({"graphs": len(fused._executables), "shapes": len(fused._shapes),
                          "nodes": len(fused._nodes), "scalars": len(devices.local.first.scalars),
                          "program": max(programs, default=0)}))
    """,
        TORCH_TPU_CACHE_ENTRIES="8",
    )
    sizes = json.loads(out)
    assert all(0 < n <= 8 for n in sizes.values()), sizes


def test_cached_functions_keep_their_results_in_a_bounded_lru():
    import doctest

    from torch_tpu.runtime import lru

    assert doctest.testmod(lru).failed == 0
    calls = []
    square = lru.cached(lambda n: calls.append(n) or n * n)
    square.cache.maxsize = 2
    assert [square(n) for n in (1, 2, 1, 3, 1, 2)] == [1, 4, 1, 9, 1, 4]
    assert calls == [1, 2, 3, 2]  # 2 was the least recently used when 3 came


def test_an_entry_used_between_insertions_outlives_the_entries_inserted_around_it():
    from torch_tpu.runtime.lru import LRU

    cache = LRU(maxsize=3)
    cache["hot"] = "kept"
    for n in range(50):  # a step's graph, used again while one-off entries come and go
        assert cache.get("hot") == "kept"
        cache[n] = n
        assert len(cache) <= 3
    assert "hot" in cache and cache.get(0) is None and cache.get(49) == 49
    assert sorted(cache.values(), key=str) == [48, 49, "kept"]
