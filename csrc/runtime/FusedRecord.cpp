// A fused graph's recording of an op it recorded the same way last time.
//
// In fused eager an op becomes a node of its thread's open graph (execution/fused.py,
// Graph.record): each argument becomes a spec (a leaf index for a concrete array, a node's output
// for a pending one, a view's storage and geometry, a static argument with its cache key), and
// the node's key (the op, its input signature, the specs, the matmul precision) is compared with
// the node at the same place in the last graph that started with the same op at the same line
// (the graph's template). A training or generation loop meets the same node there at every step;
// Graph.record then only appends the template's entry and the new leaves and returns new
// Deferred outputs. That path is this file's: the same specs, key, comparison and appends, built
// in C++ (in Python it was a sixth of a fused forward's time). Every other case answers
// NotImplemented before anything of the graph changed, and Graph.record decides: the graph's first
// op, an op learned to churn, another graph's pending inputs, keyword arguments, an array that is
// no concrete jax array, a node not at its place in the template, an output of no array,
// recompile logging, several devices.
// The Python stays the definition: this must build exactly the objects Graph.record builds.

#include "FusedRecord.h"

#include "CoreFlags.h"
#include "PythonNames.h"

#include <ATen/Context.h>
#include <pybind11/pybind11.h>
#include <structmember.h>

#include <vector>

namespace torch_tpu {
namespace {

namespace py = pybind11;

// The objects and names Python hands over once (configure_fused), kept for the process.
struct FusedState {
  bool configured = false;
  PyObject* fused = nullptr;  // execution.fused's globals
  PyObject* checks = nullptr;  // runtime.checks'
  PyTypeObject* deferred = nullptr;  // buffer.Deferred
  PyTypeObject* strided = nullptr;  // buffer.StridedView
  PyTypeObject* array = nullptr;  // jax's concrete array type
  PyTypeObject* entry = nullptr;  // fused.NodeEntry: a template's entries
  PyObject* jax_array = nullptr;  // jax.Array: any other array is Python's to record
  PyObject* open = nullptr;  // fused._OPEN
  PyObject* now = nullptr;  // fused._NOW
  PyObject* no_checks = nullptr;  // fused._NO_CHECKS
  PyObject* leaf = nullptr;  // the spec kinds fused._LEAF ... _VIEW
  PyObject* node = nullptr;
  PyObject* static_ = nullptr;
  PyObject* seq = nullptr;
  PyObject* view = nullptr;
  // offsets of the __slots__ read and written (Deferred's; StridedView's)
  Py_ssize_t shape = 0, dtype = 0, size = 0, weak_type = 0, graph = 0, node_at = 0, index = 0, value = 0,
             error = 0;
  Py_ssize_t buf = 0, start = 0, view_shape = 0, strides = 0;
};
FusedState F;

// The fields of fused.NodeEntry (a NamedTuple: a tuple, read by position here), in its order;
// configure_fused refuses a NodeEntry declared with others.
enum EntryField : Py_ssize_t { kEntryNode, kEntryBuilt, kEntryAvals, kEntrySignature, kEntryKey, kEntryFields };
constexpr const char* kEntryFieldNames[kEntryFields] = {"node", "built", "avals", "signature", "key"};

// names read (PythonNames.h)
struct Names {
  PyObject *state, *seen, *churning, *unclaimed, *nodes, *leaves, *leaf_avals, *leaf_ids, *taints, *templ,
      *interned, *entries, *positions, *signatures, *outputs, *lock, *acquire, *release, *key, *aval, *shape,
      *dtype, *weak_type, *checks_taints, *taint_of, *unflatten;
};
Names N;

PyObject* not_implemented() {
  return Py_NewRef(Py_NotImplemented);
}

// An object's __slots__ entry at `offset` (nullptr where never set: then Python records the op).
PyObject*& slot(PyObject* object, Py_ssize_t offset) {
  return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(object) + offset);
}

py::object steal(PyObject* object) {
  return py::reinterpret_steal<py::object>(object);
}

py::object pack(std::initializer_list<PyObject*> items) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
  if (tuple == nullptr) {
    return {};
  }
  Py_ssize_t i = 0;
  for (PyObject* item : items) {
    PyTuple_SET_ITEM(tuple, i++, Py_NewRef(item));
  }
  return steal(tuple);
}

