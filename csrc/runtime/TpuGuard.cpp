#include "TpuGuard.h"

#include "TpuFunctions.h"

#include <chrono>

namespace torch_tpu {

namespace {

// ----------------------------------------------------------------------------- device guard
// XLA runs a device's work in order: there is one stream per device, and every stream PyTorch
// asks for is it. An event records by waiting for the work before it (as torch.tpu.Event does),
// so it is complete once recorded and its timestamp bounds that work.
struct TpuEvent {
  std::chrono::steady_clock::time_point at;
};

struct TpuGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kTpu;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device old = getDevice();
    setDevice(device);
    return old;
  }
  c10::Device getDevice() const override {
    return {kTpu, g_current_device};
  }
  void setDevice(c10::Device device) const override {
    check_index(device.index());
    set_current(device.index());
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    // (only ever restores a device set before, so Python has already been told about it)
    if (device.index() >= 0 && device.index() < g_device_count) {
      g_current_device = device.index();
    }
  }
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kTpu, resolve(device.index())));
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return getStream(device);
  }
  c10::Stream getNewStream(c10::Device device, int) const override {
    return getStream(device);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool) const override {
    return getStream(device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const noexcept override {
    return stream;  // the only stream stays current
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(g_device_count.load());
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex, const c10::EventFlag)
      const override {
    synchronize(stream.device_index());
    if (*event == nullptr) {
      *event = new TpuEvent{};
    }
    static_cast<TpuEvent*>(*event)->at = std::chrono::steady_clock::now();
  }
  void block(void*, const c10::Stream&) const override {}  // one stream: already ordered
  bool queryEvent(void*) const override {
    return true;  // recording waited for the work
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<TpuEvent*>(event);
  }
  void synchronizeEvent(void*) const override {}  // recording waited for the work
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    // (c10::Event has checked that both were created with enable_timing=True)
    TORCH_CHECK(start && end, "Both events must be recorded before calculating elapsed time.");
    const auto elapsed = static_cast<TpuEvent*>(end)->at - static_cast<TpuEvent*>(start)->at;
    return std::chrono::duration<double, std::milli>(elapsed).count();
  }
  bool queryStream(const c10::Stream& stream) const override {
    synchronize(stream.device_index());
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    synchronize(stream.device_index());
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    synchronize(index);
  }
};

}  // namespace

c10::impl::DeviceGuardImplInterface* tpu_guard() {
  static TpuGuard guard;
  return &guard;
}

}  // namespace torch_tpu
