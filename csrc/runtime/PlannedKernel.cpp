#include "PlannedKernel.h"

#include "CoreFlags.h"
#include "FusedRecord.h"
#include "PythonNames.h"
#include "StorageValues.h"
#include "TpuFunctions.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <structmember.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace torch_tpu {

// ----------------------------------------------------------------------------- planned kernels
// A kernel the dispatcher calls (an op's tpu kernel, ops/dispatch/) that serves a call from a
// plan the op's Python kernel kept when every tensor argument was one the core reads whole
// (whole_operands: the key, the values) and every other one a static argument or a number
// (dispatch.plans.native_rules): the plan's program runs on those values and its output becomes the
// new tensor here, with no Python frame between the dispatcher and the program but a number's
// conversion (the op joins the flags' recorded_ops as there). A thread recording a fused graph
// records the program instead (its recorder's record, as the Python kernel calls it), and the
// pending output becomes the tensor the same way. Everything else goes to the Python kernel:
// keyword arguments, an unplanned key, launch blocking, a float32 matmul precision other than
// "highest", more than one device, a pending job, meta checks (CoreFlags.h), and a program or recording that
// raises (the Python kernel runs the call again and raises PyTorch's error).
struct PlanState {
  bool configured = false;
  PyObject* context = nullptr;  // runtime.context.context, the thread's execution state
  PyObject* wrap = nullptr;  // tensor.wrap
  PyObject* wrap_elementwise = nullptr;  // tensor.wrap_elementwise
  PyObject* number = nullptr;  // dispatch.conversion.number: a Python number as the program's input
  PyObject* wrap_output = nullptr;  // dispatch.variants.wrap_output: one output of a tuple
  PyObject* write_whole = nullptr;  // tensor.write_whole: an in-place variant's store
  // names read (PythonNames.h)
  PyObject* recorder = nullptr;
  PyObject* record = nullptr;
  PyObject* graph = nullptr;
  PyObject* launch_blocking = nullptr;
  PyObject* op = nullptr;
};
PlanState g_plans;
PyObject* g_zero = nullptr;  // 0, the tpu index numbers are converted for (one device in use)

// (dispatch.plans.NATIVE_STATIC, NATIVE_NUMBER, NATIVE_VIEW and NATIVE_INDICES)
enum NativeRule : long { kNativeStatic, kNativeNumber, kNativeView, kNativeIndices };

// The fields of the plan records (ops/dispatch/plans.py: NativePlan, NativeRule, HostRule), read
// by name through these; configure_plans checks they are the Python records' fields, in order.
enum PlanField : Py_ssize_t {
  kPlanProgram,
  kPlanDefaults,
  kPlanDefaultDtype,
  kPlanRules,
  kPlanReadsViews,
  kPlanHostRule,
  kPlanCheck,
  kPlanTraced,
};
enum RuleField : Py_ssize_t { kRulePosition, kRuleHow, kRuleDefault, kRuleConvert };
enum HostRuleField : Py_ssize_t { kHostShadow, kHostCopies };
const std::vector<std::pair<const char*, std::vector<const char*>>> kRecordFields = {
    {"NativePlan",
     {"program", "defaults", "default_dtype", "rules", "reads_views", "host_rule", "check", "traced"}},
    {"NativeRule", {"position", "how", "default", "convert"}},
    {"HostRule", {"shadow", "copies"}},
};

// Refuse Python plan records whose fields are not the ones the enums above name.
void check_record_fields(const py::dict& fields) {
  for (const auto& [record, names] : kRecordFields) {
    auto python = py::tuple(fields[record]);
    bool same = python.size() == names.size();
    for (size_t i = 0; same && i < names.size(); ++i) {
      same = python[i].cast<std::string>() == names[i];
    }
    if (!same) {
      throw std::runtime_error(
          std::string("torch_tpu: the C++ core reads ") + record +
          " with other fields than ops/dispatch/plans.py declares: rebuild it (pip install -e .)");
    }
  }
}

