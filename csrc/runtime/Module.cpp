// torch_tpu's C++ runtime core: the PrivateUse1 interfaces PyTorch offers no Python route to.
//
// - hooks (at::PrivateUse1HooksInterface): generators, the pinned host allocator, storage
//   resize, the device count;
// - the device guard: current device, one in-order stream, events, device synchronization;
// - the device allocator (c10::DeviceAllocator): a unique handle per storage and memory stats;
// - the view kernels: a view only computes sizes, strides and offset over the same storage, the
//   same work CPU's kernels do, so PrivateUse1 runs those kernels instead of a Python round trip;
// - the two storage-value calls of every op: reading the value of a tensor that is its whole
//   storage, and attaching an op's result to a new tensor (each one call instead of a dozen
//   Python-level ones; every other case answers None and Python handles it);
// - planned kernels: an op's calls that repeat a plan its Python kernel kept (the same program
//   on the same kinds of arguments) run from here with no Python frame; every other call goes to
//   the Python kernel, which decides everything;
// - with FusedRecord.cpp: a fused graph's node that repeats the one at its place in the last
//   graph recorded without Graph.record's Python (a training or decoding loop's every node).
//
// Everything Python can decide stays in Python: synchronization, what a storage resize does to
// the JAX buffer behind it, memory statistics and the device count come from callbacks on the
// object given to install() (torch_tpu.runtime.callbacks). A tpu storage's bytes live in a JAX
// array attached to its Python object, so the "pointer" of a storage is only a handle: unique
// while it lives, never dereferenced, taken from an address range no host pointer uses.
//
// One file per concern, as PyTorch's OpenReg backend keeps them: CoreFlags (the switches Python
// sets for the per-op paths), TpuFunctions (the shared device state and the callbacks),
// TpuDeviceAllocator, TpuHostAllocator (pinned memory), TpuGenerator, TpuHooks, TpuGuard,
// TpuKernels (views, the attention choice), StorageValues, PlannedKernel, BoxedPlannedKernel,
// FusedRecord, TpuProfiler; PythonNames declares every Python name they reach by string. This
// one makes the module and installs the rest.

#include "BoxedPlannedKernel.h"
#include "CoreFlags.h"
#include "FusedRecord.h"
#include "PlannedKernel.h"
#include "PythonNames.h"
#include "StorageValues.h"
#include "TpuDeviceAllocator.h"
#include "TpuFunctions.h"
#include "TpuGenerator.h"
#include "TpuGuard.h"
#include "TpuHooks.h"

#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

namespace torch_tpu {

namespace {

void install(py::object callbacks, int device_count) {
  TORCH_CHECK(!at::isPrivateUse1HooksRegistered(), "PrivateUse1 hooks are already registered");
  g_callbacks = callbacks.release().ptr();
  g_device_count = device_count;
  at::RegisterPrivateUse1HooksInterface(tpu_hooks());
  c10::impl::registerDeviceGuard(kTpu, tpu_guard());
  c10::SetAllocator(kTpu, device_allocator());
}

// The functions every op calls, several times for some, as plain CPython functions: pybind11's
// call machinery would cost about as much as their work.
PyMethodDef g_per_op_functions[] = {
    {"whole_value", call_with_one<whole_value>, METH_O, "whole_value(tensor): its whole storage's value, or None"},
    {"read_recorded",
     call_with_one<read_recorded>,
     METH_O,
     "read_recorded(tensor): its whole storage's value or its view as a fused node reads it, or None"},
    {"wrap_value",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call_wrap_value)),
     METH_FASTCALL,
     "wrap_value(value[, inputs]): a new contiguous tpu tensor holding it, or None"},
    {"whole_operands",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call_whole_operands)),
     METH_FASTCALL,
     "whole_operands(args, views_read_in_program): (key, values), or None"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

}  // namespace torch_tpu

PYBIND11_MODULE(_C, m) {
  using namespace torch_tpu;
  m.doc() = "torch_tpu's C++ runtime core (hooks, device guard, device allocator, view kernels)";
  if (intern_python_names() != 0) {
    throw py::error_already_set();
  }
  m.def(
      "python_names",
      [] {
        PyObject* names = python_names_list();
        if (names == nullptr) {
          throw py::error_already_set();
        }
        return py::reinterpret_steal<py::list>(names);
      },
      "the Python names the core reaches by string, as (owner, name) pairs (PythonNames.h)");
  m.def("install", &install, py::arg("callbacks"), py::arg("device_count"));
  m.def("set_device_count", [](int count) { g_device_count = count; });
  m.def("empty", &empty);
  m.def("draw", &draw);
  m.def("configure_values", &configure_values);
  if (PyModule_AddFunctions(m.ptr(), g_per_op_functions) != 0) {
    throw py::error_already_set();
  }
  m.def("configure_plans", &configure_plans);
  m.def("serve_boxed", &serve_boxed);
  if (add_core_flags(m.ptr()) != 0 || add_fused_record(m.ptr()) != 0) {
    throw py::error_already_set();
  }
  PyObject* planned_kernel = PyType_FromSpec(&g_planned_kernel_spec);
  if (planned_kernel == nullptr || PyModule_AddObject(m.ptr(), "PlannedKernel", planned_kernel) != 0) {
    throw py::error_already_set();
  }
  m.def("default_generator", [](c10::DeviceIndex index) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_generator(index)));
  });
}
