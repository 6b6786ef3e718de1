// The device allocator of tpu storages (c10::DeviceAllocator, TpuDeviceAllocator.cpp): a unique
// handle per storage, never dereferenced, and memory stats from Python.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <optional>
#include <vector>

namespace torch_tpu {

// The one tpu allocator (registered by install()).
c10::DeviceAllocator* device_allocator();

// A tpu tensor on tpu:index whose storage has nbytes (a fresh handle) and this geometry; its value
// (an array on that device) is attached by Python.
at::Tensor empty(
    const std::vector<int64_t>& sizes,
    const std::optional<std::vector<int64_t>>& strides,
    c10::ScalarType dtype,
    size_t nbytes,
    c10::DeviceIndex index);

}  // namespace torch_tpu
