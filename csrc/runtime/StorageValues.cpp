// The two storage-value calls of every op: reading the value of a tensor that is its whole
// storage, and attaching an op's result to a new tensor (each one call instead of a dozen
// Python-level ones; every other case answers None and Python handles it). StorageValues.h.

#include "StorageValues.h"

#include "TpuDeviceAllocator.h"
#include "TpuFunctions.h"

#include <torch/csrc/Dtype.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <vector>

namespace torch_tpu {

// ----------------------------------------------------------------------------- storage values
// A tpu storage's value is an attribute of its Python object (torch_tpu.runtime.buffer): a JAX
// array, or a fused graph's Deferred output. Python names the attribute, the two types and the
// dtype correspondence once (configure_values); the objects are kept for the process's lifetime.
struct ValueTypes {
  PyObject* attr = nullptr;  // the storage attribute holding the value
  PyTypeObject* array = nullptr;  // jax's concrete array type
  PyTypeObject* deferred = nullptr;  // buffer.Deferred
  PyObject* strided_view = nullptr;  // buffer.StridedView
  PyObject* to_torch = nullptr;  // {numpy dtype: torch.dtype}
  // to_torch's entries by the dtype object's identity, tried before the dict: hashing a numpy
  // dtype costs a tenth of a microsecond, paid by every output otherwise
  c10::SmallVector<std::pair<PyObject*, c10::ScalarType>, 24> by_identity;
  std::array<PyObject*, static_cast<size_t>(c10::ScalarType::NumOptions)> to_jax{};
};
ValueTypes g_values;

bool values_configured() {
  return g_values.attr != nullptr;
}

void configure_values(
    py::str attr,
    py::handle array,
    py::handle deferred,
    py::handle strided_view,
    py::dict torch_to_jax,
    py::dict jax_to_torch) {
  TORCH_CHECK(
      PyType_Check(array.ptr()) && PyType_Check(deferred.ptr()) && PyType_Check(strided_view.ptr()),
      "configure_values takes three types");
  g_values.strided_view = strided_view.inc_ref().ptr();
  g_values.attr = attr.inc_ref().ptr();
  PyUnicode_InternInPlace(&g_values.attr);
  g_values.array = reinterpret_cast<PyTypeObject*>(array.inc_ref().ptr());
  g_values.deferred = reinterpret_cast<PyTypeObject*>(deferred.inc_ref().ptr());
  for (auto [torch_dtype, jax_dtype] : torch_to_jax) {
    TORCH_CHECK(THPDtype_Check(torch_dtype.ptr()), "configure_values: torch_to_jax's keys must be torch dtypes");
    auto scalar_type = reinterpret_cast<THPDtype*>(torch_dtype.ptr())->scalar_type;
    g_values.to_jax[static_cast<size_t>(scalar_type)] = jax_dtype.inc_ref().ptr();
  }
  for (auto [jax_dtype, torch_dtype] : jax_to_torch) {
    TORCH_CHECK(THPDtype_Check(torch_dtype.ptr()), "configure_values: jax_to_torch's values must be torch dtypes");
    g_values.by_identity.emplace_back(
        jax_dtype.inc_ref().ptr(), reinterpret_cast<THPDtype*>(torch_dtype.ptr())->scalar_type);
  }
  g_values.to_torch = jax_to_torch.inc_ref().ptr();
}

// The shape and dtype of a storage value that is a concrete array or a pending Deferred one;
// false for anything else (a graph's computed Deferred, an uninitialized storage, a tracer).
bool describe(PyObject* value, py::object& shape, py::object& dtype) {
  auto* type = Py_TYPE(value);
  py::handle handle(value);
  if (type == g_values.array) {
    auto aval = handle.attr(python_name(Name::array_aval));
    shape = aval.attr(python_name(Name::aval_shape));
    dtype = aval.attr(python_name(Name::aval_dtype));
    return true;
  }
  if (type == g_values.deferred && handle.attr(python_name(Name::deferred_value)).is_none()) {
    shape = handle.attr(python_name(Name::deferred_shape));
    dtype = handle.attr(python_name(Name::deferred_dtype));
    return true;
  }
  return false;
}

bool same_sizes(const py::object& shape, c10::IntArrayRef sizes) {
  if (!PyTuple_Check(shape.ptr()) || PyTuple_GET_SIZE(shape.ptr()) != static_cast<Py_ssize_t>(sizes.size())) {
    return false;
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i)) != sizes[i]) {
      PyErr_Clear();  // (a dimension that is not an integer)
      return false;
    }
  }
  return true;
}

