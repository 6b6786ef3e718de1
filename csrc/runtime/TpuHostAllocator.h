// The pinned host allocator (TpuHostAllocator.cpp): host memory that is_pinned() recognizes.
#pragma once

#include <c10/core/Allocator.h>

namespace torch_tpu {

// The allocator of pinned host memory (the hooks' getPinnedMemoryAllocator).
c10::Allocator* host_allocator();

// Whether `data` lies in a live block of host_allocator()'s.
bool is_pinned(const void* data);

}  // namespace torch_tpu
