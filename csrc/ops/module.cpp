// The Python module fastpipe._C: build facts, the shared tables and the loader's batch reader. The fused
// ops register themselves with the dispatcher (TORCH_LIBRARY in conv_act.cpp) when this library loads.
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include "kernels/activation.h"
#include "ops/activations.h"
#include "ops/bindings.h"
#include "ops/conv_act.h"
#include "ops/conv_tuner.h"

namespace py = pybind11;

namespace {

// The conv engine choice's warnings as Python UserWarnings (filterable, and errors under -W error).
void python_warning(const std::string& message) {
  py::gil_scoped_acquire gil;
  if (PyErr_WarnEx(PyExc_UserWarning, message.c_str(), 1) < 0) throw py::error_already_set();
}

// One configuration of fastpipe::conv2d_act (a FusedConv2d's, or a conv2d_act call site's), checked
// once. Calling it passes only the tensors, and reaches the dispatcher unboxed: torch.ops' boxed calls
// cost several microseconds each, more than a small convolution. A residual that broadcasts to the
// output is expanded here, as `conv + residual` would.
class ConvActCall {
 public:
  ConvActCall(std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
              int64_t groups, std::string activation, std::vector<double> act_args)
      : stride_(std::move(stride)), padding_(std::move(padding)), dilation_(std::move(dilation)), groups_(groups),
        activation_(std::move(activation)), act_args_(std::move(act_args)) {
    TORCH_CHECK(stride_.size() == 2 && padding_.size() == 2 && dilation_.size() == 2,
                "stride, padding and dilation must be pairs");
    fastpipe::conv::parse_activation(activation_, act_args_);  // errors now, not at the first call
  }

  at::Tensor operator()(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                        std::optional<at::Tensor> residual) const {
    using namespace fastpipe::conv;
    static const auto op = op_handle<ConvActFn<at::Tensor>>(kConv2dAct);
    if (residual && input.dim() == 4 && weight.dim() == 4) {
      std::vector<int64_t> out{input.size(0), weight.size(0)};
      for (int d = 0; d < 2; ++d)
        out.push_back(conv_output_size(input.size(2 + d), weight.size(2 + d), stride_[d], padding_[d], dilation_[d]));
      if (residual->sizes() != at::IntArrayRef(out)) {
        bool fits = residual->dim() <= 4;
        for (int64_t k = 1; fits && k <= residual->dim(); ++k) {
          const int64_t r = residual->size(-k);
          fits = r == 1 || r == out[4 - k];
        }
        TORCH_CHECK_VALUE(fits, "residual of shape ", residual->sizes(), " does not broadcast to the output shape ",
                          at::IntArrayRef(out));
        residual = residual->expand(out);
      }
    }
    return op.call(input, weight, bias, stride_, padding_, dilation_, groups_, activation_, act_args_, residual);
  }

 private:
  std::vector<int64_t> stride_, padding_, dilation_;
  int64_t groups_;
  std::string activation_;
  std::vector<double> act_args_;
};

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
  // The fused convolution's activations (kernels/activation.h): (name, number of act_args, whether
  // backward keeps the output rather than the pre-activation, for act_args that keep the sign).
  py::list acts;
  for (const auto& a : fastpipe::kActivations)
    acts.append(py::make_tuple(a.name, a.nargs, fastpipe::grad_from_output(fastpipe::ActSpec{a.act, 0.0, 1.0})));
  m.attr("CONV_ACTIVATIONS") = py::tuple(acts);
  py::class_<ConvActCall>(m, "ConvActCall")
      .def(py::init<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, int64_t, std::string,
                    std::vector<double>>(),
           py::arg("stride"), py::arg("padding"), py::arg("dilation"), py::arg("groups"), py::arg("activation"),
           py::arg("act_args"))
      .def("__call__", &ConvActCall::operator(), py::arg("input"), py::arg("weight"), py::arg("bias") = py::none(),
           py::arg("residual") = py::none());
  fastpipe::bind_loader(m);
  fastpipe::bind_loader_specs(m);
  fastpipe::bind_image_scans(m);
  fastpipe::bind_loader_test_hooks(m);
  fastpipe::bind_remote(m);
  fastpipe::bind_pass_iterator(m);
  fastpipe::conv::set_warning_sink(python_warning);
}