void configure_plans(
    py::handle context,
    py::handle wrap,
    py::handle wrap_elementwise,
    py::handle number,
    py::handle wrap_output,
    py::handle write_whole,
    py::dict record_fields) {
  check_record_fields(record_fields);
  g_plans.context = context.inc_ref().ptr();
  g_plans.wrap = wrap.inc_ref().ptr();
  g_plans.wrap_elementwise = wrap_elementwise.inc_ref().ptr();
  g_plans.number = number.inc_ref().ptr();
  g_plans.wrap_output = wrap_output.inc_ref().ptr();
  g_plans.write_whole = write_whole.inc_ref().ptr();
  g_zero = PyLong_FromLong(0);
  g_plans.recorder = python_name(Name::context_recorder);
  g_plans.record = python_name(Name::recorder_record);
  g_plans.graph = python_name(Name::recorder_graph);
  g_plans.launch_blocking = python_name(Name::context_launch_blocking);
  g_plans.op = python_name(Name::context_op);
  g_plans.configured = true;
}

// Whether a call of `op` may run from a plan: the per-process and per-thread state the Python
// kernel's fast path tests (ops/dispatch/kernel.py, Compute.call), as it is now; `recorder` is
// then the thread's fused recorder (None in strict mode).
bool plans_apply(PyObject* op, py::object& recorder) {
  recorder = py::reinterpret_steal<py::object>(PyObject_GetAttr(g_plans.context, g_plans.recorder));
  if (!recorder) {
    return false;
  }
  if (!flag_is(Flag::attention_needed, Py_False) || !flag_is(Flag::others_used, Py_False) ||
      !flag_is(Flag::check_meta, Py_False) ||
      at::globalContext().float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST) {
    return false;
  }
  auto blocking = py::reinterpret_steal<py::object>(PyObject_GetAttr(g_plans.context, g_plans.launch_blocking));
  if (blocking.ptr() != Py_False) {
    return false;
  }
  PyObject* recorded = flag(Flag::recorded_ops);
  return recorded == Py_None || (recorded != nullptr && PySet_CheckExact(recorded) && PySet_Add(recorded, op) == 0);
}

WrappedOutput wrap_program_output(long returns, PyObject* item, PyObject* args) {
  if (returns != kLikeInputs || tensors_contiguous(args)) {
    at::Tensor tensor = value_tensor(item);
    if (tensor.defined()) {
      return {std::move(tensor), {}};
    }
  }
  PyObject* wrapped = returns == kTuple ? PyObject_CallOneArg(g_plans.wrap_output, item)
      : returns == kLikeInputs          ? PyObject_CallFunctionObjArgs(g_plans.wrap_elementwise, item, args, nullptr)
                                        : PyObject_CallOneArg(g_plans.wrap, item);
  return {{}, py::reinterpret_steal<py::object>(wrapped)};
}

// The outputs of a planned program (one, or each of a tuple's) as wrap_program_output makes them, in
// order; false, with the error set, where a Python wrap raised or a tuple-returning op's program
// returned no tuple.
bool wrap_each_output(long returns, PyObject* out, PyObject* args, c10::SmallVector<WrappedOutput, 2>& outputs) {
  if (returns != kTuple) {
    outputs.push_back(wrap_program_output(returns, out, args));
    return outputs.back().tensor.defined() || outputs.back().python;
  }
  if (!PyTuple_Check(out)) {
    PyErr_SetString(PyExc_TypeError, "PlannedKernel: a program of a tuple-returning op returned no tuple");
    return false;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(out); ++i) {
    outputs.push_back(wrap_program_output(kTuple, PyTuple_GET_ITEM(out, i), args));
    if (!outputs.back().tensor.defined() && !outputs.back().python) {
      return false;
    }
  }
  return true;
}

// The op's outputs as its Python kernel returns them (ops/dispatch/variants.py, functional_kernel).
PyObject* wrap_outputs(long returns, const py::object& out, PyObject* args) {
  c10::SmallVector<WrappedOutput, 2> outputs;
  if (!wrap_each_output(returns, out.ptr(), args, outputs)) {
    return nullptr;
  }
  auto as_object = [](WrappedOutput& output) {
    return output.tensor.defined() ? THPVariable_Wrap(std::move(output.tensor)) : output.python.release().ptr();
  };
  if (returns != kTuple) {
    return as_object(outputs[0]);
  }
  py::tuple tensors(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    PyTuple_SET_ITEM(tensors.ptr(), i, as_object(outputs[i]));
  }
  return tensors.release().ptr();
}