py::object tuple_of(const std::vector<py::object>& items) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
  if (tuple == nullptr) {
    return {};
  }
  for (size_t i = 0; i < items.size(); ++i) {
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), Py_NewRef(items[i].ptr()));
  }
  return steal(tuple);
}

// fused._typed: a static argument as a cache key (1, 1.0 and True kept apart; -0.0 and NaN by
// their repr).
py::object typed(PyObject* x) {
  PyTypeObject* kind = Py_TYPE(x);
  auto* type = reinterpret_cast<PyObject*>(kind);
  if (kind == &PyFloat_Type) {
    const double v = PyFloat_AS_DOUBLE(x);
    if (v == v && v != 0.0) {
      return pack({type, x});
    }
    auto text = steal(PyObject_Repr(x));
    return text ? pack({type, text.ptr()}) : py::object();
  }
  if (kind == &PyList_Type || kind == &PyTuple_Type) {
    auto items = steal(PySequence_Tuple(x));
    if (!items) {
      return {};
    }
    bool ints = true;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items.ptr()) && ints; ++i) {
      ints = PyLong_CheckExact(PyTuple_GET_ITEM(items.ptr(), i));
    }
    if (ints) {
      return pack({type, items.ptr()});
    }
    std::vector<py::object> keys;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items.ptr()); ++i) {
      keys.push_back(typed(PyTuple_GET_ITEM(items.ptr(), i)));
      if (!keys.back()) {
        return {};
      }
    }
    auto keyed = tuple_of(keys);
    return keyed ? pack({type, keyed.ptr()}) : py::object();
  }
  return pack({type, x});
}

enum Outcome { kBuilt, kPython, kFailed };

// One node's arguments turned into specs, as Graph._specs turns them, without touching the
// graph: the leaves it adds are kept here until the node is known to repeat its template's.
struct NodeWalk {
  PyObject* graph;
  PyObject* leaf_ids;  // the graph's {id(array): leaf index}
  PyObject* node_taints;  // the graph's per-node checks
  Py_ssize_t next_leaf;  // the next leaf's index
  bool arrays_tainted;  // checks._taints is not empty
  std::vector<py::object> signature;
  struct NewLeaf {
    PyObject* array;  // (held by `held`)
    py::object held, id, aval, index;
  };
  std::vector<NewLeaf> new_leaves;
  py::object depends;  // a set of checks, once one is met

  bool depend_on(PyObject* checks) {
    if (!depends) {
      depends = steal(PySet_New(nullptr));
      if (!depends) {
        return false;
      }
    }
    auto items = steal(PyObject_GetIter(checks));
    if (!items) {
      return false;
    }
    while (PyObject* check = PyIter_Next(items.ptr())) {
      const int added = PySet_Add(depends.ptr(), check);
      Py_DECREF(check);
      if (added != 0) {
        return false;
      }
    }
    return !PyErr_Occurred();
  }

  // The leaf index of a non-scalar array this node or the graph reads already, or None.
  py::object known_leaf(PyObject* array, PyObject* id) {
    for (auto it = new_leaves.rbegin(); it != new_leaves.rend(); ++it) {
      if (it->array == array) {
        return it->index;
      }
    }
    PyObject* index = PyDict_GetItemWithError(leaf_ids, id);
    return py::reinterpret_borrow<py::object>(index ? index : Py_None);
  }

  Outcome leaf_spec(PyObject* x, py::object& spec) {
    auto described = steal(PyObject_GetAttr(x, N.aval));
    if (!described) {
      return kFailed;
    }
    auto shape = steal(PyObject_GetAttr(described.ptr(), N.shape));
    auto dtype = steal(PyObject_GetAttr(described.ptr(), N.dtype));
    auto weak = steal(PyObject_GetAttr(described.ptr(), N.weak_type));
    if (!shape || !dtype || !weak || !PyTuple_Check(shape.ptr())) {
      return shape && dtype && weak ? kPython : kFailed;
    }
    auto aval = pack({shape.ptr(), dtype.ptr(), weak.ptr()});
    auto id = steal(PyLong_FromVoidPtr(x));
    if (!aval || !id) {
      return kFailed;
    }
    // (a scalar gets a leaf per use, as in Graph._specs)
    py::object index = PyTuple_GET_SIZE(shape.ptr()) ? known_leaf(x, id.ptr()) : py::none();
    if (PyErr_Occurred()) {
      return kFailed;
    }
    if (index.is_none()) {
      index = steal(PyLong_FromSsize_t(next_leaf++));
      new_leaves.push_back({x, py::reinterpret_borrow<py::object>(x), id, aval, index});
    }
    signature.push_back(aval);
    if (arrays_tainted) {
      PyObject* taint_of = PyDict_GetItemWithError(F.checks, N.taint_of);
      auto found = steal(taint_of ? PyObject_CallOneArg(taint_of, x) : nullptr);
      if (!found || (PyObject_IsTrue(found.ptr()) && !depend_on(found.ptr()))) {
        return kFailed;
      }
    }
    spec = pack({F.leaf, index.ptr()});
    return spec ? kBuilt : kFailed;
  }

