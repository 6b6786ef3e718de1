// The switches the per-op paths test, held in one Python object that both sides read:
// torch_tpu.runtime.flags.flags, an instance of CoreFlags (a __slots__ class). Python sets them
// (each has one owner there: see flags.py); configure_flags hands the object over once and the
// core reads each slot at its offset, as a struct field: no module globals, no dict lookups.
#pragma once

#include <Python.h>

namespace torch_tpu {

// CoreFlags' slots, in the order of PythonNames.h's flags_* entries.
enum class Flag : int {
  attention_needed,  // a forked child to refuse or a job to run before the next op (platform)
  others_used,  // a device other than tpu:0 was used (platform)
  check_meta,  // every kernel call is checked against PyTorch's Meta kernel (meta_check)
  recorded_ops,  // None, or the set every op called joins (dispatch.recording)
  log_recompiles,  // why programs compile is worked out (events)
  record_in_core,  // repeated fused nodes are recorded here (execution.fused)
  max_nodes,  // a fused graph runs at this many nodes (execution.fused)
  count
};

struct CoreFlagsState {
  PyObject* object = nullptr;  // the flags object (a strong reference), once configured
  Py_ssize_t offsets[static_cast<int>(Flag::count)] = {};
};
extern CoreFlagsState g_core_flags;

// A flag's value now: a borrowed reference, nullptr before configure_flags or where unset.
inline PyObject* flag(Flag which) {
  if (g_core_flags.object == nullptr) {
    return nullptr;
  }
  const Py_ssize_t offset = g_core_flags.offsets[static_cast<int>(which)];
  return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(g_core_flags.object) + offset);
}

// Whether a flag is the object `expected` (Py_False, Py_True, Py_None); an unset one is not.
inline bool flag_is(Flag which, PyObject* expected) {
  return flag(which) == expected;
}

// Adds configure_flags(flags) to `module`; -1 with the error set where it could not.
int add_core_flags(PyObject* module);

}  // namespace torch_tpu
