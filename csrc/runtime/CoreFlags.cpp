#include "CoreFlags.h"

#include "PythonNames.h"

#include <torch/csrc/utils/pybind.h>

#include <string>

namespace torch_tpu {

CoreFlagsState g_core_flags;

namespace {

// Each flag's slot name (PythonNames.h, checked at initialization by check_python_names).
constexpr Name kFlagNames[] = {
    Name::flags_attention_needed,
    Name::flags_others_used,
    Name::flags_check_meta,
    Name::flags_recorded_ops,
    Name::flags_log_recompiles,
    Name::flags_record_in_core,
    Name::flags_max_nodes,
};
static_assert(sizeof(kFlagNames) / sizeof(kFlagNames[0]) == static_cast<size_t>(Flag::count));

// Reads `flags` (runtime.flags.flags) from now on; its type's slots are located by name.
void configure_flags(py::handle flags) {
  PyTypeObject* type = Py_TYPE(flags.ptr());
  CoreFlagsState state;
  for (int i = 0; i < static_cast<int>(Flag::count); ++i) {
    state.offsets[i] = slot_offset(type, kFlagNames[i], "configure_flags");
  }
  state.object = flags.inc_ref().ptr();
  Py_XDECREF(g_core_flags.object);
  g_core_flags = state;
}

}  // namespace

int add_core_flags(PyObject* module) {
  auto m = py::reinterpret_borrow<py::module_>(module);
  m.def("configure_flags", &configure_flags, "read these flags (runtime.flags.CoreFlags) from now on");
  return 0;
}

}  // namespace torch_tpu