  // Whether a list or tuple holds an argument of the graph (fused._is_value); kPython where it
  // holds an array Python records.
  Outcome holds_values(PyObject* seq, bool& found) {
    found = false;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject** items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyTypeObject* kind = Py_TYPE(items[i]);
      if (kind == F.deferred || kind == F.array || kind == F.strided) {
        found = true;
        return kBuilt;
      }
      if (!plain(kind) && kind != &PyList_Type && kind != &PyTuple_Type) {
        const int array = PyObject_IsInstance(items[i], F.jax_array);
        if (array != 0) {
          return array < 0 ? kFailed : kPython;
        }
      }
    }
    return kBuilt;
  }

  static bool plain(PyTypeObject* kind) {
    return kind == &PyLong_Type || kind == &PyFloat_Type || kind == &PyBool_Type || kind == &PyUnicode_Type ||
        kind == Py_TYPE(Py_None);
  }

  Outcome spec_of(PyObject* x, py::object& spec) {
    PyTypeObject* kind = Py_TYPE(x);
    if (kind == F.deferred) {
      PyObject* value = slot(x, F.value);
      if (value == nullptr) {
        return kPython;
      }
      if (value == Py_None) {  // pending: one of this graph's nodes (another's: Python runs it first)
        PyObject* node = slot(x, F.node_at);
        PyObject* index = slot(x, F.index);
        PyObject *shape = slot(x, F.shape), *dtype = slot(x, F.dtype), *weak = slot(x, F.weak_type);
        if (slot(x, F.graph) != graph || !node || !index || !shape || !dtype || !weak) {
          return kPython;
        }
        const Py_ssize_t at = PyLong_AsSsize_t(node);
        if (at < 0 || at >= PyList_GET_SIZE(node_taints)) {
          PyErr_Clear();
          return kPython;
        }
        PyObject* taints = PyList_GET_ITEM(node_taints, at);
        if (PyAnySet_Check(taints) && PySet_GET_SIZE(taints) && !depend_on(taints)) {
          return kFailed;
        }
        signature.push_back(pack({shape, dtype, weak}));
        spec = pack({F.node, node, index});
        return signature.back() && spec ? kBuilt : kFailed;
      }
      x = value;
      kind = Py_TYPE(x);
    }
    if (kind == F.strided) {  // a view its op's program reads: the storage's array and geometry
      PyObject *shape = slot(x, F.view_shape), *strides = slot(x, F.strides);
      PyObject *buf = slot(x, F.buf), *start = slot(x, F.start);
      if (!shape || !strides || !buf || !start) {
        return kPython;
      }
      signature.push_back(pack({shape, strides}));
      py::object buf_spec, start_spec = py::none();
      Outcome outcome = spec_of(buf, buf_spec);
      if (outcome == kBuilt && start != Py_None) {
        outcome = spec_of(start, start_spec);
      }
      if (outcome != kBuilt) {
        return outcome;
      }
      spec = pack({F.view, buf_spec.ptr(), start_spec.ptr(), shape, strides});
      return spec ? kBuilt : kFailed;
    }
    if (kind == F.array) {
      return leaf_spec(x, spec);
    }
    if (kind == &PyList_Type || kind == &PyTuple_Type) {
      bool found = false;
      const Outcome outcome = holds_values(x, found);
      if (outcome != kBuilt) {
        return outcome;
      }
      if (found) {
        std::vector<py::object> specs(PySequence_Fast_GET_SIZE(x));
        for (size_t i = 0; i < specs.size(); ++i) {
          const Outcome item = spec_of(PySequence_Fast_ITEMS(x)[i], specs[i]);
          if (item != kBuilt) {
            return item;
          }
        }
        auto items = tuple_of(specs);
        spec = items ? pack({F.seq, reinterpret_cast<PyObject*>(kind), items.ptr()}) : py::object();
        return spec ? kBuilt : kFailed;
      }
    } else if (!plain(kind)) {
      const int array = PyObject_IsInstance(x, F.jax_array);
      if (array != 0) {
        return array < 0 ? kFailed : kPython;
      }
    }
    auto key = typed(x);
    if (!key) {
      return kFailed;
    }
    signature.push_back(key);
    spec = pack({F.static_, x, key.ptr()});
    return spec ? kBuilt : kFailed;
  }
};