// The StridedView a fused node reads `tensor` through, over its storage's `value`: its start
// (None at offset 0, else the offset as dispatch.conversion.number's device scalar), shape and addressing
// strides; nullptr, with the error set, where the start's conversion raised.
py::object view_over(const at::Tensor& tensor, const py::object& value) {
  py::object start = py::none();
  if (tensor.storage_offset() != 0) {
    auto offset = py::reinterpret_steal<py::object>(PyLong_FromLongLong(tensor.storage_offset()));
    PyObject* pair[] = {offset.ptr(), g_zero};
    start = py::reinterpret_steal<py::object>(PyObject_Vectorcall(g_plans.number, pair, 2, nullptr));
    if (!start) {
      return {};
    }
  }
  return strided_view(value, start, tensor.sizes(), addressing_strides(tensor));
}

// A tpu view as tensor.read_in_program hands it to an op recorded in a fused graph (every view
// there is read inside its op's node): view_over its storage's value. None where Python reads it
// (a complex view, which it reads resolved; a value storage_value leaves to Python).
py::object recorded_view(const at::Tensor& tensor) {
  if (c10::isComplexType(tensor.scalar_type())) {
    return py::none();
  }
  py::object shape;
  py::object value = storage_value(tensor, shape);
  return value.is_none() ? value : view_over(tensor, value);
}

// tensor.read_in_program while a fused graph records, in one call and one read of the storage:
// the value of a tensor that is its whole storage in order (as whole_value), else its view as
// recorded_view makes it; None where Python reads it (recorded_view's cases, and views' start
// offsets on a device other than tpu:0).
py::object read_recorded(py::handle object) {
  if (!values_configured() || !THPVariable_Check(object.ptr())) {
    return py::none();
  }
  const at::Tensor& tensor = THPVariable_Unpack(object.ptr());
  py::object shape;
  py::object value = storage_value(tensor, shape);  // (read once: whole or not)
  if (value.is_none() ||
      (tensor.is_contiguous() && tensor.storage_offset() == 0 && same_sizes(shape, tensor.sizes()))) {
    return value;
  }
  if (c10::isComplexType(tensor.scalar_type()) || !g_plans.configured ||
      !flag_is(Flag::others_used, Py_False)) {
    PyErr_Clear();
    return py::none();
  }
  py::object view = view_over(tensor, value);
  if (!view) {
    throw py::error_already_set();
  }
  return view;
}

// Whether a static argument is, or lists, a float JAX's jit cache would merge with another: -0.0
// (equal to 0.0) or NaN (dispatch.conversion.ExactStatic).
bool merged_by_jit(PyObject* value) {
  if (PyFloat_CheckExact(value)) {
    const double x = PyFloat_AS_DOUBLE(value);
    return std::isnan(x) || (x == 0.0 && std::signbit(x));
  }
  if (PyList_Check(value)) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); ++i) {
      if (merged_by_jit(PyList_GET_ITEM(value, i))) {
        return true;
      }
    }
  }
  return false;
}

// Whether `item` (an argument, or an item of a list argument) is a tensor of `storage`.
bool shares(PyObject* item, const c10::StorageImpl* storage) {
  return THPVariable_Check(item) && THPVariable_Unpack(item).storage().unsafeGetStorageImpl() == storage;
}

// Whether an in-place call's first argument shares its storage with none of the others, nor with
// a tensor of a list among them (a tensor that does is left to Python, which refuses a partial
// overlap as PyTorch does).
bool first_stands_alone(PyObject* args) {
  PyObject* first = PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, 0) : nullptr;
  if (first == nullptr || !THPVariable_Check(first)) {
    return false;
  }
  const c10::StorageImpl* storage = THPVariable_Unpack(first).storage().unsafeGetStorageImpl();
  for (Py_ssize_t i = 1; i < PyTuple_GET_SIZE(args); ++i) {
    PyObject* item = PyTuple_GET_ITEM(args, i);
    if (shares(item, storage)) {
      return false;
    }
    for (Py_ssize_t k = 0; PyList_Check(item) && k < PyList_GET_SIZE(item); ++k) {
      if (shares(PyList_GET_ITEM(item, k), storage)) {
        return false;
      }
    }
  }
  return true;
}

// A list of indices (Tensor?[]) as dispatch.conversion.indices_to_jax makes it, where each is None or a
// tpu tensor that is its whole storage value; else None (Python converts it).
py::object whole_indices(PyObject* indices) {
  if (!PyList_Check(indices)) {
    return py::none();
  }
  const Py_ssize_t count = PyList_GET_SIZE(indices);
  py::list values(count);
  for (Py_ssize_t k = 0; k < count; ++k) {
    PyObject* item = PyList_GET_ITEM(indices, k);
    py::object value = item == Py_None ? py::none() : whole_value(item);
    if (value.is_none() && item != Py_None) {
      return py::none();
    }
    PyList_SET_ITEM(values.ptr(), k, value.release().ptr());
  }
  return std::move(values);
}

