// The Python module fastpipe._C: build facts and the loader engine. The fused ops register themselves
// with the dispatcher (TORCH_LIBRARY in conv.cpp) when this library is loaded.
#include <torch/extension.h>

#include "ops/bindings.h"
#include "ops/conv.h"

namespace py = pybind11;

namespace {

// The conv engine choice's warnings as Python UserWarnings (filterable, and errors under -W error).
void python_warning(const std::string& message) {
  py::gil_scoped_acquire gil;
  if (PyErr_WarnEx(PyExc_UserWarning, message.c_str(), 1) < 0) throw py::error_already_set();
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "fastpipe C++/CUDA extension";
  py::dict info;
  info["version"] = FASTPIPE_VERSION;
  info["torch_version"] = FASTPIPE_TORCH_VERSION;
#ifdef FASTPIPE_WITH_CUDA
  info["cuda"] = true;
#else
  info["cuda"] = false;
#endif
  info["cuda_archs"] = FASTPIPE_CUDA_ARCHS;
  m.attr("BUILD_INFO") = info;
  fastpipe::bind_loader(m);
  fastpipe::conv::set_warning_sink(python_warning);
}
