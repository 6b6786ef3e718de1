"""The persistent compilation cache (``TORCH_TPU_CACHE_DIR``): a damaged entry is replaced once,
an entry is used only for its own key, and a copied or moved directory still hits.

Each test runs small programs in fresh processes (the cache is read and written across
processes) against its own temporary cache directory.
"""

from __future__ import annotations

import json
import shutil

import pytest

from torch_tpu.runtime import compilation_cache as _compilation_cache

_PROGRAM = """
    import json, torch, torch_tpu
    x = torch.arange(1.0, 6.0).to("tpu")
    values = {{op: getattr(torch, op)(x, 0).tolist() for op in {ops!r}}}
    stats = torch.tpu.compilation_cache_stats()
    print(json.dumps(dict(values=values, disk_hits=stats["disk_hits"],
                          xla_compiles=stats["xla_compiles"])))
"""
_EXPECTED = {"cumsum": [1.0, 3.0, 6.0, 10.0, 15.0], "cumprod": [1.0, 2.0, 6.0, 24.0, 120.0]}
_WARNING = "compilation cache entry"


@pytest.fixture
def run_ops(run_python):
    """``run_ops(cache_dir, *ops)``: run ``ops`` on tpu in a new process using ``cache_dir``;
    returns (its disk hits, its XLA compilations, the cache warnings it logged), after checking
    the values."""

    def run(cache_dir, *ops):
        out, err = run_python(
            _PROGRAM.format(ops=ops), capture_stderr=True, TORCH_TPU_CACHE_DIR=str(cache_dir)
        )
        result = json.loads(out)
        assert result["values"] == {op: _EXPECTED[op] for op in ops}
        assert "Error reading persistent compilation cache" not in err  # JAX's own warning
        return result["disk_hits"], result["xla_compiles"], err.count(_WARNING)

    return run


def _entries(directory) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in directory.iterdir()}


def test_damaged_entries_are_reported_once_and_rewritten(run_ops, tmp_path):
    cache = tmp_path / "cache"
    _, compiles, _ = run_ops(cache, "cumsum")
    truncated, flipped = sorted(cache.iterdir())[:2]
    truncated.write_bytes(truncated.read_bytes()[:100])
    damaged = bytearray(flipped.read_bytes())
    damaged[-10] ^= 0xFF
    flipped.write_bytes(bytes(damaged))

    assert run_ops(cache, "cumsum") == (compiles - 2, 2, 2)  # both recompiled, each reported
    assert run_ops(cache, "cumsum") == (compiles, 0, 0)  # and rewritten: everything hits


def test_an_entry_is_used_only_for_its_own_key(run_ops, tmp_path):
    """Entries of cumsum and cumprod swapped between their files are rejected (they used to run
    the other op), then replaced by the right ones."""
    cache = tmp_path / "cache"
    run_ops(cache, "cumsum")
    sum_entries = _entries(cache)
    shutil.rmtree(cache)
    run_ops(cache, "cumprod")
    prod_entries = _entries(cache)
    (sum_only,) = sum_entries.keys() - prod_entries.keys()
    (prod_only,) = prod_entries.keys() - sum_entries.keys()
    (cache / sum_only).write_bytes(prod_entries[prod_only])
    (cache / prod_only).write_bytes(sum_entries[sum_only])

    hits, compiles, warnings = run_ops(cache, "cumsum", "cumprod")
    assert (compiles, warnings) == (2, 2) and hits == len(sum_entries) - 1
    assert run_ops(cache, "cumsum", "cumprod") == (len(sum_entries) + 1, 0, 0)


def test_a_copied_or_moved_directory_still_hits(run_ops, tmp_path):
    original, copied, moved = tmp_path / "original", tmp_path / "copied", tmp_path / "moved"
    _, compiles, _ = run_ops(original, "cumsum")
    shutil.copytree(original, copied)
    assert run_ops(copied, "cumsum") == (compiles, 0, 0)
    shutil.move(original, moved)
    assert run_ops(moved, "cumsum") == (compiles, 0, 0)


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda entry: entry[:-1], "checksum"),
        (lambda entry: entry[:30], "truncated"),
        (lambda entry: b"\x28\xb5\x2f\xfd" + entry, "bad header"),  # a bare zstd frame (JAX's format)
        (
            lambda entry: _compilation_cache.pack("jit_g-2", _compilation_cache.unpack("jit_f-1", entry)),
            "another key",
        ),
    ],
)
def test_unpack_rejects_what_pack_did_not_write_for_the_key(damage, reason):
    entry = _compilation_cache.pack("jit_f-1", b"executable bytes")
    assert _compilation_cache.unpack("jit_f-1", entry) == b"executable bytes"
    with pytest.raises(_compilation_cache.InvalidEntry, match=reason):
        _compilation_cache.unpack("jit_f-1", damage(entry))


