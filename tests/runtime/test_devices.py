"""Several devices in one process: ``tpu:i`` is JAX's i-th local device.

XLA's CPU platform stands in for a multi-chip host through
``XLA_FLAGS=--xla_force_host_platform_device_count=4``, which must be set before JAX starts: each
scenario runs in one subprocess (they cost seconds each, so a scenario checks many things and
reports them as JSON; the tests below read it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FOUR_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MIXED = "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and tpu:1!"


def _run(code: str, tmp_path: Path, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        env={**os.environ, **FOUR_DEVICES, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"subprocess failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


STRICT = """
import io, json, sys
import torch, torch_tpu
from torch import nn

out = {}
def error(fn):
    try:
        fn()
    except Exception as e:
        return [type(e).__name__, str(e).splitlines()[0]]
    return None

# --- before the device starts: nothing imported, the cheap count
out["jax_at_import"] = "jax" in sys.modules
out["started_at_import"] = torch.tpu.is_initialized() or torch.accelerator.is_available() is not True
out["started_by_available"] = torch.tpu.is_initialized()
out["count"] = torch.tpu.device_count()
out["accelerator_count"] = torch.accelerator.device_count()

# --- creation on each device
made = {}
for i in range(4):
    d = f"tpu:{i}"
    made[d] = [str(t.device) for t in (
        torch.arange(3.0, device=d), torch.zeros(2, device=d), torch.empty(2, device=d),
        torch.full((2,), 7, device=d), torch.randn(2, device=d), torch.tensor([1, 2], device=d),
        torch.randperm(4, device=d), torch.eye(2, device=d),
    )]
out["made"] = made
out["values"] = [torch.arange(3.0, device=f"tpu:{i}").tolist() for i in range(4)]
out["bad_ordinal"] = error(lambda: torch.zeros(1, device="tpu:4"))

# --- copies between devices, and to and from the host
x = torch.randn(4, 5)
x0 = x.to("tpu:0")
x1 = x0.to("tpu:1")
x3 = x1.to("tpu:3")
y2 = torch.empty(4, 5, device="tpu:2")
y2.copy_(x1)
z2 = torch.zeros(5, 4, device="tpu:2")
z2.copy_(x1.t())
out["moves"] = {
    "devices": [str(t.device) for t in (x0, x1, x3, y2, x1.t().to("tpu:2"), x1.to("tpu:2", torch.float64))],
    "equal": [torch.equal(t.cpu(), x) for t in (x0, x1, x3, y2, z2.t())],
    "float64": torch.equal(x1.to("tpu:2", torch.float64).cpu(), x.double()),
    "view": torch.equal(x1[1:, 2:].to("tpu:3").cpu(), x[1:, 2:]),
    "from_host": str(torch.ones(2).to("tpu:2").device),
    "copy_from_host": torch.equal(torch.empty(4, 5, device="tpu:3").copy_(x).cpu(), x),
}

# --- ops run on their inputs' device
i1 = torch.tensor([0, 2], device="tpu:1")
results = {
    "arith": (x1 * 2 + 1, x * 2 + 1),
    "sum": (x1.sum(0), x.sum(0)),
    "view": (x1[1:, ::2].exp(), x[1:, ::2].exp()),
    "matmul": (x1 @ x1.t(), x @ x.t()),
    "cat": (torch.cat([x1, x1 * 3]), torch.cat([x, x * 3])),
    "index_cpu": (x1[torch.tensor([3, 1])], x[torch.tensor([3, 1])]),
    "index_tpu": (x1[i1], x[torch.tensor([0, 2])]),
    "where": (torch.where(x1 > 0, x1, 0.5), torch.where(x > 0, x, 0.5)),
    "like": (torch.zeros_like(x1) + torch.ones_like(x1), torch.ones_like(x)),
    "inplace": (x1.clone().add_(2.5).mul_(x1), (x + 2.5) * x),
}
out["ops"] = {k: [str(a.device), torch.allclose(a.cpu(), b, atol=1e-5)] for k, (a, b) in results.items()}

