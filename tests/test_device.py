"""Registration: the "tpu" device, the torch.tpu module, accelerator API, autoload, RNG."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import torch_tpu


def _python(code: str, **env) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_device_and_accelerator():
    x = torch.ones(2, device="tpu")
    assert x.device == torch.device("tpu:0") and type(x) is torch.Tensor
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "tpu"
    assert torch._C._get_privateuse1_backend_name() == "tpu"


@pytest.mark.parametrize(
    "name",
    [
        "is_available",
        "is_initialized",
        "device_count",
        "current_device",
        "set_device",
        "device",
        "synchronize",
        "manual_seed",
        "manual_seed_all",
        "seed",
        "initial_seed",
        "get_rng_state",
        "set_rng_state",
        "get_device_name",
        "get_device_properties",
        "memory_allocated",
        "max_memory_allocated",
        "memory_stats",
        "reset_peak_memory_stats",
        "empty_cache",
        "get_amp_supported_dtype",
        "is_bf16_supported",
        "Stream",
        "Event",
        "current_stream",
        "stream",
    ],
)
def test_device_module_api(name):
    assert callable(getattr(torch.tpu, name))


def test_device_module_values():
    assert torch.tpu.is_available() and torch.tpu.device_count() == 1
    assert torch.tpu.current_device() == 0
    torch.tpu.set_device("tpu:0")
    with pytest.raises(RuntimeError, match="invalid device ordinal: tpu:1"):
        torch.tpu.set_device(1)
    props = torch.tpu.get_device_properties()
    assert props.total_memory > 0 and props.name == torch.tpu.get_device_name()
    assert torch.bfloat16 in torch.tpu.get_amp_supported_dtype()


def test_device_name_tells_the_truth():
    name = torch.tpu.get_device_name()
    platform = torch_tpu.runtime.platform.platform()
    assert ("stand-in" in name) == (platform != "tpu")
    assert name.upper().startswith("XLA:" + platform.upper()) or platform == "tpu"


def test_manual_seed_reproduces_values():
    torch.manual_seed(123)
    a = torch.randn(8, device="tpu").cpu()
    b = torch.rand(8, device="tpu").cpu()
    torch.manual_seed(123)
    assert torch.equal(torch.randn(8, device="tpu").cpu(), a)
    assert torch.equal(torch.rand(8, device="tpu").cpu(), b)
    assert not torch.equal(torch.randn(8, device="tpu").cpu(), a)


def test_rng_state_round_trip():
    torch.tpu.manual_seed(7)
    state = torch.tpu.get_rng_state()
    first = torch.randn(4, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.randn(4, device="tpu").cpu(), first)


def test_synchronize_and_events():
    x = torch.randn(64, 64, device="tpu")
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    y = x @ x
    end.record()
    torch.tpu.synchronize()
    assert start.elapsed_time(end) >= 0 and y.shape == (64, 64)
    with torch.tpu.stream(torch.tpu.current_stream()):
        torch_tpu.sync()


def test_memory_allocated_tracks_live_buffers():
    before = torch.tpu.memory_allocated()
    x = torch.ones(1 << 20, device="tpu") + 1  # materialized 4 MiB result
    assert torch.tpu.memory_allocated() >= before + x.numel() * 4
    del x
    assert torch.tpu.max_memory_allocated() >= before


def test_autoload_through_plain_import_torch():
    out = _python(
        "import torch; print(torch.ones(2, device='tpu').device, torch.accelerator.current_accelerator())"
    )
    assert out == "tpu:0 tpu"


def test_autoload_can_be_disabled():
    out = _python(
        "import torch; print(torch._C._get_privateuse1_backend_name())", TORCH_DEVICE_BACKEND_AUTOLOAD="0"
    )
    assert out == "privateuseone"


def test_platform_can_be_forced():
    out = _python("import torch, torch_tpu; print(torch.tpu.get_device_name())", TORCH_TPU_PLATFORM="cpu")
    assert out == "XLA:CPU (stand-in)"


def test_unknown_platform_is_a_clear_error():
    """(at first use: importing torch_tpu starts nothing)"""
    result = subprocess.run(
        [sys.executable, "-c", "import torch; torch.ones(1, device='tpu')"],
        capture_output=True,
        text=True,
        env={**os.environ, "TORCH_TPU_PLATFORM": "abacus"},
    )
    assert result.returncode != 0 and "TORCH_TPU_PLATFORM must be one of" in result.stderr


def test_debug_eager_mode_runs_ops():
    out = _python(
        "import torch, torch_tpu; from torch_tpu import config; "
        "x = torch.arange(4., device='tpu'); print(config.launch_blocking, (x * 2).sum().item())",
        TPU_LAUNCH_BLOCKING="1",
    )
    assert out == "True 12.0"


def test_per_op_programs_compile_quickly_on_the_cpu_stand_in(run_python):
    code = """
        import os, torch, torch_tpu
        from torch_tpu.runtime import compiler, platform
        assert float(torch.ones(3, device="tpu").sum()) == 3
        print(platform.platform(), platform.quick_compiles, compiler.optimized(), os.environ.get("XLA_FLAGS"))
    """
    kind, quick, *_ = run_python(code).split(" ", 2)
    if kind != "cpu":
        pytest.skip("the XLA:CPU stand-in only")
    assert quick == "True"
    out = run_python(code, TORCH_TPU_QUICK_COMPILE="0")
    assert out.split(" ", 3)[1:3] == ["False", "None"]
    out = run_python(code, XLA_FLAGS="--xla_backend_optimization_level=1")
    assert out.split(" ", 2)[1] == "False"  # (the user's own level stands)