// A new Deferred output, its slots set as Deferred.__init__ sets them.
PyObject* new_deferred(PyObject* aval, PyObject* graph, PyObject* node, Py_ssize_t index) {
  PyObject* out = F.deferred->tp_alloc(F.deferred, 0);
  PyObject* position = PyLong_FromSsize_t(index);
  if (out == nullptr || position == nullptr) {
    Py_XDECREF(out);
    Py_XDECREF(position);
    return nullptr;
  }
  slot(out, F.shape) = Py_NewRef(PyTuple_GET_ITEM(aval, 0));
  slot(out, F.dtype) = Py_NewRef(PyTuple_GET_ITEM(aval, 1));
  slot(out, F.size) = Py_NewRef(PyTuple_GET_ITEM(aval, 2));
  slot(out, F.weak_type) = Py_NewRef(PyTuple_GET_ITEM(aval, 3));
  slot(out, F.graph) = Py_NewRef(graph);
  slot(out, F.node_at) = Py_NewRef(node);
  slot(out, F.index) = position;
  slot(out, F.value) = Py_NewRef(Py_None);
  slot(out, F.error) = Py_NewRef(Py_None);
  return out;
}

// Releases a graph's lock when it goes out of scope.
struct Locked {
  PyObject* lock;
  ~Locked() {
    PyObject *type, *value, *traceback;  // (an error being returned survives the release)
    PyErr_Fetch(&type, &value, &traceback);
    Py_XDECREF(PyObject_CallMethodNoArgs(lock, N.release));
    PyErr_Restore(type, value, traceback);
  }
};

py::object attr(PyObject* object, PyObject* name) {
  return steal(PyObject_GetAttr(object, name));
}

// The node at `node` in the template, where `key` is its key and it makes at least one array;
// else nullptr (no error).
PyObject* template_entry(PyObject* templ, Py_ssize_t node, PyObject* key) {
  if (!PyList_Check(templ) || node >= PyList_GET_SIZE(templ)) {
    return nullptr;
  }
  PyObject* entry = PyList_GET_ITEM(templ, node);
  if (Py_TYPE(entry) != F.entry) {
    return nullptr;
  }
  const int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(entry, kEntryKey), key, Py_EQ);
  if (same <= 0) {
    PyErr_Clear();  // (Python compares again, and raises if it must)
    return nullptr;
  }
  PyObject* built = PyTuple_GET_ITEM(entry, kEntryBuilt);
  PyObject* avals = PyTuple_GET_ITEM(entry, kEntryAvals);
  if (!PyList_Check(avals) || PyList_GET_SIZE(avals) == 0 || (built == Py_None && PyList_GET_SIZE(avals) != 1)) {
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(avals); ++i) {
    PyObject* aval = PyList_GET_ITEM(avals, i);
    if (!PyTuple_Check(aval) || PyTuple_GET_SIZE(aval) != 4) {
      return nullptr;
    }
  }
  return entry;
}

}  // namespace

