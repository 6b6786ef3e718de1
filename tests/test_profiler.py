"""torch.profiler on tpu: XLA program runs as device events tied to the ops that launched them,
compiles as host events, memory per op, traces that Perfetto and TensorBoard open."""

import glob
import json

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

import torch_tpu
from torch_tpu.execution import fused
from torch_tpu.runtime import native, profiling

pytestmark = pytest.mark.skipif(not native.available(), reason="the C++ core registers the profiler")

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
#: the ops of the step below that compute on the device (a program each in strict eager)
COMPUTING = {"aten::addmm", "aten::relu", "aten::mse_loss", "aten::mse_loss_backward", "aten::mm"}


def _training(compiled: bool = False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("tpu")
    forward = torch.compile(model, backend="tpu") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, target = torch.randn(8, 16, device="tpu"), torch.randn(8, 4, device="tpu")

    def step() -> float:
        loss = torch.nn.functional.mse_loss(forward(x), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    return step


def _profiled(step, **options):
    step(), step()  # (compiled and warm: the profiled step runs what a loop runs)
    with profile(activities=ACTIVITIES, **options) as prof:
        step()
    return prof


def _device_events(prof) -> list:
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def _trace(prof, tmp_path) -> list[dict]:
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def test_strict_step_every_computing_op_has_device_time():
    prof = _profiled(_training())
    timed = {e.key: e.self_device_time_total for e in prof.key_averages() if e.self_device_time_total > 0}
    assert COMPUTING <= timed.keys(), sorted(timed)
    assert sum(timed[op] for op in COMPUTING) > 0
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=5)
    assert "Self TPU" in table


def test_strict_device_events_are_linked_to_their_op(tmp_path):
    prof = _profiled(_training())
    trace = _trace(prof, tmp_path)
    ops = {e["args"]["External id"]: e["name"] for e in trace if e.get("cat") == "cpu_op" and "args" in e}
    kernels = [e for e in trace if e.get("cat") == "kernel"]
    assert kernels and all(e["pid"] == 0 and e["dur"] >= 0 for e in kernels)
    launched_by = {ops.get(e["args"].get("External id")) for e in kernels}
    assert COMPUTING <= launched_by, sorted(map(str, launched_by))
    linked = [e for e in kernels if "External id" in e["args"]]
    assert all(e["args"]["op"] == ops[e["args"]["External id"]] for e in linked)  # (named on the event)
    names = {e["args"]["name"] for e in trace if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert "tpu:0" in names


def _args(trace: list[dict], name: str, category: str) -> list[dict]:
    """The arguments (metadata) of the trace's events of that name and category."""
    return [e["args"] for e in trace if e.get("name") == name and e.get("cat") == category]


def test_fused_step_has_one_device_event_per_graph_run(tmp_path):
    step = _training()
    with torch_tpu.eager_mode("fused"):
        step(), step()
        before = fused.stats.graphs_run
        with profile(activities=ACTIVITIES) as prof:
            step()
        ran = fused.stats.graphs_run - before
    graphs = [e for e in _device_events(prof) if e.name == profiling.FUSED_GRAPH]
    assert ran > 0 and len(graphs) == ran
    flushes = [
        e for e in prof.events() if e.name == profiling.FUSED_GRAPH and e.device_type == DeviceType.CPU
    ]
    assert len(flushes) == ran
    meta = _args(_trace(prof, tmp_path), profiling.FUSED_GRAPH, "kernel")
    assert len(meta) == ran
    ops = ", ".join(m["ops"] for m in meta)
    assert "aten.addmm.default" in ops and "aten.mse_loss_backward.default" in ops
    assert all(m["reason"] for m in meta)


def test_compiled_step_runs_its_program_on_the_device():
    prof = _profiled(_training(compiled=True))
    device = _device_events(prof)
    assert device and all(e.time_range.elapsed_us() >= 0 for e in device)
    assert sum(e.self_device_time_total for e in prof.key_averages()) > 0


def test_a_new_shape_compiles_as_a_host_event_with_its_reason(tmp_path):
    import time

    # (a shape no other test, nor an earlier run, compiled: not in the disk cache either)
    x = torch.ones(3, 37, 1000 + time.time_ns() % 9973, device="tpu")
    with profile(activities=ACTIVITIES) as prof:
        (x * 5).sum().item()
    compiles = [e for e in prof.events() if e.name == profiling.COMPILE]
    assert compiles and all(e.time_range.elapsed_us() > 0 for e in compiles)
    reasons = _args(_trace(prof, tmp_path), profiling.COMPILE, "privateuse1_runtime")
    assert len(reasons) == len(compiles) and all(r["reason"] for r in reasons)


def test_profile_memory_and_record_shapes():
    x = torch.ones(64, 64, device="tpu")
    (x @ x).sum().item()
    with profile(activities=ACTIVITIES, profile_memory=True, record_shapes=True) as prof:
        y = x @ x
        del y
    mm = [e for e in prof.events() if e.name == "aten::mm"]
    assert mm and mm[0].device_memory_usage == 64 * 64 * 4 and mm[0].input_shapes == [[64, 64], [64, 64]]
    freed = [e for e in prof.events() if e.name == "[memory]" and e.device_memory_usage < 0]
    assert freed
    averages = prof.key_averages(group_by_input_shape=True).table(sort_by="self_device_time_total")
    assert "[[64, 64], [64, 64]]" in averages


def test_tensorboard_trace_handler_writes_a_tpu_track(tmp_path):
    x = torch.ones(16, device="tpu")
    with profile(activities=ACTIVITIES, on_trace_ready=tensorboard_trace_handler(str(tmp_path))):
        (x + 1).sum().item()
    (path,) = glob.glob(str(tmp_path / "*.pt.trace.json"))
    trace = json.load(open(path))["traceEvents"]
    assert any(e.get("cat") == "kernel" and e.get("pid") == 0 for e in trace)


def test_cpu_only_profiling_leaves_the_device_alone():
    x = torch.ones(16, device="tpu")
    seen = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        seen.append(profiling.active)
        (x + 1).sum().item()
    assert seen == [False] and not _device_events(prof)
    assert any(e.name == "aten::add" for e in prof.events())


def test_sessions_in_a_row_each_hold_their_own_runs():
    x = torch.ones(16, device="tpu")
    counts = []
    for n in (1, 3):
        with profile(activities=ACTIVITIES) as prof:
            for _ in range(n):
                (x + 1).sum().item()
        counts.append(sum(1 for e in _device_events(prof) if e.name == "jit_add"))
    assert counts == [1, 3] and not profiling.active


def test_a_jax_trace_already_running_costs_only_the_device_events(tmp_path):
    import jax

    x = torch.ones(16, device="tpu")
    jax.profiler.start_trace(str(tmp_path))
    try:
        with profile(activities=ACTIVITIES) as prof:
            (x + 1).sum().item()
    finally:
        jax.profiler.stop_trace()
    assert any(e.name == "aten::add" for e in prof.events())
    assert not profiling.active


def test_xla_trace_dir_keeps_xla_own_trace(tmp_path, monkeypatch):
    from jax.profiler import ProfileData

    from torch_tpu import config

    monkeypatch.setattr(config, "xla_trace_dir", str(tmp_path))
    x = torch.ones(16, device="tpu")
    with profile(activities=ACTIVITIES):
        (x + 1).sum().item()
    (path,) = glob.glob(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))
    modules = {
        dict(e.stats).get("hlo_module")
        for plane in ProfileData.from_file(path).planes
        for line in plane.lines
        for e in line.events
    }
    assert "jit_add" in modules


def test_with_stack_names_the_user_line():
    from torch._C._profiler import _ExperimentalConfig

    x = torch.ones(16, device="tpu")
    (x + 1).sum().item()  # (torch's Python tracer misnames modules imported while it records)
    with profile(
        activities=ACTIVITIES, with_stack=True, experimental_config=_ExperimentalConfig(verbose=True)
    ) as prof:
        (x + 1).sum().item()
    (add,) = [e for e in prof.events() if e.name == "aten::add"]
    assert any("test_profiler.py" in frame for frame in add.stack), add.stack
    assert add.device_time_total > 0


def test_an_executable_loaded_from_the_disk_cache_is_not_called_a_compile():
    from torch_tpu.runtime import profiling as p

    with profile(activities=ACTIVITIES) as prof:
        p._on_jax_event(p._DISK_HIT)  # (as JAX tells a load: the hit, then its duration)
        p._on_duration(p._COMPILED, 0.002)
        p._on_duration(p._COMPILED, 0.003)
    names = [e.name for e in prof.events() if e.name in (p.COMPILE, p.CACHE_LOAD)]
    assert names.count(p.CACHE_LOAD) == 1 and names.count(p.COMPILE) == 1