// Whether one of `values` (a planned call's operands) has a host copy, for a plan whose op has a
// host rule (`host_rule`: a HostRule, dispatch.programs.shadow for it taking the call's arguments and output,
// host_copies.host_copies_by_id); None for an op without one).
bool operand_has_host_copy(PyObject* host_rule, PyObject* values) {
  if (host_rule == Py_None) {
    return false;
  }
  PyObject* copies = PyTuple_GET_ITEM(host_rule, kHostCopies);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(values); ++i) {
    auto id = py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(PyTuple_GET_ITEM(values, i)));
    if (!id || PyDict_Contains(copies, id.ptr()) != 0) {
      PyErr_Clear();
      return true;
    }
  }
  return false;
}

// The output of the plan's program run for the call; nullptr and no error where no plan applies.
PyObject* run_program(PlannedKernel* self, PyObject* args) {
  if (self->returns == kWritesFirst && !first_stands_alone(args)) {
    return nullptr;
  }
  py::object recorder;
  if (g_plans.context == nullptr || !plans_apply(self->op, recorder)) {
    PyErr_Clear();  // (a state not readable as expected: the Python kernel's own reading)
    return nullptr;
  }
  py::object operands = whole_operands(args, self->views_read_in_program);
  if (operands.is_none()) {
    return nullptr;
  }
  // (held: another thread may replace the entry while the program runs without the GIL)
  auto plan = py::reinterpret_borrow<py::object>(
      PyDict_GetItemWithError(self->plans, PyTuple_GET_ITEM(operands.ptr(), 0)));
  auto* default_dtype = reinterpret_cast<PyObject*>(
      torch::getTHPDtype(c10::typeMetaToScalarType(c10::get_default_dtype())));
  if (!plan || PyTuple_GET_ITEM(plan.ptr(), kPlanDefaultDtype) != default_dtype) {
    return nullptr;
  }
  if (recorder.ptr() == Py_None && PyTuple_GET_ITEM(plan.ptr(), kPlanReadsViews) == Py_True) {
    return nullptr;  // (it reads views, which strict eager reads apart: Python's)
  }
  PyObject* values = PyTuple_GET_ITEM(operands.ptr(), 1);
  PyObject* host_rule = PyTuple_GET_ITEM(plan.ptr(), kPlanHostRule);
  const bool on_host_too = operand_has_host_copy(host_rule, values);
  PyObject* defaults = PyTuple_GET_ITEM(plan.ptr(), kPlanDefaults);
  const Py_ssize_t given = PyTuple_GET_SIZE(values);
  const Py_ssize_t count = given + PyTuple_GET_SIZE(defaults);
  c10::SmallVector<PyObject*, 16> stack(count + 1);  // (slot 0 free: PY_VECTORCALL_ARGUMENTS_OFFSET)
  for (Py_ssize_t i = 0; i < count; ++i) {
    stack[i + 1] = i < given ? PyTuple_GET_ITEM(values, i) : PyTuple_GET_ITEM(defaults, i - given);
  }
  // the plan's conversions, as the Python kernel's fast path does them (dispatch.plans.native_rules)
  c10::SmallVector<py::object, 4> converted;
  PyObject* rules = PyTuple_GET_ITEM(plan.ptr(), kPlanRules);
  for (Py_ssize_t r = 0; r < PyTuple_GET_SIZE(rules); ++r) {
    PyObject* rule = PyTuple_GET_ITEM(rules, r);
    PyObject*& value = stack[PyLong_AsSsize_t(PyTuple_GET_ITEM(rule, kRulePosition)) + 1];
    PyObject* fallback = PyTuple_GET_ITEM(rule, kRuleDefault);
    const long how = PyLong_AsLong(PyTuple_GET_ITEM(rule, kRuleHow));
    if (how == kNativeView) {
      converted.push_back(THPVariable_Check(value) ? recorded_view(THPVariable_Unpack(value)) : py::none());
      if (!converted.back() || converted.back().is_none()) {
        return nullptr;  // (an error set, or Python reads it)
      }
      value = converted.back().ptr();
      continue;
    }
    if (how == kNativeIndices) {
      converted.push_back(whole_indices(value));
      if (converted.back().is_none()) {
        return nullptr;
      }
      value = converted.back().ptr();
      continue;
    }
    if (how == kNativeStatic) {
      if (merged_by_jit(value)) {
        return nullptr;  // (Python's dispatch.conversion.exact_static keys it)
      }
      if (PyList_Check(value)) {  // (a shape or dims list: the program's static tuple)
        converted.push_back(py::reinterpret_steal<py::object>(PyList_AsTuple(value)));
        if (!converted.back()) {
          return nullptr;
        }
        value = converted.back().ptr();
      }
      continue;
    }
    if (Py_TYPE(value) == Py_TYPE(fallback)) {
      const int same = PyObject_RichCompareBool(value, fallback, Py_EQ);
      if (same < 0) {
        return nullptr;
      }
      if (same) {
        value = Py_None;  // (its default: a constant of the program)
        continue;
      }
    }
    if (value != Py_None) {  // (the number's own conversion, dispatch's FittedNumber, or number)
      PyObject* own = PyTuple_GET_ITEM(rule, kRuleConvert);
      PyObject* number = own != Py_None ? own : g_plans.number;
      PyObject* pair[] = {value, g_zero};
      converted.push_back(py::reinterpret_steal<py::object>(PyObject_Vectorcall(number, pair, 2, nullptr)));
      if (!converted.back()) {  // (a fitted number refused: the Python kernel refuses it in CPU's order)
        if (PyErr_ExceptionMatches(PyExc_Exception)) {
          PyErr_Clear();
        }
        return nullptr;
      }
      value = converted.back().ptr();
    }
  }
  if (PyObject_SetAttr(g_plans.context, g_plans.op, self->name) != 0) {
    return nullptr;
  }
  PyObject* check = PyTuple_GET_ITEM(plan.ptr(), kPlanCheck);
  if (check != Py_None) {  // (one that refuses: the Python kernel runs the call again and raises)
    PyObject* passed = PyObject_Vectorcall(check, stack.data() + 1, count | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    if (passed == nullptr) {
      if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
      }
      return nullptr;
    }
    Py_DECREF(passed);
  }
  PyObject* program = PyTuple_GET_ITEM(plan.ptr(), kPlanProgram);
  PyObject* out;
  if (recorder.ptr() == Py_None || PyTuple_GET_ITEM(plan.ptr(), kPlanTraced) == Py_False) {
    out = PyObject_Vectorcall(program, stack.data() + 1, count | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  } else {  // a pending output, under the "highest" precision (None) tested above: the
            // node recorded here where it repeats the graph's template, else
            // recorder.record(program, arguments, None, name, None)
    auto arguments = py::reinterpret_steal<py::object>(PyTuple_New(count));
    auto graph = py::reinterpret_steal<py::object>(PyObject_GetAttr(recorder.ptr(), g_plans.graph));
    if (!arguments || !graph) {
      return nullptr;
    }
    for (Py_ssize_t i = 0; i < count; ++i) {
      Py_INCREF(stack[i + 1]);
      PyTuple_SET_ITEM(arguments.ptr(), i, stack[i + 1]);
    }
    out = torch_tpu::record_repeated(graph.ptr(), program, arguments.ptr(), Py_None);
    if (out == Py_NotImplemented) {
      Py_DECREF(out);
      PyObject* call[] = {recorder.ptr(), program, arguments.ptr(), Py_None, self->name, Py_None};
      out = PyObject_VectorcallMethod(g_plans.record, call, 6, nullptr);
    }
  }
  if (out == nullptr && PyErr_ExceptionMatches(PyExc_Exception)) {
    PyErr_Clear();  // the Python kernel runs the call again and raises PyTorch's error
  }
  if (out != nullptr && on_host_too) {  // (its result's host copy, computed by the rule)
    PyObject* kept = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(host_rule, kHostShadow), args, out, nullptr);
    if (kept == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(kept);
  }
  return out;
}

// An in-place call's output stored into its first argument (tensor.write_whole): whether it
// was; false, with no error, where Python stores it (the Python kernel runs the call again).
bool write_first(PyObject* args, PyObject* out) {
  PyObject* written = PyObject_CallFunctionObjArgs(g_plans.write_whole, PyTuple_GET_ITEM(args, 0), out, nullptr);
  if (written == nullptr) {
    PyErr_Clear();
    return false;
  }
  Py_DECREF(written);
  return written == Py_True;
}

// The call served from its plan: a new tensor (an in-place call's first argument); nullptr and no
// error where no plan applies.
PyObject* run_plan(PlannedKernel* self, PyObject* args) {
  auto out = py::reinterpret_steal<py::object>(run_program(self, args));
  if (out && self->returns == kWritesFirst) {
    return write_first(args, out.ptr()) ? Py_NewRef(PyTuple_GET_ITEM(args, 0)) : nullptr;
  }
  return out ? wrap_outputs(self->returns, out, args) : nullptr;
}

PyObject* planned_kernel_call(PyObject* object, PyObject* args, PyObject* kwargs) {
  auto* self = reinterpret_cast<PlannedKernel*>(object);
  if (self->kernel == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "PlannedKernel: cleared");
    return nullptr;
  }
  if (kwargs == nullptr || PyDict_GET_SIZE(kwargs) == 0) {
    PyObject* result = returning([&] { return py::reinterpret_steal<py::object>(run_plan(self, args)); });
    if (result != nullptr || PyErr_Occurred()) {
      return result;
    }
  }
  return PyObject_Call(self->kernel, args, kwargs);
}