// The value of a tpu tensor's storage if the tensor reads it with its dtype (no lazy conjugate
// or negative bit) and the value is a concrete array or a pending Deferred one: its shape then
// comes back too. Else None: Python reads the tensor (tensor._view). A Deferred value whose
// graph has run is replaced by its array first, as buffer.get does: every storage a graph wrote
// stays on this path at its first read after the graph ran.
py::object storage_value(const at::Tensor& tensor, py::object& shape) {
  if (tensor.device().type() != kTpu || !tensor.has_storage() || tensor.is_conj() || tensor.is_neg()) {
    return py::none();
  }
  PyObject* wanted = g_values.to_jax[static_cast<size_t>(tensor.scalar_type())];
  if (wanted == nullptr) {  // a dtype tpu does not have: Python raises its error
    return py::none();
  }
  auto storage = py::reinterpret_steal<py::object>(THPStorage_Wrap(tensor.storage()));
  if (!storage) {
    throw py::error_already_set();
  }
  auto value = py::reinterpret_steal<py::object>(PyObject_GetAttr(storage.ptr(), g_values.attr));
  if (!value) {  // a storage without a value: Python raises its error
    PyErr_Clear();
    return py::none();
  }
  if (Py_TYPE(value.ptr()) == g_values.deferred) {
    py::object computed = value.attr(python_name(Name::deferred_value));
    if (!computed.is_none()) {  // its graph has run: the storage keeps the array (buffer.get's rule)
      if (PyObject_SetAttr(storage.ptr(), g_values.attr, computed.ptr()) != 0) {
        throw py::error_already_set();
      }
      value = std::move(computed);
    }
  }
  py::object dtype;
  if (!describe(value.ptr(), shape, dtype) || dtype.ptr() != wanted || !PyTuple_Check(shape.ptr())) {
    return py::none();
  }
  return value;
}

// The value of a tpu tensor that is its whole storage in order (contiguous, of the value's
// shape: storage_value's conditions), else None: a view, a reinterpreted dtype or any other
// value, read by Python (tensor._view).
py::object whole_value(py::handle object) {
  if (g_values.attr == nullptr || !THPVariable_Check(object.ptr())) {
    return py::none();
  }
  const at::Tensor& tensor = THPVariable_Unpack(object.ptr());
  if (!tensor.is_contiguous() || tensor.storage_offset() != 0) {
    return py::none();
  }
  py::object shape;
  py::object value = storage_value(tensor, shape);
  if (value.is_none() || !same_sizes(shape, tensor.sizes())) {
    return py::none();
  }
  return value;
}

// A view's strides as its StridedView addresses the storage with them: those of size-1 dims,
// which address nothing, made row-major's (tensor._addressing_strides).
c10::SmallVector<int64_t, 6> addressing_strides(const at::Tensor& tensor) {
  const auto sizes = tensor.sizes();
  const auto strides = tensor.strides();
  c10::SmallVector<int64_t, 6> addressing(sizes.size());
  int64_t row_major = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    addressing[d] = sizes[d] == 1 ? row_major : strides[d];
    row_major *= sizes[d];
  }
  return addressing;
}

// StridedView(value, start, the tensor's shape, `addressing`), as tensor.read_in_program makes it.
py::object strided_view(py::handle value, py::handle start, c10::IntArrayRef sizes, c10::ArrayRef<int64_t> addressing) {
  const auto dims = static_cast<Py_ssize_t>(sizes.size());
  py::tuple view_shape(dims), view_strides(dims);
  for (Py_ssize_t d = 0; d < dims; ++d) {
    PyTuple_SET_ITEM(view_shape.ptr(), d, PyLong_FromLongLong(sizes[d]));
    PyTuple_SET_ITEM(view_strides.ptr(), d, PyLong_FromLongLong(addressing[d]));
  }
  return py::reinterpret_borrow<py::object>(g_values.strided_view)(value, start, view_shape, view_strides);
}

