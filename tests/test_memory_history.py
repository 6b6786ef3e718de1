"""``torch.tpu.memory``'s memory history: CUDA's snapshot format, as ``torch.cuda._memory_viz``
reads it, recorded at the storages' allocation and death; nothing added while it is off."""

from __future__ import annotations

import base64
import importlib
import json
import pathlib
import pickle
import re

import pytest
import torch
from torch.cuda import _memory_viz

import torch_tpu
from torch_tpu.runtime.buffer import STORAGE_ATTR

ALLOC_ACTIONS = ("segment_alloc", "alloc")
FREE_ACTIONS = ("free_requested", "free_completed", "segment_free")


@pytest.fixture
def recording():
    torch.tpu.memory._record_memory_history(max_entries=10_000, clear_history=True)
    yield torch.tpu.memory
    torch.tpu.memory._record_memory_history(enabled=None)


def allocate_known_sizes() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kept = torch.empty(256, device="tpu")  # 1 KiB
    freed = torch.ones(64, 64, device="tpu")  # 16 KiB
    ids = torch.arange(3, device="tpu")  # 24 bytes
    return kept, freed, ids


def address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def names(frames: list[dict]) -> list[str]:
    return [f["name"] for f in frames]


def entries_at(snapshot: dict, addresses: set[int]) -> list[dict]:
    return [e for e in snapshot["device_traces"][0] if e["addr"] in addresses]


def allocate_and_free_one(memory) -> tuple[dict, dict[str, int], list[torch.Tensor]]:
    """The snapshot after allocating three tensors and freeing one, the tensors' addresses and
    the two kept."""
    kept, freed, ids = allocate_known_sizes()
    addresses = {"kept": address(kept), "freed": address(freed), "ids": address(ids)}
    del freed
    return memory._snapshot(), addresses, [kept, ids]


def test_torch_tpu_memory_is_a_submodule():
    assert importlib.import_module("torch.tpu.memory") is torch.tpu.memory is torch_tpu.memory
    assert torch.tpu.memory.memory_summary is torch.tpu.memory_summary
    assert torch.tpu.memory.memory_allocated is torch.tpu.memory_allocated
    assert callable(torch.tpu.memory_allocated)  # (the statistics kept their module)


def test_import_torch_is_enough_and_starts_nothing(run_python):
    out = run_python("""
        import sys, torch
        print(torch.tpu.memory._snapshot(), "jax" in sys.modules)
    """)
    assert out.split("\n")[0] == "{'segments': [], 'device_traces': [[]]} False"


def test_snapshot_holds_the_live_storages_with_their_sizes_and_stacks(recording):
    snapshot, addresses, (kept, ids) = allocate_and_free_one(recording)
    segments = {s["address"]: s for s in snapshot["segments"]}
    assert addresses["freed"] not in segments
    for name, tensor in (("kept", kept), ("ids", ids)):
        segment = segments[addresses[name]]
        nbytes = tensor.untyped_storage().nbytes()
        assert nbytes == tensor.nbytes
        assert (segment["total_size"], segment["allocated_size"], segment["device"]) == (nbytes, nbytes, 0)
        (block,) = segment["blocks"]
        assert (block["size"], block["requested_size"], block["state"]) == (
            nbytes,
            nbytes,
            "active_allocated",
        )
        assert block["address"] == addresses[name]
        assert "allocate_known_sizes" in names(block["frames"])
        assert block["frames"][0]["filename"].endswith(".py") and block["frames"][0]["line"] > 0


def test_trace_holds_allocations_then_the_free_in_order(recording):
    snapshot, addresses, (kept, ids) = allocate_and_free_one(recording)
    entries = entries_at(snapshot, set(addresses.values()))
    freed_size = 64 * 64 * 4
    expected = [
        *((a, addresses["kept"], kept.nbytes) for a in ALLOC_ACTIONS),
        *((a, addresses["freed"], freed_size) for a in ALLOC_ACTIONS),
        *((a, addresses["ids"], ids.nbytes) for a in ALLOC_ACTIONS),
        *((a, addresses["freed"], freed_size) for a in FREE_ACTIONS),
    ]
    assert [(e["action"], e["addr"], e["size"]) for e in entries] == expected
    times = [e["time_us"] for e in entries]
    assert times == sorted(times)
    for entry in entries:
        assert entry["stream"] == 0
        wanted = "allocate_and_free_one" if entry["action"] in FREE_ACTIONS else "allocate_known_sizes"
        assert wanted in names(entry["frames"]), entry


def test_allocations_the_cpp_core_makes_are_recorded(recording):
    """Repeated ops run from kept plans and fused graphs record their nodes in C++: their
    outputs are still storages given a value, so they are seen."""
    x = torch.ones(16, device="tpu")

    def repeated_adds() -> list[torch.Tensor]:
        return [x + i for i in range(6)]

    outputs = repeated_adds()
    with torch_tpu.eager_mode("fused"):
        fused = [x * i for i in range(3)]
        torch.tpu.synchronize()
    snapshot = recording._snapshot()
    segments = {s["address"]: s for s in snapshot["segments"]}
    for t in outputs + fused:
        assert segments[address(t)]["total_size"] == 64
    assert all("repeated_adds" in names(segments[address(t)]["blocks"][0]["frames"]) for t in outputs)


def test_a_resized_storage_is_freed_and_allocated_again(recording):
    t = torch.ones(8, device="tpu")
    storage = t.untyped_storage()
    at = storage.data_ptr()
    storage.resize_(0)
    storage.resize_(16)
    actions = [(e["action"], e["size"]) for e in entries_at(recording._snapshot(), {at})]
    assert actions == [
        *((a, 32) for a in ALLOC_ACTIONS),
        *((a, 32) for a in FREE_ACTIONS),
        *((a, 16) for a in ALLOC_ACTIONS),
    ]


