"""The process state's owners: the flags the C++ core reads, and the caches' one owner."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import torch_tpu
from torch_tpu.runtime import native
from torch_tpu.runtime.flags import CoreFlags, flags
from torch_tpu.runtime.lru import LRU, Kind, caches

SRC = pathlib.Path(torch_tpu.__file__).parent


# ----------------------------------------------------------------------------- flags
def test_the_flags_start_as_a_fresh_process_has_them():
    fresh = CoreFlags()
    assert (fresh.attention_needed, fresh.others_used, fresh.recorded_ops) == (False, False, None)
    assert fresh.max_nodes == flags.max_nodes == 5000
    assert "max_nodes=5000" in repr(fresh)


@pytest.mark.skipif(not native.available(), reason="needs the C++ runtime core")
def test_the_core_refuses_flags_without_the_slots_it_reads():
    class Partial:
        __slots__ = ("attention_needed",)

    with pytest.raises(TypeError, match="no __slots__ entry others_used"):
        native._C.configure_flags(Partial())
    torch.testing.assert_close((torch.ones(3, device="tpu") * 2).cpu(), torch.full((3,), 2.0))


@pytest.mark.skipif(not native.available(), reason="needs the C++ runtime core")
def test_ops_recorded_by_the_core_join_the_flags_set(monkeypatch):
    from torch_tpu.ops import dispatch

    a = torch.ones(4, device="tpu")
    for _ in range(3):  # (a plan kept: later calls are the core's)
        torch.add(a, a)
    before = flags.recorded_ops
    try:
        seen = dispatch.record_ops()
        torch.add(a, a)
        assert flags.recorded_ops is seen and seen == {torch.ops.aten.add.Tensor}
    finally:
        dispatch.recording.restore(before)


def test_no_module_reads_the_flags_from_their_old_homes():
    """The flags moved out of module globals: nothing may read them there any more."""
    old = ("platform.others_used", "platform.attention_needed", "config.check_meta", "fused.max_nodes")
    for path in SRC.rglob("*.py"):
        if path.name == "flags.py":  # (check_meta starts from config's: the environment)
            continue
        text = path.read_text()
        for name in old:
            assert name not in text.replace(f"``{name}``", ""), f"{path.relative_to(SRC)} reads {name}"


# ----------------------------------------------------------------------------- caches
def _module_level_lrus(tree: ast.Module) -> list[str]:
    """Names bound at module level to ``LRU(...)`` directly (not through ``caches.lru``)."""
    found = []
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "LRU":
            found.append(ast.unparse(node).split("=")[0].strip())
    return found


def test_every_module_cache_belongs_to_the_owner():
    stray = {
        str(path.relative_to(SRC)): names
        for path in SRC.rglob("*.py")
        if (names := _module_level_lrus(ast.parse(path.read_text())))
    }
    assert not stray, f"module-level caches not made by caches.lru: {stray}"


def test_caches_clear_by_kind():
    sizes, churn = caches.lru("test.sizes", Kind.SIZES), caches.lru("test.churn", Kind.CHURN)
    try:
        sizes["a"] = churn["a"] = 1
        caches.clear(Kind.SIZES)
        assert (len(sizes), len(churn)) == (0, 1)
        assert caches.sizes()["test.churn"] == 1
        with pytest.raises(ValueError, match="already registered"):
            caches.register("test.churn", Kind.CHURN, LRU())
    finally:
        caches._registered.pop("test.sizes")
        caches._registered.pop("test.churn")


def test_reset_forgets_the_compiled_graphs_and_keeps_the_numbers():
    x = torch.arange(12.0, device="tpu").reshape(3, 4)
    with torch_tpu.eager_mode("fused"):
        expected = (x * 3 + 1).sum(0).cpu()
    assert caches.sizes()["fused.executables"] > 0
    torch.tpu.compiler.reset()
    assert caches.sizes()["fused.executables"] == 0
    with torch_tpu.eager_mode("fused"):
        torch.testing.assert_close((x * 3 + 1).sum(0).cpu(), expected, rtol=0, atol=0)
