// The state every PrivateUse1 interface of the core shares (TpuFunctions.cpp): the Python object
// given to install() (torch_tpu.runtime.callbacks) that the core calls back, the device count and
// the current device.
#pragma once

#include "PythonNames.h"

#include <c10/core/Device.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <type_traits>
#include <utility>

namespace torch_tpu {

namespace py = pybind11;

constexpr auto kTpu = c10::DeviceType::PrivateUse1;

extern PyObject* g_callbacks;  // torch_tpu.runtime.callbacks; kept for the process's lifetime
extern std::atomic<int> g_device_count;
extern thread_local c10::DeviceIndex g_current_device;

// Calls torch_tpu.runtime.callbacks.<name>(args) (a Name::native_* of PythonNames.h) and converts
// its result to R, under the GIL (PyTorch calls some of these with the GIL released).
template <typename R = void, typename... Args>
R callback(Name name, Args&&... args) {
  py::gil_scoped_acquire gil;
  py::object result = py::handle(g_callbacks).attr(py::handle(python_name(name)))(std::forward<Args>(args)...);
  if constexpr (!std::is_void_v<R>) {
    return result.cast<R>();
  }
}

// Refuses an index that names no device of this process, in CUDA's words.
void check_index(c10::DeviceIndex index);

// `index`, or the current device for a negative one.
c10::DeviceIndex resolve(c10::DeviceIndex index);

// Makes tpu:index current (checked by the caller).
void set_current(c10::DeviceIndex index);

// Waits for the work queued on tpu:index (Python's synchronize).
void synchronize(c10::DeviceIndex index);

}  // namespace torch_tpu
