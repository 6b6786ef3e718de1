// PlannedKernels registered with the dispatcher directly (BoxedPlannedKernel.cpp).
#pragma once

#include <torch/csrc/utils/pybind.h>

#include <string>

namespace torch_tpu {

// Registers `planned` (a PlannedKernel) as the tpu kernel of aten::`name`.`overload` ("" for
// the default one) where BoxedPlannedKernel serves the op's schema; false, and nothing
// registered, where not.
bool serve_boxed(const std::string& name, const std::string& overload, pybind11::handle planned);

}  // namespace torch_tpu