# --- mixing devices: PyTorch's error
out["mixed"] = {
    "add": error(lambda: x0 + x1),
    "cat": error(lambda: torch.cat([x0, x1])),
    "inplace": error(lambda: x0.clone().add_(x1)),
    "matmul": error(lambda: x0 @ x1.t()),
    "out": error(lambda: torch.add(x0, x0, out=torch.empty(4, 5, device="tpu:1"))),
}

# --- Python numbers: cached per device, runtime values (no recompiles)
from torch_tpu.runtime import platform
for t in (x0, x1):
    (t + 2.5).sum().item()
before = platform.compile_events["executables_built"]
sums = [(t + v).sum().item() for v in (7.25, 9.0) for t in (x0, x1)]
out["scalars_recompiles"] = platform.compile_events["executables_built"] - before
out["scalars_equal"] = all(abs(s - (x + v).sum().item()) < 1e-4 for s, v in zip(sums, (7.25, 7.25, 9.0, 9.0)))

# --- random streams: per device, reproducible and independent
torch.manual_seed(0)
a0, a1 = torch.randn(3, device="tpu:0").tolist(), torch.randn(3, device="tpu:1").tolist()
torch.manual_seed(0)
b1 = [torch.randn(3, device="tpu:1").tolist() for _ in range(3)]
b0 = torch.randn(3, device="tpu:0").tolist()
torch.tpu.manual_seed_all(0)
with torch.tpu.device(2):
    torch.tpu.manual_seed(5)  # only the current device
c2, c3 = torch.randn(3, device="tpu:2").tolist(), torch.randn(3, device="tpu:3").tolist()
g = torch.Generator(device="tpu:3").manual_seed(0)
out["random"] = {
    "reproducible": a1 == b1[0],
    "independent": a0 == b0 and b1[1] != b1[0],
    "same_seed_same_stream": a0 == a1,  # (as on CUDA: each device's default generator)
    "manual_seed_current_only": c2 != c3 and c3 == a0,
    "states": [torch.tpu.get_rng_state(i)[8:].view(torch.int64).item() for i in range(4)],
    "generator": torch.randn(3, device="tpu:3", generator=g).tolist() == a0,
    "default_generators": [str(g.device) for g in torch.tpu.default_generators],
}

# --- memory statistics per device
before = [torch.tpu.memory_allocated(i) for i in range(4)]
big = torch.ones(256, 1024, device="tpu:2") + 1  # 1 MiB
after = [torch.tpu.memory_allocated(i) for i in range(4)]
out["memory"] = {
    "grew": [a - b for a, b in zip(after, before)],
    "accelerator": torch.accelerator.memory_allocated(2) == after[2],
    "stats": torch.tpu.memory_stats(2)["allocated_bytes.all.current"] == after[2],
    "peak": torch.tpu.max_memory_allocated(2) >= after[2],
}
del big

# --- the current device
torch.tpu.set_device(1)
current = [
    torch.tpu.current_device(),
    str(torch.ones(1, device="tpu").device),
    str(torch.tensor([1.0], device="tpu").device),
]
with torch.tpu.device(3):
    inside = [
        torch.tpu.current_device(),
        str(torch.zeros(1, device="tpu").device),
        str(torch.ones(2).to("tpu").device),
    ]
current.append(torch.tpu.current_device())
torch.tpu.set_device(0)
out["current"] = {"set": current, "context": inside, "after": torch.tpu.current_device()}
for i in range(4):
    torch.tpu.synchronize(i)
out["synchronize_bad"] = error(lambda: torch.tpu.synchronize(4))

# --- serialization
buffer = io.BytesIO()
torch.save({"w": x1, "v": x3}, buffer)
buffer.seek(0)
kept = torch.load(buffer)
buffer.seek(0)
mapped = torch.load(buffer, map_location="tpu:2")
out["load"] = {
    "kept": [str(kept["w"].device), str(kept["v"].device)],
    "mapped": [str(mapped["w"].device), str(mapped["v"].device)],
    "equal": torch.equal(kept["w"].cpu(), x) and torch.equal(mapped["v"].cpu(), x),
}

