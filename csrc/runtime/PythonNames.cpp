#include "PythonNames.h"

#include <structmember.h>
#include <torch/csrc/utils/pybind.h>

#include <string>

namespace torch_tpu {

PyObject* g_python_names[static_cast<int>(Name::count)] = {};

int intern_python_names() {
  for (int i = 0; i < static_cast<int>(Name::count); ++i) {
    if (g_python_names[i] == nullptr) {
      g_python_names[i] = PyUnicode_InternFromString(kPythonNames[i].name);
      if (g_python_names[i] == nullptr) {
        return -1;
      }
    }
  }
  return 0;
}

PyObject* python_names_list() {
  PyObject* names = PyList_New(static_cast<Py_ssize_t>(Name::count));
  for (int i = 0; names != nullptr && i < static_cast<int>(Name::count); ++i) {
    PyObject* entry = Py_BuildValue("(ss)", kPythonNames[i].owner, kPythonNames[i].name);
    if (entry == nullptr) {
      Py_CLEAR(names);
      break;
    }
    PyList_SET_ITEM(names, i, entry);
  }
  return names;
}

Py_ssize_t slot_offset(PyTypeObject* type, Name slot, const char* who) {
  const char* name = python_name_entry(slot).name;
  PyObject* descr = PyDict_GetItemString(type->tp_dict, name);
  if (descr == nullptr || Py_TYPE(descr) != &PyMemberDescr_Type) {
    throw py::type_error(std::string(who) + ": " + type->tp_name + " has no __slots__ entry " + name);
  }
  return reinterpret_cast<PyMemberDescrObject*>(descr)->d_member->offset;
}

}  // namespace torch_tpu
