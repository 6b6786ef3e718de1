// The PrivateUse1 hooks (at::PrivateUse1HooksInterface, TpuHooks.cpp): generators, the pinned host
// allocator, storage resize, the device count.
#pragma once

#include <ATen/detail/PrivateUse1HooksInterface.h>

namespace torch_tpu {

// The one hooks object (registered by install()).
at::PrivateUse1HooksInterface* tpu_hooks();

}  // namespace torch_tpu