# --- Module.to
torch.manual_seed(0)
layer = nn.Linear(5, 3)
weight = layer.weight
expected = layer(x)
layer.to("tpu:1")
on1 = layer(x1)
layer.to("tpu:2")
out["module"] = {
    "device": [str(on1.device), str(layer.weight.device), str(layer(x1.to("tpu:2")).device)],
    "same_parameter": layer.weight is weight,
    "equal": torch.allclose(on1.cpu(), expected, atol=1e-5),
}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def strict(tmp_path_factory) -> dict:
    return _run(STRICT, tmp_path_factory.mktemp("strict"))


def test_device_count_and_lazy_start(strict):
    assert strict["jax_at_import"] is False
    assert strict["started_at_import"] is False and strict["started_by_available"] is False
    assert strict["count"] == strict["accelerator_count"] == 4


def test_creation_on_each_device(strict):
    for device, made in strict["made"].items():
        assert set(made) == {device}, made
    assert strict["values"] == [[0.0, 1.0, 2.0]] * 4
    kind, message = strict["bad_ordinal"]
    assert kind == "RuntimeError" and "invalid device ordinal" in message and "tpu:4" in message


def test_copies_between_devices_keep_values(strict):
    moves = strict["moves"]
    assert moves["devices"] == ["tpu:0", "tpu:1", "tpu:3", "tpu:2", "tpu:2", "tpu:2"]
    assert all(moves["equal"]) and moves["float64"] and moves["view"] and moves["copy_from_host"]
    assert moves["from_host"] == "tpu:2"


def test_ops_run_on_their_inputs_device(strict):
    for name, (device, equal) in strict["ops"].items():
        assert device == "tpu:1" and equal, name


def test_mixing_devices_raises_pytorchs_error(strict):
    for name, raised in strict["mixed"].items():
        assert raised is not None, name
        kind, message = raised
        assert kind == "RuntimeError", name
        assert message in (MIXED, MIXED.replace("tpu:0 and tpu:1", "tpu:1 and tpu:0")), name


def test_python_numbers_are_per_device_and_never_recompile(strict):
    assert strict["scalars_recompiles"] == 0
    assert strict["scalars_equal"]


def test_random_streams_per_device(strict):
    random = strict["random"]
    assert random["reproducible"] and random["independent"] and random["same_seed_same_stream"]
    assert random["manual_seed_current_only"] and random["generator"]
    assert random["states"] == [0, 0, 1, 1]  # keys drawn from each device's generator since its seed
    assert random["default_generators"] == ["tpu:0", "tpu:1", "tpu:2", "tpu:3"]


def test_memory_statistics_per_device(strict):
    memory = strict["memory"]
    grew = memory["grew"]
    assert grew[2] >= 1 << 20 and grew[0] == grew[1] == grew[3] == 0, grew
    assert memory["accelerator"] and memory["stats"] and memory["peak"]


def test_current_device(strict):
    current = strict["current"]
    assert current["set"] == [1, "tpu:1", "tpu:1", 1]
    assert current["context"] == [3, "tpu:3", "tpu:3"]
    assert current["after"] == 0
    kind, message = strict["synchronize_bad"]
    assert kind == "RuntimeError" and "invalid device ordinal" in message


def test_serialization_keeps_or_maps_devices(strict):
    load = strict["load"]
    assert load["kept"] == ["tpu:1", "tpu:3"]
    assert load["mapped"] == ["tpu:2", "tpu:2"]
    assert load["equal"]


def test_module_to_another_device(strict):
    module = strict["module"]
    assert module["device"] == ["tpu:1", "tpu:2", "tpu:2"]
    assert module["same_parameter"] and module["equal"]


