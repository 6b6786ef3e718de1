#include "BoxedPlannedKernel.h"

#include "PlannedKernel.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <memory>

namespace torch_tpu {

namespace {

// ----------------------------------------------------------------------------- boxed planned kernels
// A PlannedKernel registered with the dispatcher directly, in place of the Python kernel holder
// torch.library would wrap around it: the call's arguments become Python objects as that holder
// makes them (torch::jit::toPyObject; trailing positional and keyword-only arguments equal to
// their defaults left out, other keyword-only ones passed by name), the PlannedKernel runs, and
// its tensors go back on the stack. Only ops whose arguments the holder converts with
// toPyObject too (no dtype, layout or memory-format argument) and that return tensors are served
// here (serve_boxed); the holder's own steps for tensor subclasses and dispatch modes call the
// same Python function, which this calls in every case.
bool converted_like_the_holder(const c10::TypePtr& type) {
  const c10::TypePtr& inner = type->kind() == c10::TypeKind::OptionalType
      ? type->castRaw<c10::OptionalType>()->getElementType()
      : type;
  switch (inner->kind()) {
    case c10::TypeKind::TensorType:
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::BoolType:
    case c10::TypeKind::NumberType:
    case c10::TypeKind::StringType:
      return true;
    case c10::TypeKind::ListType: {
      const auto kind = inner->castRaw<c10::ListType>()->getElementType()->kind();
      return kind == c10::TypeKind::IntType || kind == c10::TypeKind::SymIntType ||
          kind == c10::TypeKind::FloatType || kind == c10::TypeKind::BoolType;
    }
    default:
      return false;
  }
}

// An argument as the holder's torch::jit::toPyObject makes it. A number PyTorch wrapped into a CPU
// tensor (`x * 2`) becomes that number: read here where the tensor has no Python object, so no
// `_wrapped_number` attribute (toPyObject makes the object and looks the attribute up, a failed
// lookup raising and clearing an AttributeError at every call); the rest is toPyObject's.
py::object holder_object(const c10::IValue& argument) {
  if (argument.isTensor()) {
    const at::Tensor& tensor = argument.toTensor();
    c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
    if (impl->is_wrapped_number() && impl->pyobj_slot()->load_pyobj() == nullptr && tensor.device().is_cpu()) {
      switch (tensor.scalar_type()) {
        case at::ScalarType::Bool:
          return py::bool_(*tensor.const_data_ptr<bool>());
        case at::ScalarType::Long:
          return py::int_(*tensor.const_data_ptr<int64_t>());
        case at::ScalarType::Double:
          return py::float_(*tensor.const_data_ptr<double>());
        default:
          break;  // (uint64, complex: toPyObject's)
      }
    }
  }
  return torch::jit::toPyObject(argument);
}

struct BoxedPlannedKernel final : c10::OperatorKernel {
  BoxedPlannedKernel(PyObject* planned, size_t keywords_start) : planned(planned), keywords_start(keywords_start) {}
  PyObject* planned;  // the PlannedKernel (kept for the process's lifetime, as the library is)
  size_t keywords_start;  // the schema's first keyword-only argument (their count if none)

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const auto& declared = schema.arguments();
    const size_t count = declared.size();
    auto arguments = torch::jit::last(*stack, count);
    auto is_default = [&](size_t i) {
      const auto& fallback = declared[i].default_value();
      return fallback.has_value() && *fallback == arguments[i];
    };
    // the call as the plans know it (dispatch.binding.Binder.positional): its arguments up to the last
    // one not at its default, a keyword-only one too (`x.add(y, alpha=2)`)
    size_t used = count;
    while (used > 0 && is_default(used - 1)) {
      --used;
    }
    py::gil_scoped_acquire gil;
    py::tuple call(used);
    for (size_t i = 0; i < used; ++i) {
      PyTuple_SET_ITEM(call.ptr(), i, holder_object(arguments[i]).release().ptr());
    }
    auto* self = reinterpret_cast<PlannedKernel*>(planned);
    TORCH_CHECK(self->kernel != nullptr, schema.name(), ": its PlannedKernel was cleared");
    {
      auto out = py::reinterpret_steal<py::object>(run_program(self, call.ptr()));
      if (out && self->returns == kWritesFirst) {
        if (write_first(call.ptr(), out.ptr())) {
          at::Tensor first = arguments[0].toTensor();
          torch::jit::drop(*stack, count);
          torch::jit::push(*stack, std::move(first));
          return;
        }
      } else if (out) {  // (the core's tensors go on the stack as they are: no Python object made for them)
        c10::SmallVector<WrappedOutput, 2> outputs;
        if (!wrap_each_output(self->returns, out.ptr(), call.ptr(), outputs)) {
          raise_if_set();
        }
        TORCH_CHECK(
            outputs.size() == schema.returns().size(), schema.name(), ": its program returned ", outputs.size(),
            " outputs, not ", schema.returns().size());
        torch::jit::drop(*stack, count);
        for (auto& output : outputs) {
          torch::jit::push(*stack, output.tensor.defined() ? std::move(output.tensor) : unpacked(output.python.ptr(), schema));
        }
        return;
      }
      raise_if_set();
    }
    // the Python kernel's call: the positional arguments given, the keyword-only ones by name
    py::object args = call, kwargs;
    if (used > keywords_start) {
      size_t positional = keywords_start;
      while (positional > 0 && is_default(positional - 1)) {
        --positional;
      }
      args = py::reinterpret_steal<py::object>(PyTuple_GetSlice(call.ptr(), 0, positional));
      kwargs = py::dict();
      for (size_t i = keywords_start; i < used; ++i) {
        if (!is_default(i)) {
          kwargs[declared[i].name().c_str()] = call[i];
        }
      }
    }
    auto result = py::reinterpret_steal<py::object>(PyObject_Call(self->kernel, args.ptr(), kwargs.ptr()));
    raise_if_set();
    const size_t returns = schema.returns().size();
    torch::jit::drop(*stack, count);
    if (returns == 1) {
      torch::jit::push(*stack, unpacked(result.ptr(), schema));
      return;
    }
    TORCH_CHECK(
        PyTuple_Check(result.ptr()) && static_cast<size_t>(PyTuple_GET_SIZE(result.ptr())) == returns,
        schema.name(), ": its tpu kernel returned no tuple of ", returns, " tensors");
    for (size_t i = 0; i < returns; ++i) {
      torch::jit::push(*stack, unpacked(PyTuple_GET_ITEM(result.ptr(), i), schema));
    }
  }