PyObject* planned_kernel_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *kernel, *plans, *op, *name, *views;
  long returns;
  static const char* names[] = {"kernel", "plans", "op", "name", "views_read_in_program", "returns", nullptr};
  if (!PyArg_ParseTupleAndKeywords(
          args, kwargs, "OO!OUO!l:PlannedKernel", const_cast<char**>(names), &kernel, &PyDict_Type, &plans, &op,
          &name, &PyLong_Type, &views, &returns)) {
    return nullptr;
  }
  if (returns < kOne || returns > kWritesFirst) {
    PyErr_SetString(
        PyExc_ValueError,
        "PlannedKernel: returns is 0 (one tensor), 1 (laid out like inputs), 2 (a tuple) or 3 (its first argument)");
    return nullptr;
  }
  const uint64_t positions = PyLong_AsUnsignedLongLong(views);
  if (PyErr_Occurred()) {
    return nullptr;
  }
  auto* self = reinterpret_cast<PlannedKernel*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    return nullptr;
  }
  self->kernel = Py_NewRef(kernel);
  self->plans = Py_NewRef(plans);
  self->op = Py_NewRef(op);
  self->name = Py_NewRef(name);
  self->views_read_in_program = positions;
  self->returns = returns;
  return reinterpret_cast<PyObject*>(self);
}