FUSED_AND_COMPILED = """
import json, sys
import torch, torch_tpu
from torch_tpu.execution import fused

out = {}
torch.manual_seed(0)
w, x = torch.randn(8, 8), torch.randn(4, 8)
expected = torch.relu(x @ w).sum(0) * 2

def step(a, b):
    return torch.relu(a @ b).sum(0) * 2

# --- fused graphs: on their inputs' device, one executable per device
runs = {}
with torch_tpu.eager_mode("fused"):
    w1, x1, w0, x0 = w.to("tpu:1"), x.to("tpu:1"), w.to("tpu:0"), x.to("tpu:0")
    torch.tpu.reset_compilation_cache_stats()
    for name, (a, b) in {"tpu:1": (x1, w1), "tpu:1 again": (x1, w1), "tpu:0": (x0, w0)}.items():
        y = step(a, b)
        runs[name] = [str(y.device), torch.allclose(y.cpu(), expected, atol=1e-5)]
    stats = torch.tpu.compilation_cache_stats()
    moved = step(x1, w1).to("tpu:2") + 1
    moved = [str(moved.device), torch.allclose(moved.cpu(), expected + 1, atol=1e-5)]
    recorded = x1 * 3
    try:
        x0 + x1  # refused when recorded, not when the graph runs
        mixed = None
    except RuntimeError as e:
        mixed = [str(e), fused.pending()]
    torch_tpu.sync()
out["fused"] = {
    "runs": runs, "misses": stats["misses"], "hits": stats["hits"], "moved": moved, "mixed": mixed
}

# --- torch.compile: the program runs on its inputs' device
compiled = torch.compile(step, backend="tpu")
runs = {}
for name, (a, b) in {"tpu:1": (x1, w1), "tpu:0": (x0, w0), "tpu:1 again": (x1, w1)}.items():
    y = compiled(a, b)
    runs[name] = [str(y.device), torch.allclose(y.cpu(), expected, atol=1e-5)]
def dropout(t):
    return torch.nn.functional.dropout(t, 0.5) + torch.arange(8.0, device=t.device)

dropped = torch.compile(dropout, backend="tpu")(torch.ones(4, 8, device="tpu:3"))
# the executables stored on disk, read back for their device (as in a new process)
torch._dynamo.reset()
hits = torch.tpu.compilation_cache_stats()["disk_hits"]
again = torch.compile(step, backend="tpu")(x1, w1)
runs["tpu:1 from disk"] = [str(again.device), torch.allclose(again.cpu(), expected, atol=1e-5)]
out["disk_hits"] = torch.tpu.compilation_cache_stats()["disk_hits"] - hits
kept = (dropped - torch.arange(8.0, device="tpu:3")).cpu().flatten().tolist()
out["compiled"] = {"runs": runs, "dropout": [str(dropped.device), sorted(set(kept))]}

# --- the model-parallel example in fused eager
sys.path.insert(0, sys.argv[1])
import model_parallel
out["model_parallel_fused"] = model_parallel.main(["--steps", "4", "--mode", "fused"])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fused_and_compiled(tmp_path_factory) -> dict:
    code = FUSED_AND_COMPILED.replace("sys.argv[1]", repr(str(EXAMPLES)))
    folder = tmp_path_factory.mktemp("fused")
    return _run(code, folder, TORCH_TPU_CACHE_DIR=str(folder / "cache"))  # (a fresh disk cache)


def test_fused_graphs_run_on_their_inputs_device(fused_and_compiled):
    fused = fused_and_compiled["fused"]
    assert fused["runs"] == {
        "tpu:1": ["tpu:1", True],
        "tpu:1 again": ["tpu:1", True],
        "tpu:0": ["tpu:0", True],
    }
    assert (fused["misses"], fused["hits"]) == (2, 1)  # the device is part of the graph's key
    assert fused["moved"] == ["tpu:2", True]
    message, pending = fused["mixed"]
    assert message == MIXED and pending > 0


def test_compiled_programs_run_on_their_inputs_device(fused_and_compiled):
    compiled = fused_and_compiled["compiled"]
    assert compiled["runs"] == {
        "tpu:1": ["tpu:1", True],
        "tpu:0": ["tpu:0", True],
        "tpu:1 again": ["tpu:1", True],
        "tpu:1 from disk": ["tpu:1", True],
    }
    assert fused_and_compiled["disk_hits"] >= 1
    device, values = compiled["dropout"]
    assert device == "tpu:3" and values == [0.0, 2.0]


def test_model_parallel_example_in_fused_eager(fused_and_compiled):
    assert fused_and_compiled["model_parallel_fused"] == 0