  // A Python error raised by the call as the C++ exception PyTorch's bindings raise again.
  static void raise_if_set() {
    if (PyErr_Occurred()) {
      python_error error;
      error.persist();
      throw std::move(error);
    }
  }

  static at::Tensor unpacked(PyObject* item, const c10::FunctionSchema& schema) {
    if (item == Py_None) {
      return at::Tensor();  // (an output not computed: as the holder's conversion)
    }
    TORCH_CHECK(
        THPVariable_Check(item), schema.name(), ": its tpu kernel returned a ", Py_TYPE(item)->tp_name,
        ", not a tensor");
    return THPVariable_Unpack(item);
  }

};

// Registers `planned` (a PlannedKernel) as the tpu kernel of aten::`name`.`overload` ("" for

}  // namespace

// registered, where not.
bool serve_boxed(const std::string& name, const std::string& overload, py::handle planned) {
  static auto* library = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(("aten::" + name).c_str(), overload.c_str());
  const auto& schema = handle.schema();
  if (schema.is_vararg() || schema.is_varret() || schema.returns().empty()) {
    return false;
  }
  for (const auto& argument : schema.arguments()) {
    if (!converted_like_the_holder(argument.real_type())) {
      return false;
    }
  }
  for (const auto& output : schema.returns()) {
    if (output.type()->kind() != c10::TypeKind::TensorType) {
      return false;
    }
  }
  size_t keywords_start = schema.arguments().size();
  while (keywords_start > 0 && schema.arguments()[keywords_start - 1].kwarg_only()) {
    --keywords_start;
  }
  library->impl(
      (overload.empty() ? name : name + "." + overload).c_str(),
      torch::CppFunction::makeFromBoxedFunctor(
          std::make_unique<BoxedPlannedKernel>(planned.inc_ref().ptr(), keywords_start)));
  return true;
}

}  // namespace torch_tpu
