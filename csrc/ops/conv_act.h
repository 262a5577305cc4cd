// The fused convolution ops act(conv2d(input, weight) + bias + residual): their one argument list, the
// checked arguments every engine receives, and the op bodies shared by every device.
//
// Where things live (csrc/ops): conv_act.cpp the schemas of every fastpipe op, the argument checks and
// the CPU registrations; activations.{h,cpp} the activations in ATen; conv_tuner.{h,cpp} the engines
// and the per-key choice among them (conv_tuner_state.h its state, conv_engine_cache.cpp the cache's
// report and persistence); cpu/ the oneDNN engine; cuda/ the CUDA engines and kernels'
// glue; autograd/ and autocast/ those dispatch keys.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>

#include "kernels/activation.h"

// The conv ops' arguments in schema order (conv_act.cpp), written once: the op bodies, autograd and
// autocast all take them.
#define FASTPIPE_CONV_ACT_PARAMS                                                                          \
  const at::Tensor &input, const at::Tensor &weight, const std::optional<at::Tensor> &bias,                \
      at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,           \
      c10::string_view activation, at::ArrayRef<double> act_args, const std::optional<at::Tensor> &residual
#define FASTPIPE_CONV_ACT_ARGS input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual

namespace fastpipe::conv {

// The functions behind the schemas, for calls through the dispatcher (autograd, autocast).
template <typename Ret>
using ConvActFn = Ret(FASTPIPE_CONV_ACT_PARAMS);
using ConvActTrainRet = std::tuple<at::Tensor, at::Tensor>;
inline constexpr char kConv2dAct[] = "fastpipe::conv2d_act";
inline constexpr char kConv2dActTrain[] = "fastpipe::_conv2d_act_train";
inline constexpr char kConv2dActBackward[] = "fastpipe::_conv2d_act_backward";

template <typename Fn>
c10::TypedOperatorHandle<Fn> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

// One spatial dimension of a convolution's output (fastpipe/ops.py has the Python twin, for the fake
// kernels; their agreement is what opcheck checks).
inline int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation) {
  return (in + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1;
}

// One call after the argument checks: every tensor on one device with one floating dtype, residual of
// the output's shape, the activation parsed once.
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
  // A backward call (backward_args) has grad, the gradient of conv(input) + bias (+ residual), of
  // out_sizes, and `need`: which of the input, weight and bias gradients to compute; no bias or
  // residual tensor, the identity activation.
  bool backward = false;
  at::Tensor grad;
  std::array<bool, 3> need{};
};

// The backward call of a convolution whose output gradient (after the activation's backward) is `grad`.
ConvArgs backward_args(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                       std::array<bool, 3> need);

// Op bodies for any device; the CUDA registration wraps them in a device guard.
at::Tensor conv2d_act(FASTPIPE_CONV_ACT_PARAMS);
ConvActTrainRet conv2d_act_train(FASTPIPE_CONV_ACT_PARAMS);

// Checks the backward op's arguments and returns the parsed activation.
ActSpec check_backward_args(const at::Tensor& grad_out, const at::Tensor& saved, c10::string_view activation,
                            at::ArrayRef<double> act_args);

// Whether the CUDA backward op runs fastpipe's one-pass activation-gradient + bias-gradient kernel, else ATen's
// ops. "aten" until the kernel has passed its tests on a GPU (as the unvalidated engines run only when
// forced): FASTPIPE_CONV_ACT_BACKWARD=kernel (read at the first backward) or act_backward_force("kernel")
// turns it on. act_backward_force returns the previous setting.
bool act_backward_kernel_on();
std::string act_backward_force(c10::string_view setting);

}  // namespace fastpipe::conv