// A tpu tensor that is its whole storage value with axes permuted (w.t(), x.transpose(1, 2)) as
// the StridedView tensor.read_in_program makes of it: the value, no start, the tensor's shape
// and addressing strides. Else None. The rule is tensor._is_whole_permutation's; ops read such
// views in their own program.
py::object permuted_view(const at::Tensor& tensor) {
  const int64_t dims = tensor.dim();
  if (dims < 2 || tensor.is_contiguous() || tensor.storage_offset() != 0) {
    return py::none();
  }
  const auto sizes = tensor.sizes();
  const auto addressing = addressing_strides(tensor);
  std::vector<int64_t> order(dims);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return addressing[a] > addressing[b]; });
  int64_t expected = 1;
  bool permuted = false;
  for (int64_t k = dims - 1; k >= 0; --k) {
    const int64_t d = order[k];
    if (sizes[d] != 1 && addressing[d] != expected) {
      return py::none();  // not dense: a slice, a broadcast
    }
    expected *= sizes[d];
    permuted = permuted || d != k;
  }
  if (!permuted) {
    return py::none();
  }
  py::object shape;
  py::object value = storage_value(tensor, shape);
  if (value.is_none()) {
    return py::none();
  }
  int64_t count = 1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape.ptr()); ++i) {
    count *= PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
  }
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return py::none();
  }
  if (count != tensor.numel()) {
    return py::none();
  }
  return strided_view(value, py::none(), sizes, addressing);
}

// An op's positional arguments for the per-op fast path (ops/dispatch/kernel.py): a key of what binding
// and promotion depend on, one byte per argument, and the arguments with each whole tensor
// replaced by its whole value (whole_value) and, at the positions set in `views_read_in_program`
// (bit i: argument i), each whole storage with axes permuted by its StridedView
// (permuted_view); the others, kept, Python converts. A tensor's byte is its dtype and one of
// kTensorStates; anything else's, its type. Arguments of other dtypes, states, types or number
// give another key. None for more than 8 arguments.
enum TensorState : uint64_t { kView, kWhole, kZeroDimView, kZeroDimWhole, kPermuted, kTensorStates };
// Keys of what is not a tensor: kOtherKeys | 1 bool, 2 int, 3 float, 4 complex, 5 None, 6 list or
// tuple, 7 anything else.
constexpr uint64_t kOtherKeys = 0xF0;
static_assert(
    static_cast<uint64_t>(c10::ScalarType::NumOptions) * kTensorStates < kOtherKeys, "a tensor's key takes one byte");
py::object whole_operands(py::handle args, uint64_t views_read_in_program) {
  const Py_ssize_t count = PyTuple_GET_SIZE(args.ptr());
  if (count == 0 || count > 8) {
    return py::none();
  }
  uint64_t key = 0;
  py::tuple values(count);
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* item = PyTuple_GET_ITEM(args.ptr(), i);
    uint64_t code;
    py::object value;
    if (THPVariable_Check(item)) {
      const at::Tensor& tensor = THPVariable_Unpack(item);
      value = whole_value(item);
      uint64_t state = tensor.dim() == 0 ? kZeroDimView : kView;
      if (!value.is_none()) {
        state += 1;  // (the matching whole state)
      } else if (views_read_in_program >> i & 1) {
        value = permuted_view(tensor);
        state = value.is_none() ? state : kPermuted;
      }
      code = static_cast<uint64_t>(tensor.scalar_type()) * kTensorStates + state + 1;
      if (value.is_none()) {
        value = py::reinterpret_borrow<py::object>(item);
      }
    } else {
      code = kOtherKeys | (PyBool_Check(item)           ? 1
                           : PyLong_CheckExact(item)    ? 2
                           : PyFloat_CheckExact(item)   ? 3
                           : PyComplex_CheckExact(item) ? 4
                           : item == Py_None            ? 5
                           : (PyList_Check(item) || PyTuple_Check(item)) ? 6
                                                                          : 7);
      value = py::reinterpret_borrow<py::object>(item);
    }
    PyTuple_SET_ITEM(values.ptr(), i, value.release().ptr());
    key = key << 8 | code;
  }
  return py::make_tuple(key, std::move(values));
}

