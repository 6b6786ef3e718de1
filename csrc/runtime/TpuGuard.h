// The device guard (c10::impl::DeviceGuardImplInterface, TpuGuard.cpp): current device, one
// in-order stream, events, device synchronization.
#pragma once

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace torch_tpu {

// The one guard (registered by install()).
c10::impl::DeviceGuardImplInterface* tpu_guard();

}  // namespace torch_tpu
