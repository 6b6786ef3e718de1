"""TorchTitan's trainer (``python -m torchtitan.train``) with the CPU as its device: the gloo
reference for the tpu run. TorchTitan itself runs unchanged; what this process supplies, before
TorchTitan is imported:

- the device: TorchTitan takes it from ``torch._utils._get_available_device_type()``, which never
  names the CPU (TorchTitan then falls back to "cuda"), and calls ``torch.cuda``-style functions
  on the device's module: memory ones that ``torch.cpu`` lacks, and ``current_device()`` as an
  index (``torch.cpu``'s is the string "cpu");
- sum-only gradient reductions: TorchTitan sets FSDP's gradient divide factor to 1 (its loss is
  already a global mean), which FSDP turns into ``PREMUL_SUM(1.0)``, which gloo lacks; ``SUM``
  then a division by 1 is the same arithmetic.

Launch with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` so that tpu is not registered."""

import os
import runpy
import sys
import types

import torch
from torch.distributed.fsdp import FSDPModule

torch._utils._get_available_device_type = lambda: "cpu"
for name, function in {
    "get_device_name": lambda device=None: "cpu",
    "get_device_properties": lambda device=None: types.SimpleNamespace(
        total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    ),
    "memory_stats": lambda device=None: {},
    "reset_peak_memory_stats": lambda device=None: None,
    "empty_cache": lambda: None,
}.items():
    if not hasattr(torch.cpu, name):
        setattr(torch.cpu, name, function)
torch.cpu.current_device = lambda: 0

_set_gradient_divide_factor = FSDPModule.set_gradient_divide_factor


def _sum_only(module: FSDPModule, factor: float) -> None:
    _set_gradient_divide_factor(module, factor)
    module.set_force_sum_reduction_for_comms(True)


FSDPModule.set_gradient_divide_factor = _sum_only
runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
# The trainer has finished: its metrics are written and its process group destroyed. This
# reference process then leaves without the interpreter's teardown, in which one rank was seen to
# abort (SIGABRT after "Process group destroyed", on a loaded 2-core CI box): a failure of the
# CPU reference's exit, not of the run it provides.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