def test_dumped_snapshot_renders_in_pytorchs_memory_viz(recording, tmp_path):
    _, addresses, kept = allocate_and_free_one(recording)
    path = tmp_path / "snapshot.pickle"
    recording._dump_snapshot(str(path))
    snapshot = pickle.loads(path.read_bytes())

    flamegraph = _memory_viz.segments(snapshot, format_flamegraph=lambda lines: lines)
    kept_line = next(line for line in flamegraph.splitlines() if f"seg_{addresses['kept']};" in line)
    assert "allocate_known_sizes" in kept_line and kept_line.endswith(" 1024")
    assert "allocate_known_sizes" in _memory_viz.memory(snapshot, format_flamegraph=lambda lines: lines)
    text = _memory_viz.trace(snapshot)
    assert f"cudaMalloc({addresses['freed']}, 16.0KiB)" in text and "del " in text
    assert "segments: " in _memory_viz.segsum(snapshot)  # (its accounting checks pass)
    for html in (_memory_viz.trace_plot(snapshot), _memory_viz.segment_plot(snapshot)):
        assert embedded_snapshot(html) == snapshot


def embedded_snapshot(html: str) -> dict:
    """The snapshot a ``_memory_viz`` HTML page carries for its viewer."""
    files = json.loads(re.search(r"const local_files = (\[.*\])", html).group(1))
    return pickle.loads(base64.b64decode(files[0]["base64"]))


def test_recording_off_adds_nothing_and_drops_the_history():
    torch.tpu.memory._record_memory_history()
    before_stop = torch.empty(8, device="tpu")
    torch.tpu.memory._record_memory_history(enabled=None)
    assert STORAGE_ATTR not in vars(torch.UntypedStorage)  # (the storages' own attribute again)
    after_stop = allocate_known_sizes()
    snapshot = torch.tpu.memory._snapshot()
    assert snapshot["device_traces"] == [[]]
    segments = {s["address"]: s for s in snapshot["segments"]}
    kept_stack = names(segments[address(before_stop)]["frames"])  # (kept, as CUDA keeps them)
    assert "test_recording_off_adds_nothing_and_drops_the_history" in kept_stack
    assert segments[address(after_stop[0])]["frames"] == []


def test_state_keeps_stacks_without_a_history_and_context_none_keeps_none():
    try:
        torch.tpu.memory._record_memory_history(enabled="state")
        kept, _, _ = allocate_known_sizes()
        snapshot = torch.tpu.memory._snapshot()
        assert snapshot["device_traces"] == [[]]
        segment = next(s for s in snapshot["segments"] if s["address"] == address(kept))
        assert "allocate_known_sizes" in names(segment["frames"])
        torch.tpu.memory._record_memory_history(context=None)
        kept, _, _ = allocate_known_sizes()
        (entry, *_) = entries_at(torch.tpu.memory._snapshot(), {address(kept)})
        assert entry["frames"] == []
    finally:
        torch.tpu.memory._record_memory_history(enabled=None)


def test_max_entries_keeps_the_last_and_skip_actions_drops(recording):
    recording._record_memory_history(max_entries=2, skip_actions=["segment_alloc"])
    kept, freed, ids = allocate_known_sizes()
    trace = recording._snapshot()["device_traces"][0]
    assert [(e["action"], e["addr"]) for e in trace] == [("alloc", address(freed)), ("alloc", address(ids))]


def test_the_bool_form_and_bad_arguments():
    try:
        torch.tpu.memory._record_memory_history(True, trace_alloc_max_entries=100)
        kept, _, _ = allocate_known_sizes()
        assert [e["action"] for e in entries_at(torch.tpu.memory._snapshot(), {address(kept)})] == [
            *ALLOC_ACTIONS
        ]
    finally:
        torch.tpu.memory._record_memory_history(False)
    assert STORAGE_ATTR not in vars(torch.UntypedStorage)
    with pytest.raises(RuntimeError, match="expected state to be 'state', 'all', or None"):
        torch.tpu.memory._record_memory_history("sometimes")
    with pytest.raises(RuntimeError, match="expected context"):
        torch.tpu.memory._record_memory_history(context="never")


def test_memory_summary_has_cudas_sections(recording):
    kept, freed, ids = allocate_known_sizes()
    summary = torch.tpu.memory_summary()
    for section in (
        "PyTorch TPU memory summary, device ID 0",
        "Cur Usage",
        "Peak Usage",
        "Tot Alloc",
        "Tot Freed",
        "Allocated memory",
        "Active memory",
        "Requested memory",
        "TPU reserved memory",
        "Allocations",
        "Active allocs",
        "memory history recording: on",
    ):
        assert section in summary, section
    assert all(len(line) == 77 for line in summary.splitlines())
    allocations = re.search(r"\| Allocations +\| +(\d+) +\| +(\d+) +\| +(\d+) +\| +(\d+)", summary)
    current, peak, allocated, freed_count = map(int, allocations.groups())
    assert allocated >= 3 and current <= peak
    assert "memory history" not in torch.tpu.memory_summary(abbreviated=True)


def test_the_profiling_docs_example_runs(tmp_path, monkeypatch):
    text = (pathlib.Path(__file__).parents[1] / "docs" / "profiling.md").read_text()
    section = text.split("## Memory history")[1].split("\n## ")[0]
    (snippet,) = [part.split("```")[0] for part in section.split("```python\n")[1:]]
    monkeypatch.chdir(tmp_path)
    try:
        exec(compile(snippet, "docs/profiling.md", "exec"), {})
    finally:
        torch.tpu.memory._record_memory_history(enabled=None)
    assert (tmp_path / "snapshot.pickle").stat().st_size > 0