// A new contiguous tpu:0 tensor whose storage holds `value` (a committed array or a pending
// Deferred one, of a dtype tpu has), else an undefined tensor: Python wraps it (tensor.wrap).
at::Tensor value_tensor(py::handle value) {
  py::object shape, dtype;
  if (g_values.attr == nullptr || !describe(value.ptr(), shape, dtype) || !PyTuple_Check(shape.ptr())) {
    return {};
  }
  if (Py_TYPE(value.ptr()) == g_values.array && !PyObject_IsTrue(value.attr(python_name(Name::array_committed)).ptr())) {
    return {};  // put on the device first (buffer.put)
  }
  std::optional<c10::ScalarType> scalar_type;
  for (const auto& [jax_dtype, torch_type] : g_values.by_identity) {
    if (jax_dtype == dtype.ptr()) {
      scalar_type = torch_type;
      break;
    }
  }
  if (!scalar_type) {  // (an equal dtype object of another identity)
    PyObject* torch_dtype = PyDict_GetItemWithError(g_values.to_torch, dtype.ptr());
    if (torch_dtype == nullptr) {
      if (PyErr_Occurred()) {
        throw py::error_already_set();
      }
      return {};
    }
    scalar_type = reinterpret_cast<THPDtype*>(torch_dtype)->scalar_type;
  }
  std::vector<int64_t> sizes(PyTuple_GET_SIZE(shape.ptr()));
  int64_t count = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sizes[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
    count *= sizes[i];
  }
  if (PyErr_Occurred()) {
    throw py::error_already_set();
  }
  auto tensor = empty(sizes, std::nullopt, *scalar_type, count * c10::elementSize(*scalar_type), 0);
  auto storage = py::reinterpret_steal<py::object>(THPStorage_Wrap(tensor.storage()));
  if (!storage || PyObject_SetAttr(storage.ptr(), g_values.attr, value.ptr()) != 0) {
    throw py::error_already_set();
  }
  return tensor;
}

// value_tensor's tensor as a Python object; None where Python wraps the value.
py::object wrap_value(py::handle value) {
  at::Tensor tensor = value_tensor(value);
  if (!tensor.defined()) {
    return py::none();
  }
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(tensor)));
}

PyObject* call_whole_operands(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  if (count != 2 || !PyTuple_Check(args[0]) || !PyLong_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "whole_operands(args: tuple, views_read_in_program: int)");
    return nullptr;
  }
  const uint64_t positions = PyLong_AsUnsignedLongLong(args[1]);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  return returning([&] { return whole_operands(args[0], positions); });
}

// Whether every tensor in the tuple `inputs` is contiguous (an elementwise op's output is then
// laid out contiguously too: tensor.wrap_elementwise's common case).
bool tensors_contiguous(PyObject* inputs) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(inputs); ++i) {
    PyObject* item = PyTuple_GET_ITEM(inputs, i);
    if (THPVariable_Check(item) && !THPVariable_Unpack(item).is_contiguous()) {
      return false;
    }
  }
  return true;
}

// wrap_value(value[, inputs]): with inputs (an elementwise op's arguments), only where every
// tensor among them is contiguous, the output's layout then (tensor.wrap_elementwise).
PyObject* call_wrap_value(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  if (count == 2) {
    if (!PyTuple_Check(args[1])) {
      PyErr_SetString(PyExc_TypeError, "wrap_value(value, inputs: tuple)");
      return nullptr;
    }
    if (!tensors_contiguous(args[1])) {
      Py_RETURN_NONE;
    }
  } else if (count != 1) {
    PyErr_SetString(PyExc_TypeError, "wrap_value(value[, inputs])");
    return nullptr;
  }
  return call_with_one<wrap_value>(nullptr, args[0]);
}

}  // namespace torch_tpu
