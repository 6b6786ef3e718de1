// Planned kernels (PlannedKernel.cpp): an op's calls that repeat a plan its Python kernel kept
// run from C++ with no Python frame.
#pragma once

#include "TpuFunctions.h"

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/utils/pybind.h>

namespace torch_tpu {

struct PlannedKernel {
  PyObject_HEAD PyObject* kernel;  // the op's Python kernel
  // {key: a NativePlan (ops/dispatch/plans.py), read through PlanField}
  PyObject* plans;
  PyObject* op;  // the OpOverload (dispatch.recording.recorded_ops)
  PyObject* name;  // the op's name (context.op, named by errors of checks reported later)
  uint64_t views_read_in_program;  // as whole_operands takes it
  long returns;  // a Returns
};

// What an op returns (dispatch.registration._RETURNS_*): one contiguous tensor, one tensor laid out like its
// tensor inputs (an elementwise op's: tensor.wrap_elementwise), a tuple (dispatch.variants.wrap_output),
// or its first argument, into which an in-place variant writes its program's one output
// (tensor.write_whole: a tensor that is its whole storage, of the output's shape and dtype)
enum Returns : long { kOne, kLikeInputs, kTuple, kWritesFirst };

// One output of a planned program as the op's tensor: the core's (value_tensor) where it makes
// one, else Python's wrap of it (tensor.wrap; tensor.wrap_elementwise for an elementwise op,
// which the core leaves to Python where its inputs are not all contiguous; for an item of a
// tuple dispatch.variants.wrap_output: None, a list of outputs, a value to put on the device first).
struct __attribute__((visibility("hidden"))) WrappedOutput {  // (hidden, as py::object is)
  at::Tensor tensor;  // the core's, where defined
  py::object python;  // else Python's (null where its wrap raised)
};

// Takes the Python state plans depend on (ops/dispatch/registration.py, once).
void configure_plans(
    py::handle context,
    py::handle wrap,
    py::handle wrap_elementwise,
    py::handle number,
    py::handle wrap_output,
    py::handle write_whole,
    py::dict record_fields);

// The outputs of a planned program (one, or each of a tuple's), in order; false, with the error
// set, where a Python wrap raised or a tuple-returning op's program returned no tuple.
bool wrap_each_output(long returns, PyObject* out, PyObject* args, c10::SmallVector<WrappedOutput, 2>& outputs);

// The output of the plan's program run for the call; nullptr and no error where no plan applies.
PyObject* run_program(PlannedKernel* self, PyObject* args);

// An in-place call's output stored into its first argument: whether it was.
bool write_first(PyObject* args, PyObject* out);

// tensor.read_in_program while a fused graph records; None where Python reads it.
py::object read_recorded(py::handle object);

// The type torch_tpu._C.PlannedKernel.
extern PyType_Spec g_planned_kernel_spec;

}  // namespace torch_tpu
