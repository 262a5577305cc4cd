// The engine's errors as Python exceptions (by ErrorKind), and the tables and parsers Python reads from
// it: the dtype table and the .npy header reader.
#include <pybind11/stl.h>

#include "core/dtypes.h"
#include "core/error.h"
#include "core/npy.h"
#include "ops/reader_config.h"

namespace py = pybind11;

namespace fastpipe {
namespace {

void translate(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kValue:
      PyErr_SetString(PyExc_ValueError, e.what());
      return;
    case ErrorKind::kTimeout:
      PyErr_SetString(PyExc_TimeoutError, e.what());
      return;
    case ErrorKind::kState:
      PyErr_SetString(PyExc_RuntimeError, e.what());
      return;
    case ErrorKind::kIO: {
      // OSError(errno, message) picks the subclass (FileNotFoundError, PermissionError, ...).
      PyObject* args = e.error_number() ? Py_BuildValue("(is)", e.error_number(), e.what()) : Py_BuildValue("(s)", e.what());
      PyObject* exc = args ? PyObject_Call(PyExc_OSError, args, nullptr) : nullptr;
      Py_XDECREF(args);
      if (exc) {
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
        Py_DECREF(exc);
      }
      return;
    }
  }
}

py::dict header_dict(const NpyHeader& h) {
  py::dict d;
  d["version"] = py::make_tuple(h.major, h.minor);
  d["descr"] = h.descr;
  d["dtype"] = h.dtype;
  d["itemsize"] = h.itemsize;
  d["shape"] = py::tuple(py::cast(h.shape));
  d["data_offset"] = h.data_offset;
  d["data_bytes"] = h.data_bytes;
  d["file_size"] = h.file_size;
  return d;
}

}  // namespace

void bind_engine_tables(py::module& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      translate(e);
    }
  });

  m.def(
      "read_npy_header", [](const std::string& path) { return header_dict(read_npy_header(path)); }, py::arg("path"),
      "Reads and validates a .npy header; ValueError names the file and the defect.");

  // The shared table, for the Python side (fastpipe/data: dtypes written and read).
  py::list dtypes;
  for (const auto& d : kDtypes) dtypes.append(d.name);
  m.attr("DTYPES") = py::tuple(dtypes);
}

}  // namespace fastpipe
