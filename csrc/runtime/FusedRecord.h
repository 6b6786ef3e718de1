// A fused graph's recording of an op it recorded the same way last time (FusedRecord.cpp).
#pragma once

#include <Python.h>

namespace torch_tpu {

// `fn(*args)` recorded into the fused `graph` (torch_tpu.execution.fused.Graph) as Graph.record
// records it, where the node is the one at its place in the graph's template: its outputs (a
// Deferred, or a tuple of them). NotImplemented (a new reference) where Graph.record decides
// instead, with the graph untouched; nullptr with the error set where reading the graph raised.
// `matmul_precision`: the float32 matmul precision's JAX name, or fused._NOW (read here).
PyObject* record_repeated(PyObject* graph, PyObject* fn, PyObject* args, PyObject* matmul_precision);

// Adds configure_fused(...) and record_repeated(graph, fn, args, matmul_precision) to `module`;
// -1 with the error set where it could not.
int add_fused_record(PyObject* module);

}  // namespace torch_tpu
