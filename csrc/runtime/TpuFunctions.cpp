// The core's device bookkeeping and its way back to Python (TpuFunctions.h).

#include "TpuFunctions.h"

#include <string>

namespace torch_tpu {

// ----------------------------------------------------------------------------- Python side
PyObject* g_callbacks = nullptr;  // torch_tpu.runtime.callbacks; kept for the process's lifetime
std::atomic<int> g_device_count{0};
thread_local c10::DeviceIndex g_current_device = 0;

void check_index(c10::DeviceIndex index) {
  // The wording of CUDA's error for the same request ("invalid device ordinal"), naming the
  // devices that do exist; torch_tpu.device uses the same sentence.
  const int count = g_device_count;
  TORCH_CHECK(
      index >= 0 && index < count,
      "tpu error: invalid device ordinal: tpu:", static_cast<int>(index), " (this process drives ",
      count, count == 1 ? " device, tpu:0" : " devices, tpu:0 to tpu:" + std::to_string(count - 1),
      "; launch one process per device)");
}

c10::DeviceIndex resolve(c10::DeviceIndex index) {
  return index < 0 ? g_current_device : index;
}

// The first time a device other than tpu:0 becomes current, Python is told (it keeps tpu:0's
// paths free of device bookkeeping until then).
std::atomic<bool> g_told_other_device{false};

void set_current(c10::DeviceIndex index) {
  if (index > 0 && !g_told_other_device.exchange(true)) {
    callback(Name::native_device_used, index);
  }
  g_current_device = index;
}

void synchronize(c10::DeviceIndex index) {
  callback(Name::native_synchronize, resolve(index));
}

}  // namespace torch_tpu
