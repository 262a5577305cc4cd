// The fused convolution ops' shared parts: checked arguments, the engine (candidate) interface and the
// device-independent op bodies. conv.cpp holds the schemas, the CPU side and the engine choice;
// cuda/conv_cuda.cpp adds the CUDA candidates and kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/activation.h"

namespace fastpipe::conv {

// One call of act(conv2d(input, weight) + bias + residual), after the argument checks: every tensor
// on one device with one floating dtype, residual of the output's shape.
struct ConvArgs {
  at::Tensor input;
  at::Tensor weight;
  std::optional<at::Tensor> bias;
  std::optional<at::Tensor> residual;
  std::array<int64_t, 2> stride{}, padding{}, dilation{};
  int64_t groups = 1;
  ActSpec act;
  at::MemoryFormat format = at::MemoryFormat::Contiguous;  // of the output, like eager's conv
  std::array<int64_t, 4> out_sizes{};
};

// One way to compute a ConvArgs. `run` returns the result, preferably already in args.format.
// `why_not` says whether the candidate can run a call on this machine: nullptr when it can, else the
// reason (a static string, shown in the warning when a forced engine falls back to eager).
// The engine times every candidate that can run a call's key and keeps the fastest.
struct Candidate {
  const char* name;
  const char* (*why_not)(const ConvArgs&);
  at::Tensor (*run)(const ConvArgs&);
};

struct DeviceHooks {
  void (*synchronize)(c10::DeviceIndex);  // wait for queued work (timing); null where calls are synchronous
  bool (*capturing)();                   // a graph capture is in progress (no timing then); may be null
};

// Adds a device type's candidates after "eager" (the plain ATen path every device has). Call it from a
// static initialiser; returns true so that it can initialise a static.
bool register_engines(c10::DeviceType type, DeviceHooks hooks, std::vector<Candidate> candidates);

// Where the engine choice's warnings go (each is given once): the Python module installs a sink that
// raises them as Python warnings (torch.ops calls do not route TORCH_WARN to Python); without one they
// go to TORCH_WARN.
void set_warning_sink(void (*sink)(const std::string& message));

// Op bodies for any device; the CUDA registration wraps them in a device guard.
at::Tensor conv2d_act(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                      at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                      c10::string_view activation, at::ArrayRef<double> act_args,
                      const std::optional<at::Tensor>& residual);
std::tuple<at::Tensor, at::Tensor> conv2d_act_train(const at::Tensor& input, const at::Tensor& weight,
                                                    const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                                    at::IntArrayRef padding, at::IntArrayRef dilation,
                                                    int64_t groups, c10::string_view activation,
                                                    at::ArrayRef<double> act_args,
                                                    const std::optional<at::Tensor>& residual);

// Checks the backward op's arguments and returns the parsed activation.
ActSpec check_backward_args(const at::Tensor& grad_out, const at::Tensor& saved, c10::string_view activation,
                            at::ArrayRef<double> act_args);
// The backward prologue with ATen ops (any device): (grad w.r.t. the pre-activation, grad_bias or an
// empty tensor when bias_grad is false).
std::tuple<at::Tensor, at::Tensor> act_backward_aten(const at::Tensor& grad_out, const at::Tensor& saved,
                                                     const ActSpec& act, bool bias_grad);

}  // namespace fastpipe::conv