PyObject* record_repeated(PyObject* graph, PyObject* fn, PyObject* args, PyObject* matmul_precision) {
  if (!F.configured || !(PyTuple_CheckExact(args) || PyList_CheckExact(args))) {
    return not_implemented();
  }
  if (matmul_precision == F.now) {  // (precision.current(): None for "highest", else Python's)
    if (at::globalContext().float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST) {
      return not_implemented();
    }
    matmul_precision = Py_None;
  }
  if (!flag_is(Flag::record_in_core, Py_True) || !flag_is(Flag::others_used, Py_False) ||
      !flag_is(Flag::log_recompiles, Py_False)) {
    return not_implemented();
  }
  auto lock = attr(graph, N.lock);
  if (!lock || !steal(PyObject_CallMethodNoArgs(lock.ptr(), N.acquire))) {
    return nullptr;
  }
  Locked locked{lock.ptr()};
  auto state = attr(graph, N.state), seen = attr(graph, N.seen), churning = attr(graph, N.churning);
  auto unclaimed = attr(graph, N.unclaimed), nodes = attr(graph, N.nodes), templ = attr(graph, N.templ);
  auto leaves = attr(graph, N.leaves), leaf_ids = attr(graph, N.leaf_ids), taints = attr(graph, N.taints);
  if (!state || !seen || !churning || !unclaimed || !nodes || !templ || !leaves || !leaf_ids || !taints) {
    return nullptr;
  }
  PyObject* max_nodes = flag(Flag::max_nodes);
  const Py_ssize_t position = PyLong_AsSsize_t(seen.ptr());
  const Py_ssize_t node = PyList_Check(nodes.ptr()) ? PyList_GET_SIZE(nodes.ptr()) : -1;
  if (state.ptr() != F.open || position <= 0 || node < 0 || max_nodes == nullptr ||
      node >= PyLong_AsSsize_t(max_nodes) || !PyList_Check(unclaimed.ptr()) || !PyList_Check(leaves.ptr()) ||
      !PyDict_Check(leaf_ids.ptr()) || !PyList_Check(taints.ptr())) {
    PyErr_Clear();  // (the graph's first op, a full or run graph: Python's)
    return not_implemented();
  }
  if (churning.ptr() != Py_None) {  // (an op that churns here runs alone: Python's)
    PyObject* churns = PyDict_Check(churning.ptr()) ? PyDict_GetItemWithError(churning.ptr(), seen.ptr()) : fn;
    if (churns == fn || PyErr_Occurred()) {
      PyErr_Clear();
      return not_implemented();
    }
  }
  PyObject* taint_table = PyDict_GetItemWithError(F.checks, N.checks_taints);
  NodeWalk walk{graph, leaf_ids.ptr(), taints.ptr(), PyList_GET_SIZE(leaves.ptr()),
                taint_table != nullptr && PyObject_IsTrue(taint_table) == 1};
  // the op's own checks (a bounds check's), then those its inputs depend on, as Graph.record
  // lists them
  const Py_ssize_t claimed = PyList_GET_SIZE(unclaimed.ptr());
  if (claimed && !walk.depend_on(unclaimed.ptr())) {
    return nullptr;
  }
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(args);
  std::vector<py::object> specs(count);
  for (Py_ssize_t i = 0; i < count; ++i) {
    const Outcome outcome = walk.spec_of(PySequence_Fast_ITEMS(args)[i], specs[i]);
    if (outcome != kBuilt) {
      return outcome == kFailed ? nullptr : not_implemented();
    }
  }
  auto signature = tuple_of(walk.signature);
  auto arg_specs = tuple_of(specs);
  auto signature_key = signature ? pack({fn, signature.ptr()}) : py::object();
  auto no_kwargs = steal(PyTuple_New(0));
  if (!arg_specs || !signature_key || !no_kwargs) {
    return nullptr;
  }
  auto node_key = pack({signature_key.ptr(), arg_specs.ptr(), no_kwargs.ptr(), matmul_precision});
  if (!node_key) {
    return nullptr;
  }
  PyObject* entry = template_entry(templ.ptr(), node, node_key.ptr());
  if (entry == nullptr) {
    return not_implemented();
  }
  // the node repeats its template's: append it as Graph.record does
  PyObject* node_spec = PyTuple_GET_ITEM(entry, kEntryNode);
  PyObject* built = PyTuple_GET_ITEM(entry, kEntryBuilt);
  PyObject* avals = PyTuple_GET_ITEM(entry, kEntryAvals);
  auto spec_key = attr(node_spec, N.key);
  auto leaf_avals = attr(graph, N.leaf_avals), interned = attr(graph, N.interned);
  auto entries = attr(graph, N.entries), positions = attr(graph, N.positions);
  auto signatures = attr(graph, N.signatures), outputs = attr(graph, N.outputs);
  auto next_seen = steal(PyLong_FromSsize_t(position + 1));
  auto node_index = steal(PyLong_FromSsize_t(node));
  py::object depends = walk.depends ? steal(PyFrozenSet_New(walk.depends.ptr())) : py::reinterpret_borrow<py::object>(F.no_checks);
  if (!spec_key || !leaf_avals || !interned || !entries || !positions || !signatures || !outputs || !next_seen ||
      !node_index || !depends) {
    return nullptr;
  }
  // the outputs first (what can fail: memory, the structure's unflattening), then the graph's
  // appends. One array, a flat tuple of them, or any other structure (a foreach op's list, a
  // tuple with Nones) as Graph.record unflattens it
  const Py_ssize_t made = PyList_GET_SIZE(avals);
  const bool flat = built == reinterpret_cast<PyObject*>(&PyTuple_Type);
  auto out = steal(built == Py_None ? nullptr : flat ? PyTuple_New(made) : PyList_New(made));
  std::vector<py::object> deferred;
  for (Py_ssize_t i = 0; i < made; ++i) {
    deferred.push_back(steal(new_deferred(PyList_GET_ITEM(avals, i), graph, node_index.ptr(), i)));
    if (!deferred.back()) {
      return nullptr;
    }
    if (out && flat) {
      PyTuple_SET_ITEM(out.ptr(), i, Py_NewRef(deferred.back().ptr()));
    } else if (out) {  // (the leaves, in order, for the structure's unflatten)
      PyList_SET_ITEM(out.ptr(), i, Py_NewRef(deferred.back().ptr()));
    }
  }
  if (out && !flat) {
    out = steal(PyObject_CallMethodOneArg(built, N.unflatten, out.ptr()));
    if (!out) {
      PyErr_Clear();  // (Python unflattens it, and raises if it must)
      return not_implemented();
    }
  }
  if (PyObject_SetAttr(graph, N.seen, next_seen.ptr()) != 0) {
    return nullptr;
  }
  for (const auto& leaf : walk.new_leaves) {
    if (PyDict_SetItem(leaf_ids.ptr(), leaf.id.ptr(), leaf.index.ptr()) != 0 ||
        PyList_Append(leaves.ptr(), leaf.array) != 0 || PyList_Append(leaf_avals.ptr(), leaf.aval.ptr()) != 0) {
      return nullptr;
    }
  }
  if (PyList_Append(nodes.ptr(), spec_key.ptr()) != 0 || PyList_Append(interned.ptr(), node_spec) != 0 ||
      PyList_Append(entries.ptr(), entry) != 0 || PyList_Append(positions.ptr(), seen.ptr()) != 0 ||
      PyList_Append(signatures.ptr(), PyTuple_GET_ITEM(entry, kEntrySignature)) != 0 ||
      PyList_Append(taints.ptr(), depends.ptr()) != 0 ||
      (claimed && PyList_SetSlice(unclaimed.ptr(), 0, claimed, nullptr) != 0)) {
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < made; ++i) {
    if (PyList_Append(outputs.ptr(), deferred[i].ptr()) != 0) {
      return nullptr;
    }
  }
  return out ? out.release().ptr() : deferred[0].release().ptr();
}