int planned_kernel_traverse(PyObject* object, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<PlannedKernel*>(object);
  Py_VISIT(self->kernel);
  Py_VISIT(self->plans);
  Py_VISIT(self->op);
  Py_VISIT(self->name);
  Py_VISIT(Py_TYPE(object));  // (a heap type)
  return 0;
}

int planned_kernel_clear(PyObject* object) {
  auto* self = reinterpret_cast<PlannedKernel*>(object);
  Py_CLEAR(self->kernel);
  Py_CLEAR(self->plans);
  Py_CLEAR(self->op);
  Py_CLEAR(self->name);
  return 0;
}

void planned_kernel_dealloc(PyObject* object) {
  PyTypeObject* type = Py_TYPE(object);
  PyObject_GC_UnTrack(object);
  planned_kernel_clear(object);
  type->tp_free(object);
  Py_DECREF(type);
}

PyMemberDef g_planned_kernel_members[] = {
    {"kernel", T_OBJECT_EX, offsetof(PlannedKernel, kernel), READONLY, "the op's Python kernel"},
    {"plans", T_OBJECT_EX, offsetof(PlannedKernel, plans), READONLY, "{key: (program, defaults, default dtype, conversions)}"},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot g_planned_kernel_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(planned_kernel_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(planned_kernel_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(planned_kernel_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(planned_kernel_clear)},
    {Py_tp_call, reinterpret_cast<void*>(planned_kernel_call)},
    {Py_tp_members, g_planned_kernel_members},
    {Py_tp_doc,
     const_cast<char*>("PlannedKernel(kernel, plans, op, name, views_read_in_program, returns): an op's tpu "
                       "kernel serving planned calls in C++, the others by `kernel`")},
    {0, nullptr}};

PyType_Spec g_planned_kernel_spec = {
    "torch_tpu._C.PlannedKernel", sizeof(PlannedKernel), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    g_planned_kernel_slots};

}  // namespace torch_tpu
