"""Loading executables from the persistent caches never takes a process past the kernel's limit on
memory mappings (``vm.max_map_count``), where XLA:CPU segfaults in ``deserialize_executable``.

XLA:CPU maps ~3 regions per object file (kernel) of each executable it loads, and a fused graph
has dozens: the mapping count is read again after every so many mappings loaded
(``compilation_cache.MappingWatch``), not only after every 256 executables
(``executable_budget``), and past the budget the in-memory caches are trimmed before the next op.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax._src import compilation_cache as jax_compilation_cache
from jax.experimental.serialize_executable import deserialize_and_load, serialize

from torch_tpu.runtime import compilation_cache, executable_budget, platform

pytestmark = pytest.mark.skipif(executable_budget.limit is None, reason="no /proc/self/maps here")

#: kernels in the test's program: XLA:CPU compiles one per output (each has its own shape)
_KERNELS = 40


def _many_kernels(*xs):
    return [jnp.sin(x) * 3 + 1 for x in xs]


@pytest.fixture(scope="module")
def compiled() -> jax.stages.Compiled:
    """A program of :data:`_KERNELS` kernels, compiled by XLA (one loaded from the persistent
    cache serializes without its object files)."""
    lowered = jax.jit(_many_kernels).lower(*[jnp.ones((n + 1, 3)) for n in range(_KERNELS)])
    with compilation_cache.reads_bypassed():
        return lowered.compile()


def _payload(compiled: jax.stages.Compiled) -> bytes:
    """What JAX's persistent cache stores for ``compiled``."""
    executable = compiled.runtime_executable()
    serialized = executable.client.serialize_executable(executable)
    return jax_compilation_cache.compress_executable(
        jax_compilation_cache.combine_executable_and_time(serialized, 1)
    )


def test_the_mappings_of_a_load_are_known_before_it(compiled):
    stored = serialize(compiled)  # (as torch.compile's graphs are stored)
    before = executable_budget.mapping_count()
    loaded = deserialize_and_load(*stored)
    mapped = executable_budget.mapping_count() - before
    del loaded

    assert mapped >= 2 * _KERNELS  # (what the budget's "~3 per executable" misses)
    assert abs(compilation_cache.mappings_to_load(stored[0]) - mapped) <= 0.1 * mapped + 3
    # JAX's persistent cache holds the same executable, compressed
    payload = jax_compilation_cache.decompress_executable(_payload(compiled))
    assert compilation_cache.mappings_to_load(payload) == compilation_cache.mappings_to_load(stored[0])


def test_loads_past_the_budget_trim_long_before_the_limit(compiled, tmp_path, monkeypatch):
    """A process just under the budget loads one multi-kernel entry after another (a warm cache):
    a trim is asked for once the budget is crossed, long before the mappings reach the limit.
    Counted per executable (every 256), the loads would have gone past the limit first."""
    per_load = compilation_cache.mappings_to_load(
        jax_compilation_cache.decompress_executable(_payload(compiled))
    )
    limit = 65530
    budget = executable_budget.BUDGET * limit
    mappings = {"count": int(budget) - 10 * per_load}  # (the loads' own, simulated)
    trims = []
    monkeypatch.setattr(executable_budget, "limit", limit)
    monkeypatch.setattr(executable_budget, "mapping_count", lambda: mappings["count"])
    monkeypatch.setattr(platform, "request_attention", lambda job: trims.append(mappings["count"]))
    monkeypatch.setattr(compilation_cache, "mapping_watch", compilation_cache.MappingWatch())
    cache = compilation_cache.ExecutableCache(str(tmp_path))
    cache.put("jit__many_kernels-1", _payload(compiled))

    for _ in range(executable_budget.CHECK_EVERY - 1):
        assert cache.get("jit__many_kernels-1") is not None
        if trims:
            break
        mappings["count"] += per_load  # (JAX loads the entry)

    assert trims, f"no trim asked for: {mappings['count']} mappings of at most {limit}"
    assert trims[0] <= budget + limit // 16 + per_load


_PAST_THE_BUDGET = """
    import ctypes
    import jax, jax.numpy as jnp, torch, torch_tpu
    from torch_tpu.runtime import executable_budget, platform

    def program(*xs):  # a kernel per output: ~3 mappings each when loaded
        return [jnp.sin(x) * 3 + 1 for x in xs]

    args = [jnp.ones((n + 1, 3)) for n in range(60)]
    torch.ones(1, device="tpu").add_(1)
    jax.jit(program)(*args)  # compiled and written to the cache
    held = []  # as JAX's caches hold every jitted function's executables until a trim

    def load():
        held.append(jax.jit(lambda *xs: program(*xs)))  # (a new function: loaded from the cache)
        held[-1](*args)
        torch.ones(1, device="tpu").add_(1)  # (an op: a trim asked for runs before it)

    before = executable_budget.mapping_count()
    load()
    cost = executable_budget.mapping_count() - before
    # what else the process holds, up to 40 loads from the limit (every other page read-only:
    # a mapping per page)
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    pages = executable_budget.limit - 40 * cost - executable_budget.mapping_count()
    base = libc.mmap(None, pages * 4096, 3, 0x22, -1, 0)  # read-write, MAP_PRIVATE | MAP_ANONYMOUS
    for page in range(0, pages, 2):
        libc.mprotect(base + page * 4096, 4096, 1)
    for _ in range(80):
        load()
    print(platform.compile_events["cache_trims"])
"""


@pytest.mark.slow
@pytest.mark.skipif((executable_budget.limit or 0) > 262144, reason="filling the mappings takes long")
def test_a_process_loading_past_the_budget_survives(run_python, tmp_path):
    """The crash itself, in a process whose other mappings (made since the mappings were last
    read) leave room for 40 loads of a program of 60 kernels: it loads 80 from the warm cache
    (without the trims it dies at the 41st)."""
    assert int(run_python(_PAST_THE_BUDGET, TORCH_TPU_CACHE_DIR=str(tmp_path / "cache"))) > 0
