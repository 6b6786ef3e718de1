"""``import torch`` with torch_tpu installed registers the device and nothing more: JAX is
imported and configured (64-bit types, the compilation cache) only when tpu is first used."""

from __future__ import annotations

import json


def test_import_torch_registers_tpu_without_touching_jax(run_python):
    out = run_python("""
        import json, sys, torch
        state = {"registered": torch._C._get_privateuse1_backend_name(),
                 "module": hasattr(torch, "tpu"), "jax_imported": "jax" in sys.modules,
                 "dynamo_imported": "torch._dynamo" in sys.modules}
        import jax  # another JAX user in the same process
        state["x64_before_use"] = jax.config.jax_enable_x64
        state["cache_before_use"] = jax.config.jax_compilation_cache_dir
        x = torch.arange(3, device="tpu")   # first use: the device starts here
        state["x64_after_use"] = jax.config.jax_enable_x64
        state["dtype"] = str(x.dtype)
        print(json.dumps(state))
    """)
    state = json.loads(out)
    assert state == {
        "registered": "tpu",
        "module": True,
        "jax_imported": False,
        "dynamo_imported": False,
        "x64_before_use": False,
        "cache_before_use": None,
        "x64_after_use": True,
        "dtype": "torch.int64",
    }


def test_a_jax_cache_directory_chosen_by_the_process_is_kept(run_python, tmp_path):
    out = run_python(f"""
        import jax, torch
        jax.config.update("jax_compilation_cache_dir", {str(tmp_path / "mine")!r})
        torch.ones(2, device="tpu").sum().item()
        print(jax.config.jax_compilation_cache_dir)
    """)
    assert out.strip() == str(tmp_path / "mine")


def test_device_queries_start_the_device_on_demand(run_python):
    out = run_python("""
        import sys, torch
        print(torch.tpu.is_available(), torch.tpu.is_initialized(), "jax" in sys.modules)
        print(torch.tpu.get_device_name().startswith(("XLA:", "TPU")), torch.tpu.is_initialized())
    """)
    assert out.split() == ["True", "False", "False", "True", "True"]
