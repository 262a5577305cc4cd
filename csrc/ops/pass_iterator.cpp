// fastpipe._C.PassIterator: the base of a Loader's pass iterator (fastpipe/data/passes.py), whose
// __next__ is this type's tp_iternext. A pass under way (`_hot`) calls the reader's next(`_timeout`) and
// packs its batch here: no Python frame per batch, which a training thread that slept through its step
// pays for in cache misses (~0.5 us; benchmarks/results/loader_next_vm_20261206.md). Everything else
// (the first batch of a pass, a finished or superseded one) goes through the subclass's `_next_checked()`.
#include <Python.h>
#include <structmember.h>

#include "ops/bindings.h"

namespace fastpipe {
namespace {

struct PassIterator {
  PyObject_HEAD
  PyObject* next;     // _next: next(timeout) -> the batch, or None at the end of the pass
  PyObject* pack;     // _pack: None, or pack(batch) -> what the loop gets
  PyObject* timeout;  // _timeout: next()'s argument while hot (set by _next_checked)
  long long position;
  char hot;
  char done;
};

PyObject* next_checked_name = nullptr;

int traverse(PyObject* o, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<PassIterator*>(o);
  Py_VISIT(self->next);
  Py_VISIT(self->pack);
  Py_VISIT(self->timeout);
  return 0;
}

int clear(PyObject* o) {
  auto* self = reinterpret_cast<PassIterator*>(o);
  Py_CLEAR(self->next);
  Py_CLEAR(self->pack);
  Py_CLEAR(self->timeout);
  return 0;
}

void dealloc(PyObject* o) {
  PyObject_GC_UnTrack(o);
  clear(o);
  Py_TYPE(o)->tp_free(o);
}

PyObject* iternext(PyObject* o) {
  auto* self = reinterpret_cast<PassIterator*>(o);
  PyObject* batch;
  if (self->hot && self->next && self->timeout) {
    PyObject* args[] = {self->timeout};
    batch = PyObject_Vectorcall(self->next, args, 1, nullptr);
  } else {
    batch = PyObject_CallMethodNoArgs(o, next_checked_name);
  }
  if (!batch) return nullptr;  // an error, or the StopIteration of _next_checked
  if (batch == Py_None) {
    Py_DECREF(batch);
    self->done = 1;
    self->hot = 0;
    return nullptr;  // the end of the pass: StopIteration
  }
  ++self->position;
  if (!self->pack || self->pack == Py_None) return batch;
  PyObject* packed = PyObject_CallOneArg(self->pack, batch);
  Py_DECREF(batch);
  return packed;
}

PyMemberDef members[] = {
    {"_next", T_OBJECT, offsetof(PassIterator, next), 0, "the reader's next(timeout)"},
    {"_pack", T_OBJECT, offsetof(PassIterator, pack), 0, "None, or what packs a batch for the loop"},
    {"_timeout", T_OBJECT, offsetof(PassIterator, timeout), 0, "next()'s argument while the pass is hot"},
    {"position", T_LONGLONG, offsetof(PassIterator, position), 0, "batches of the epoch read, this pass's included"},
    {"_hot", T_BOOL, offsetof(PassIterator, hot), 0,
     "a batch of this pass was read, and nothing since asks for _next_checked's checks"},
    {"_done", T_BOOL, offsetof(PassIterator, done), 0, "the pass ended"},
    {nullptr, 0, 0, 0, nullptr},
};

PyTypeObject pass_iterator_type = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "fastpipe._C.PassIterator";
  t.tp_basicsize = sizeof(PassIterator);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
  t.tp_doc = "Base of a Loader's pass iterator: __next__ in C (fastpipe/data/passes.py's EpochIterator).";
  t.tp_traverse = traverse;
  t.tp_clear = clear;
  t.tp_dealloc = dealloc;
  t.tp_iter = PyObject_SelfIter;
  t.tp_iternext = iternext;
  t.tp_members = members;
  t.tp_new = PyType_GenericNew;
  return t;
}();

}  // namespace

void bind_pass_iterator(pybind11::module& m) {
  next_checked_name = PyUnicode_InternFromString("_next_checked");
  if (!next_checked_name || PyType_Ready(&pass_iterator_type) < 0) throw pybind11::error_already_set();
  Py_INCREF(&pass_iterator_type);
  if (PyModule_AddObject(m.ptr(), "PassIterator", reinterpret_cast<PyObject*>(&pass_iterator_type)) < 0) {
    Py_DECREF(&pass_iterator_type);
    throw pybind11::error_already_set();
  }
}

}  // namespace fastpipe
