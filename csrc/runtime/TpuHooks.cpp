#include "TpuHooks.h"

#include "TpuDeviceAllocator.h"
#include "TpuFunctions.h"
#include "TpuGenerator.h"
#include "TpuHostAllocator.h"

#include <torch/csrc/Storage.h>

namespace torch_tpu {

namespace {

// ----------------------------------------------------------------------------- hooks
struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return g_device_count > 0;
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return callback<bool>(Name::native_is_initialized);
  }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(g_device_count.load());
  }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    check_index(index);
    set_current(index);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return g_current_device;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const auto old = g_current_device;
    setCurrentDevice(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    index = resolve(index);
    check_index(index);
    return at::make_generator<TpuGenerator>(index);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return host_allocator();
  }
  bool isPinnedPtr(const void* data) const override {
    return is_pinned(data);
  }
  // storage.resize_(n) (FSDP2 frees and reallocates parameters this way). Python resizes the JAX
  // buffer (keeping the first bytes, as CPU does); the storage gets a new handle, as a CPU
  // storage gets a new allocation.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    {
      py::gil_scoped_acquire gil;  // (the Python storage object carries the JAX buffer)
      auto py_storage = py::reinterpret_steal<py::object>(THPStorage_Wrap(storage));
      callback(Name::native_resize_storage, py_storage, nbytes);
    }
    auto* impl = storage.unsafeGetStorageImpl();
    auto data = device_allocator()->allocate(nbytes);
    data.unsafe_set_device(storage.device());  // (the storage stays on its device)
    impl->set_data_ptr_noswap(std::move(data));
    impl->set_nbytes(nbytes);
  }
};

}  // namespace

at::PrivateUse1HooksInterface* tpu_hooks() {
  static TpuHooks hooks;
  return &hooks;
}

}  // namespace torch_tpu
