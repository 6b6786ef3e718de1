#include "PythonNames.h"

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

}  // namespace torch_tpu
