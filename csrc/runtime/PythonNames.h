// Every Python name the C++ core reaches by string, in one place: the owner (a module, whose
// global it is, or a class, whose instances' attribute, slot or method it is) and the name.
//
// Each name is interned once, when torch_tpu._C loads (intern_python_names, from Module.cpp),
// and read through python_name(Name::...): the hot paths keep their interned strings.
// _C.python_names() lists the table as (owner, name) pairs, and
// torch_tpu.runtime.native.check_python_names() checks at initialization that each owner has
// its name, naming any that is missing. (The fields of the plan records, read by position, are
// checked by configure_plans against ops/dispatch/plans.py: PlannedKernel.cpp's kRecordFields;
// the order of Deferred.__slots__ and fused.NodeEntry's fields by configure_fused.)
#pragma once

#include <Python.h>

namespace torch_tpu {

// X(id, owner, name)
#define TORCH_TPU_PYTHON_NAMES(X)                                                             \
  /* install()'s callbacks (TpuFunctions.h's callback) */                                     \
  X(native_is_initialized, "torch_tpu.runtime.callbacks", "is_initialized")                     \
  X(native_device_used, "torch_tpu.runtime.callbacks", "device_used")                           \
  X(native_synchronize, "torch_tpu.runtime.callbacks", "synchronize")                           \
  X(native_empty_cache, "torch_tpu.runtime.callbacks", "empty_cache")                           \
  X(native_memory_stats, "torch_tpu.runtime.callbacks", "memory_stats")                         \
  X(native_reset_peak_memory_stats, "torch_tpu.runtime.callbacks", "reset_peak_memory_stats")   \
  X(native_mem_get_info, "torch_tpu.runtime.callbacks", "mem_get_info")                         \
  X(native_resize_storage, "torch_tpu.runtime.callbacks", "resize_storage")                     \
  /* the profiler's calls (TpuProfiler.cpp) */                                                \
  X(profiling_start, "torch_tpu.runtime.profiling", "start")                                 \
  X(profiling_stop, "torch_tpu.runtime.profiling", "stop")                                   \
  X(profiling_activities, "torch_tpu.runtime.profiling", "activities")                       \
  /* storage values (StorageValues.cpp) and fused nodes' leaves (FusedRecord.cpp) */          \
  X(array_aval, "jax._src.array.ArrayImpl", "aval")                                          \
  X(array_committed, "jax._src.array.ArrayImpl", "_committed")                               \
  X(aval_shape, "jax._src.core.ShapedArray", "shape")                                             \
  X(aval_dtype, "jax._src.core.ShapedArray", "dtype")                                             \
  X(aval_weak_type, "jax._src.core.ShapedArray", "weak_type")                                     \
  /* Deferred's and StridedView's slots (StorageValues.cpp, FusedRecord.cpp) */               \
  X(deferred_shape, "torch_tpu.runtime.buffer.Deferred", "shape")                            \
  X(deferred_dtype, "torch_tpu.runtime.buffer.Deferred", "dtype")                            \
  X(deferred_size, "torch_tpu.runtime.buffer.Deferred", "size")                              \
  X(deferred_weak_type, "torch_tpu.runtime.buffer.Deferred", "weak_type")                    \
  X(deferred_graph, "torch_tpu.runtime.buffer.Deferred", "graph")                            \
  X(deferred_node, "torch_tpu.runtime.buffer.Deferred", "node")                              \
  X(deferred_index, "torch_tpu.runtime.buffer.Deferred", "index")                            \
  X(deferred_value, "torch_tpu.runtime.buffer.Deferred", "value")                            \
  X(deferred_error, "torch_tpu.runtime.buffer.Deferred", "error")                            \
  X(strided_buf, "torch_tpu.runtime.buffer.StridedView", "buf")                              \
  X(strided_start, "torch_tpu.runtime.buffer.StridedView", "start")                          \
  X(strided_shape, "torch_tpu.runtime.buffer.StridedView", "shape")                          \
  X(strided_strides, "torch_tpu.runtime.buffer.StridedView", "strides")                      \
  /* the switches the per-op paths test: CoreFlags' slots, in Flag's order (CoreFlags.h) */     \
  X(flags_attention_needed, "torch_tpu.runtime.flags.CoreFlags", "attention_needed")         \
  X(flags_others_used, "torch_tpu.runtime.flags.CoreFlags", "others_used")                   \
  X(flags_check_meta, "torch_tpu.runtime.flags.CoreFlags", "check_meta")                     \
  X(flags_recorded_ops, "torch_tpu.runtime.flags.CoreFlags", "recorded_ops")                 \
  X(flags_log_recompiles, "torch_tpu.runtime.flags.CoreFlags", "log_recompiles")             \
  X(flags_record_in_core, "torch_tpu.runtime.flags.CoreFlags", "record_in_core")             \
  X(flags_max_nodes, "torch_tpu.runtime.flags.CoreFlags", "max_nodes")                       \
  /* the thread state planned kernels test (PlannedKernel.cpp) */                             \
  X(context_recorder, "torch_tpu.runtime.context.ExecutionContext", "recorder")              \
  X(context_launch_blocking, "torch_tpu.runtime.context.ExecutionContext", "launch_blocking") \
  X(context_op, "torch_tpu.runtime.context.ExecutionContext", "op")                          \
  X(recorder_graph, "torch_tpu.execution.fused.Recorder", "graph")                           \
  X(recorder_record, "torch_tpu.execution.fused.Recorder", "record")                         \
  /* a fused graph's recording (FusedRecord.cpp) */                                           \
  X(fused_open, "torch_tpu.execution.fused", "_OPEN")                                        \
  X(fused_now, "torch_tpu.execution.fused", "_NOW")                                          \
  X(fused_no_checks, "torch_tpu.execution.fused", "_NO_CHECKS")                              \
  X(fused_leaf, "torch_tpu.execution.fused", "_LEAF")                                        \
  X(fused_node, "torch_tpu.execution.fused", "_NODE")                                        \
  X(fused_static, "torch_tpu.execution.fused", "_STATIC")                                    \
  X(fused_seq, "torch_tpu.execution.fused", "_SEQ")                                          \
  X(fused_view, "torch_tpu.execution.fused", "_VIEW")                                        \
  X(checks_taints, "torch_tpu.runtime.checks", "_taints")                                    \
  X(checks_taint_of, "torch_tpu.runtime.checks", "taint_of")                                 \
  X(graph_state, "torch_tpu.execution.fused.Graph", "state")                                 \
  X(graph_seen, "torch_tpu.execution.fused.Graph", "seen")                                   \
  X(graph_churning, "torch_tpu.execution.fused.Graph", "churning")                           \
  X(graph_unclaimed, "torch_tpu.execution.fused.Graph", "_unclaimed")                        \
  X(graph_nodes, "torch_tpu.execution.fused.Graph", "nodes")                                 \
  X(graph_leaves, "torch_tpu.execution.fused.Graph", "leaves")                               \
  X(graph_leaf_avals, "torch_tpu.execution.fused.Graph", "leaf_avals")                       \
  X(graph_leaf_ids, "torch_tpu.execution.fused.Graph", "leaf_ids")                           \
  X(graph_taints, "torch_tpu.execution.fused.Graph", "taints")                               \
  X(graph_template, "torch_tpu.execution.fused.Graph", "template")                           \
  X(graph_interned, "torch_tpu.execution.fused.Graph", "interned")                           \
  X(graph_entries, "torch_tpu.execution.fused.Graph", "entries")                             \
  X(graph_positions, "torch_tpu.execution.fused.Graph", "positions")                         \
  X(graph_signatures, "torch_tpu.execution.fused.Graph", "signatures")                       \
  X(graph_outputs, "torch_tpu.execution.fused.Graph", "outputs")                             \
  X(graph_lock, "torch_tpu.execution.fused.Graph", "lock")                                   \
  X(lock_acquire, "_thread.RLock", "acquire")                                                \
  X(lock_release, "_thread.RLock", "release")                                                \
  X(node_key, "torch_tpu.execution.fused._Node", "key")                                      \
  X(treedef_unflatten, "jax.tree_util.PyTreeDef", "unflatten")

enum class Name : int {
#define TORCH_TPU_NAME_ID(id, owner, name) id,
  TORCH_TPU_PYTHON_NAMES(TORCH_TPU_NAME_ID)
#undef TORCH_TPU_NAME_ID
      count
};

struct PythonName {
  const char* owner;  // a module ("torch_tpu.runtime.callbacks") or a class ("...fused.Graph")
  const char* name;
};

inline constexpr PythonName kPythonNames[] = {
#define TORCH_TPU_NAME_ENTRY(id, owner, name) {owner, name},
    TORCH_TPU_PYTHON_NAMES(TORCH_TPU_NAME_ENTRY)
#undef TORCH_TPU_NAME_ENTRY
};

// The names interned (intern_python_names fills it, once, at load).
extern PyObject* g_python_names[static_cast<int>(Name::count)];

// The interned name (a borrowed reference, kept for the process's lifetime).
inline PyObject* python_name(Name name) {
  return g_python_names[static_cast<int>(name)];
}

// The entry's owner and name as C strings.
inline const PythonName& python_name_entry(Name name) {
  return kPythonNames[static_cast<int>(name)];
}

// Interns every name; -1 with the error set where it could not (at the module's load).
int intern_python_names();

// The table as a list of (owner, name) tuples (_C.python_names()); nullptr with the error set.
PyObject* python_names_list();

// Where instances of `type` keep the __slots__ entry `slot` (its offset in the object), for the
// core to read it as a field; a TypeError naming `who`, the type and the slot where it has none.
Py_ssize_t slot_offset(PyTypeObject* type, Name slot, const char* who);

}  // namespace torch_tpu
