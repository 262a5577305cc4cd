#include "ops/bound_call.h"

namespace py = pybind11;

namespace fastpipe {
namespace {

constexpr const char* kCapsule = "fastpipe.bound_call";

struct Bound {
  PyObject* owner;  // a strong reference
  void* target;
  FloatCall call;
  PyMethodDef def;  // the function's; lives as long as it does (the capsule is its self)
};

PyObject* call_bound(PyObject* capsule, PyObject* arg) {
  auto* b = static_cast<Bound*>(PyCapsule_GetPointer(capsule, kCapsule));
  if (!b) return nullptr;
  const double x = PyFloat_AsDouble(arg);
  if (x == -1.0 && PyErr_Occurred()) return nullptr;
  try {
    return b->call(b->target, x).release().ptr();
  } catch (...) {
    py::detail::try_translate_exceptions();  // the translation pybind11's dispatcher applies
    return nullptr;
  }
}

void free_bound(PyObject* capsule) {
  auto* b = static_cast<Bound*>(PyCapsule_GetPointer(capsule, kCapsule));
  Py_XDECREF(b->owner);
  delete b;
}

}  // namespace

py::object bind_float_call(const py::object& owner, void* target, FloatCall call, const char* name, const char* doc) {
  auto* b = new Bound{owner.inc_ref().ptr(), target, call, {name, call_bound, METH_O, doc}};
  PyObject* capsule = PyCapsule_New(b, kCapsule, free_bound);
  if (!capsule) {
    Py_DECREF(b->owner);
    delete b;
    throw py::error_already_set();
  }
  PyObject* fn = PyCFunction_NewEx(&b->def, capsule, nullptr);
  Py_DECREF(capsule);
  if (!fn) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(fn);
}

}  // namespace fastpipe
