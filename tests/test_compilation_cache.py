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