namespace {

// Refuse a fused.NodeEntry whose fields are not kEntryFieldNames, in that order (or that is no
// tuple: its fields are read as a tuple's items).
void check_entry_fields(py::handle entry) {
  bool same = PyType_Check(entry.ptr()) &&
      PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(entry.ptr()), &PyTuple_Type) && py::hasattr(entry, "_fields");
  py::tuple fields = same ? py::tuple(entry.attr("_fields")) : py::tuple();
  same = same && fields.size() == static_cast<size_t>(kEntryFields);
  for (size_t i = 0; same && i < fields.size(); ++i) {
    same = fields[i].cast<std::string>() == kEntryFieldNames[i];
  }
  if (!same) {
    throw py::type_error(
        "configure_fused: fused.NodeEntry's fields are not the ones FusedRecord.cpp reads (kEntryFieldNames): "
        "rebuild it (pip install -e .)");
  }
}

void configure_fused(
    py::dict fused,
    py::dict checks,
    py::handle deferred,
    py::handle strided,
    py::handle array,
    py::handle jax_array,
    py::handle entry) {
  if (!PyType_Check(deferred.ptr()) || !PyType_Check(strided.ptr()) || !PyType_Check(array.ptr())) {
    throw py::type_error("configure_fused takes Deferred, StridedView and jax's array type");
  }
  check_entry_fields(entry);
  // (new_deferred sets every slot Deferred.__init__ sets: a Deferred with other slots is refused)
  py::object slots = py::reinterpret_borrow<py::object>(deferred).attr("__slots__");
  py::object expected = py::make_tuple(
      "shape", "dtype", "size", "weak_type", "graph", "node", "index", "value", "error", "__weakref__");
  if (!slots.equal(expected)) {
    throw py::type_error("configure_fused: Deferred.__slots__ changed: update new_deferred (FusedRecord.cpp)");
  }
  F.fused = fused.inc_ref().ptr();
  F.checks = checks.inc_ref().ptr();
  F.deferred = reinterpret_cast<PyTypeObject*>(deferred.inc_ref().ptr());
  F.strided = reinterpret_cast<PyTypeObject*>(strided.inc_ref().ptr());
  F.array = reinterpret_cast<PyTypeObject*>(array.inc_ref().ptr());
  F.jax_array = jax_array.inc_ref().ptr();
  F.entry = reinterpret_cast<PyTypeObject*>(entry.inc_ref().ptr());
  auto global = [&](Name name) { return py::object(fused[py::handle(python_name(name))]).release().ptr(); };
  F.open = global(Name::fused_open);
  F.now = global(Name::fused_now);
  F.no_checks = global(Name::fused_no_checks);
  F.leaf = global(Name::fused_leaf);
  F.node = global(Name::fused_node);
  F.static_ = global(Name::fused_static);
  F.seq = global(Name::fused_seq);
  F.view = global(Name::fused_view);
  F.shape = slot_offset(F.deferred, Name::deferred_shape, "configure_fused");
  F.dtype = slot_offset(F.deferred, Name::deferred_dtype, "configure_fused");
  F.size = slot_offset(F.deferred, Name::deferred_size, "configure_fused");
  F.weak_type = slot_offset(F.deferred, Name::deferred_weak_type, "configure_fused");
  F.graph = slot_offset(F.deferred, Name::deferred_graph, "configure_fused");
  F.node_at = slot_offset(F.deferred, Name::deferred_node, "configure_fused");
  F.index = slot_offset(F.deferred, Name::deferred_index, "configure_fused");
  F.value = slot_offset(F.deferred, Name::deferred_value, "configure_fused");
  F.error = slot_offset(F.deferred, Name::deferred_error, "configure_fused");
  F.buf = slot_offset(F.strided, Name::strided_buf, "configure_fused");
  F.start = slot_offset(F.strided, Name::strided_start, "configure_fused");
  F.view_shape = slot_offset(F.strided, Name::strided_shape, "configure_fused");
  F.strides = slot_offset(F.strided, Name::strided_strides, "configure_fused");
  N = {python_name(Name::graph_state),
       python_name(Name::graph_seen),
       python_name(Name::graph_churning),
       python_name(Name::graph_unclaimed),
       python_name(Name::graph_nodes),
       python_name(Name::graph_leaves),
       python_name(Name::graph_leaf_avals),
       python_name(Name::graph_leaf_ids),
       python_name(Name::graph_taints),
       python_name(Name::graph_template),
       python_name(Name::graph_interned),
       python_name(Name::graph_entries),
       python_name(Name::graph_positions),
       python_name(Name::graph_signatures),
       python_name(Name::graph_outputs),
       python_name(Name::graph_lock),
       python_name(Name::lock_acquire),
       python_name(Name::lock_release),
       python_name(Name::node_key),
       python_name(Name::array_aval),
       python_name(Name::aval_shape),
       python_name(Name::aval_dtype),
       python_name(Name::aval_weak_type),
       python_name(Name::checks_taints),
       python_name(Name::checks_taint_of),
       python_name(Name::treedef_unflatten)};
  F.configured = true;
}

PyObject* call_record_repeated(PyObject*, PyObject* const* args, Py_ssize_t count) {
  if (count != 4) {
    PyErr_SetString(PyExc_TypeError, "record_repeated(graph, fn, args, matmul_precision) takes 4 arguments");
    return nullptr;
  }
  return record_repeated(args[0], args[1], args[2], args[3]);
}

PyMethodDef g_functions[] = {
    {"record_repeated",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call_record_repeated)),
     METH_FASTCALL,
     "record_repeated(graph, fn, args, matmul_precision): fn(*args)'s deferred outputs where the "
     "node repeats the graph's template, else NotImplemented (Graph.record decides)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int add_fused_record(PyObject* module) {
  auto m = py::reinterpret_borrow<py::module_>(module);
  m.def("configure_fused", &configure_fused);
  return PyModule_AddFunctions(module, g_functions);
}

}  // namespace torch_tpu
