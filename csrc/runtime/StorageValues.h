// A tpu storage's value (a JAX array, or a fused graph's Deferred output) read and attached in
// C++ (StorageValues.cpp).
#pragma once

#include "TpuFunctions.h"

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/utils/pybind.h>

namespace torch_tpu {

// Names the storage attribute, the array, Deferred and StridedView types and the dtype
// correspondence (torch_tpu.runtime.tensor, once).
void configure_values(
    py::str attr,
    py::handle array,
    py::handle deferred,
    py::handle strided_view,
    py::dict torch_to_jax,
    py::dict jax_to_torch);

// Whether configure_values has run.
bool values_configured();

// Whether `shape` (a tuple of ints) is `sizes`.
bool same_sizes(const py::object& shape, c10::IntArrayRef sizes);

// The value of a tpu tensor's storage where the core reads it, and its shape; else None.
py::object storage_value(const at::Tensor& tensor, py::object& shape);

// The value of a tpu tensor that is its whole storage in order; else None.
py::object whole_value(py::handle object);

// A view's strides as its StridedView addresses the storage with them.
c10::SmallVector<int64_t, 6> addressing_strides(const at::Tensor& tensor);

// StridedView(value, start, the tensor's shape, `addressing`).
py::object strided_view(py::handle value, py::handle start, c10::IntArrayRef sizes, c10::ArrayRef<int64_t> addressing);

// An op's positional arguments for the per-op fast path: (key, values), or None.
py::object whole_operands(py::handle args, uint64_t views_read_in_program);

// A new contiguous tpu:0 tensor whose storage holds `value`, else an undefined tensor.
at::Tensor value_tensor(py::handle value);

// value_tensor's tensor as a Python object; None where Python wraps the value.
py::object wrap_value(py::handle value);

// Whether every tensor in the tuple `inputs` is contiguous.
bool tensors_contiguous(PyObject* inputs);

// The functions every op calls, several times for some, as plain CPython functions: pybind11's
// call machinery would cost about as much as their work. `returning` runs one, turning a C++
// exception into a Python one.
template <class Fn>
PyObject* returning(Fn&& fn) {
  try {
    return fn().release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

template <py::object (*fn)(py::handle)>
PyObject* call_with_one(PyObject* /*module*/, PyObject* arg) {
  return returning([&] { return fn(arg); });
}

// whole_operands(args, views_read_in_program) and wrap_value(value[, inputs]) as METH_FASTCALL
// functions.
PyObject* call_whole_operands(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count);
PyObject* call_wrap_value(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count);

}  // namespace torch_tpu
