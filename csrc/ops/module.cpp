// The Python module fastpipe._C: build facts, the shared tables and the loader's batch reader. The fused
// ops register themselves with the dispatcher (TORCH_LIBRARY in conv_act.cpp) when this library loads.
#include <torch/extension.h>

#include "cuda/activation.h"
#include "ops/bindings.h"
#include "ops/conv_tuner.h"

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
  // The fused convolution's activations (cuda/activation.h): (name, number of act_args, whether
  // backward keeps the output rather than the pre-activation, for act_args that keep the sign).
  py::list acts;
  for (const auto& a : fastpipe::kActivations)
    acts.append(py::make_tuple(a.name, a.nargs, fastpipe::grad_from_output(fastpipe::ActSpec{a.act, 0.0, 1.0})));
  m.attr("CONV_ACTIVATIONS") = py::tuple(acts);
  fastpipe::bind_loader(m);
  fastpipe::conv::set_warning_sink(python_warning);
}
