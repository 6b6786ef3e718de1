// A tpu storage's bytes live in a JAX array attached to its Python object, so the "pointer" of a
// storage is only a handle: unique while it lives, never dereferenced, taken from an address
// range no host pointer uses (TpuDeviceAllocator.h).

#include "TpuDeviceAllocator.h"

#include "TpuFunctions.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <array>
#include <atomic>
#include <memory>

namespace torch_tpu {

namespace {

// ----------------------------------------------------------------------------- device allocator
// Handles start at 2^62: above any user-space address on x86-64 and AArch64 (a stray host read
// faults instead of reading unrelated memory), below 2^63 (they stay positive as int64).
constexpr uintptr_t kHandleBase = uintptr_t{1} << 62;
constexpr uintptr_t kAlignment = 512;

void release_handle(void*) {}

// torch.profiler's profile_memory=True: an allocation made while the profiler records memory
// reports its size then and at its release (the context it carries says how much); the others
// cost nothing. The total reported is the live bytes of those allocations.
struct Reported {
  void* handle;
  size_t bytes;
  c10::Device device;
};
std::atomic<int64_t> g_reported_bytes{0};

void report(const Reported& allocation, int64_t change) {
  const auto total = static_cast<size_t>(g_reported_bytes.fetch_add(change) + change);
  c10::reportMemoryUsageToProfiler(allocation.handle, change, total, total, allocation.device);
}

void release_reported(void* context) {
  std::unique_ptr<Reported> allocation(static_cast<Reported*>(context));
  report(*allocation, -static_cast<int64_t>(allocation->bytes));
}

struct TpuAllocator final : c10::DeviceAllocator {
  std::atomic<uintptr_t> next{kHandleBase};

  c10::DataPtr allocate(size_t nbytes) override {
    const c10::Device device(kTpu, g_current_device);
    if (nbytes == 0) {
      return {nullptr, nullptr, &release_handle, device};  // as CPU: an empty storage is null
    }
    // Handles are never reused and never overlap, like addresses of live allocations: a view's
    // data_ptr (handle + offset) cannot equal another storage's.
    const auto span = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
    void* handle = reinterpret_cast<void*>(next.fetch_add(span));
    if (c10::memoryProfilingEnabled()) {
      auto* allocation = new Reported{handle, span, device};
      report(*allocation, static_cast<int64_t>(span));
      return {handle, allocation, &release_reported, device};
    }
    return {handle, nullptr, &release_handle, device};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &release_handle;
  }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "tpu storages have no host bytes to copy: copy through tensors instead");
  }
  bool initialized() override {
    return true;
  }
  void emptyCache(c10::MempoolId_t) override {
    callback(Name::native_empty_cache);
  }
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // one stream
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex index) override {
    check_index(index);
    const auto values = callback<std::array<int64_t, 5>>(Name::native_memory_stats, index);
    c10::CachingDeviceAllocator::DeviceStats stats;
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    stats.allocated_bytes[all].current = values[0];
    stats.allocated_bytes[all].peak = values[1];
    stats.reserved_bytes[all].current = values[2];
    stats.reserved_bytes[all].peak = values[3];
    stats.allocation[all].current = values[4];
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {}  // none are kept
  void resetPeakStats(c10::DeviceIndex index) override {
    check_index(index);
    callback(Name::native_reset_peak_memory_stats, index);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override {
    check_index(index);
    return callback<std::pair<size_t, size_t>>(Name::native_mem_get_info, index);
  }
};

TpuAllocator g_allocator;

}  // namespace

c10::DeviceAllocator* device_allocator() {
  return &g_allocator;
}

// ----------------------------------------------------------------------------- Python entry points
at::Tensor empty(
    const std::vector<int64_t>& sizes,
    const std::optional<std::vector<int64_t>>& strides,
    c10::ScalarType dtype,
    size_t nbytes,
    c10::DeviceIndex index) {
  auto data = g_allocator.allocate(nbytes);
  data.unsafe_set_device(c10::Device(kTpu, index));
  c10::Storage storage(
      c10::Storage::use_byte_size_t{}, static_cast<int64_t>(nbytes), std::move(data), &g_allocator,
      /*resizable=*/true);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::scalarTypeToTypeMeta(dtype));
  if (strides) {
    tensor.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, *strides);
  } else {
    tensor.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  }
  return tensor;
}

}  // namespace torch_tpu