# ----------------------------------------------------------------------------- shared compiles
SHARED_WORK = """
    import json, sys, time
    import jax
    seen = {"compiles": 0, "hits": 0}
    jax.monitoring.register_event_duration_secs_listener(
        lambda e, d, **_: seen.__setitem__("compiles", seen["compiles"] + 1)
        if e == "/jax/core/compile/backend_compile_duration" else None)
    jax.monitoring.register_event_listener(
        lambda e, **_: seen.__setitem__("hits", seen["hits"] + 1)
        if e == "/jax/compilation_cache/cache_hits" else None)
    import torch, torch_tpu
    while time.time() < float(sys.argv[1]):  # (both processes start compiling together)
        time.sleep(0.001)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.Linear(48, 24)).to("tpu")
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(12, 24, device="tpu")
    for _ in range(2):
        model(x).pow(2).mean().backward(); opt.step(); opt.zero_grad()
    print(json.dumps({"compiled": seen["compiles"] - seen["hits"], "loss": float(model(x).detach().sum())}))
"""


def _run_together(tmp_path, cache, count: int) -> list[dict]:
    import os
    import subprocess
    import sys
    import textwrap
    import time

    script = tmp_path / "work.py"
    script.write_text(textwrap.dedent(SHARED_WORK))
    start = str(time.time() + 6 if count > 1 else 0)  # (after both have imported torch_tpu)
    environ = {**os.environ, "TORCH_TPU_CACHE_DIR": str(cache)}
    runs = [
        subprocess.Popen([sys.executable, str(script), start], env=environ, stdout=subprocess.PIPE, text=True)
        for _ in range(count)
    ]
    outs = [run.communicate(timeout=300)[0] for run in runs]
    assert all(run.returncode == 0 for run in runs)
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def test_processes_sharing_the_directory_compile_each_program_once(tmp_path):
    (alone,) = _run_together(tmp_path, tmp_path / "alone", 1)
    together = _run_together(tmp_path, tmp_path / "shared", 2)
    assert sum(r["compiled"] for r in together) == alone["compiled"] > 0
    assert {r["loss"] for r in together} == {alone["loss"]}
    assert not list((tmp_path / "shared").glob("*.compiling"))  # (every claim released)


class _FakePayloads:
    """ExecutableCache's payloads stand for themselves (no XLA executable inside)."""

    @staticmethod
    def install(monkeypatch):
        monkeypatch.setattr(_compilation_cache, "note_executable", lambda executable: None)
        monkeypatch.setattr(_compilation_cache.jax_compilation_cache, "decompress_executable", lambda p: p)


def test_a_miss_waits_for_the_entry_another_live_process_is_compiling(tmp_path, monkeypatch):
    import os
    import subprocess
    import threading
    import time

    _FakePayloads.install(monkeypatch)
    cache = _compilation_cache.ExecutableCache(str(tmp_path), wait_seconds=60)
    holder = subprocess.Popen(["sleep", "30"])  # (a live process of this host holds the claim)
    try:
        (tmp_path / "k.compiling").write_text(f"{os.uname().nodename} {holder.pid}")
        writer = _compilation_cache.VerifiedFileCache(str(tmp_path))
        threading.Timer(0.5, writer.put, ("k", b"compiled elsewhere")).start()
        started = time.monotonic()
        assert cache.get("k") == b"compiled elsewhere"
        assert time.monotonic() - started >= 0.4
    finally:
        holder.kill()
        holder.wait()


def test_a_claim_of_a_dead_process_is_taken_over_and_released_after_the_compile(tmp_path, monkeypatch):
    import os
    import subprocess

    _FakePayloads.install(monkeypatch)
    cache = _compilation_cache.ExecutableCache(str(tmp_path), wait_seconds=60)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / "k.compiling").write_text(f"{os.uname().nodename} {gone.pid}")
    assert cache.get("k") is None  # (this process compiles it)
    assert (tmp_path / "k.compiling").read_text().split()[1] == str(os.getpid())
    cache.put("k", b"compiled here")
    assert not (tmp_path / "k.compiling").exists() and cache.get("k") == b"compiled here"


def test_a_compile_that_raises_releases_its_claim(tmp_path, monkeypatch):
    _FakePayloads.install(monkeypatch)
    cache = _compilation_cache.ExecutableCache(str(tmp_path), wait_seconds=60)
    monkeypatch.setattr(_compilation_cache.jax_compilation_cache, "_cache", cache)

    def failing_compile():
        assert cache.get("k") is None
        raise RuntimeError("XLA failed")

    with pytest.raises(RuntimeError, match="XLA failed"):
        _compilation_cache._release_claims_after(failing_compile)()
    assert not (tmp_path / "k.compiling").exists()
