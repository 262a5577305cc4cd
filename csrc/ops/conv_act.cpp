// fastpipe's op schemas (all of them live here), the fused convolution ops' argument checks and op
// bodies, and their CPU registrations. conv_act.h says where the rest lives.
#include "ops/conv_act.h"

#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "ops/activations.h"
#include "ops/conv_tuner.h"
#include "ops/cpu/conv_onednn.h"

namespace fastpipe::conv {
namespace {

std::array<int64_t, 2> pair_arg(at::IntArrayRef v, const char* name, int64_t min) {
  TORCH_CHECK(v.size() == 1 || v.size() == 2, name, " must have 2 values (height, width), got ", v.size());
  const std::array<int64_t, 2> r{v.front(), v.back()};
  TORCH_CHECK(r[0] >= min && r[1] >= min, name, " values must be >= ", min, ", got ", v);
  return r;
}

void check_like_input(const at::Tensor& t, const char* name, const at::Tensor& input) {
  TORCH_CHECK(t.device() == input.device(), name, " is on ", t.device(), " but input is on ", input.device());
  TORCH_CHECK(t.scalar_type() == input.scalar_type(), name, " has dtype ", t.scalar_type(), " but input has ",
              input.scalar_type(), " (cast it, or run under autocast)");
}

// The fields of a forward or backward call: the operands, the geometry, and the output's layout (like
// eager convolution: channels_last when either operand is).
ConvArgs geometry_args(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  ConvArgs a;
  a.input = input;
  a.weight = weight;
  a.stride = pair_arg(stride, "stride", 1);
  a.padding = pair_arg(padding, "padding", 0);
  a.dilation = pair_arg(dilation, "dilation", 1);
  a.groups = groups;
  const bool channels_last = input.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
                             weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
  a.format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  return a;
}

ConvArgs make_args(FASTPIPE_CONV_ACT_PARAMS) {
  TORCH_CHECK(input.dim() == 4, "input must be 4-D (N, C, H, W), got ", input.dim(), "-D");
  TORCH_CHECK(at::isFloatingType(input.scalar_type()), "input must have a floating dtype, got ",
              input.scalar_type());
  TORCH_CHECK(weight.dim() == 4, "weight must be 4-D (out_channels, in_channels / groups, kH, kW), got ",
              weight.dim(), "-D");
  check_like_input(weight, "weight", input);
  TORCH_CHECK(groups >= 1, "groups must be >= 1, got ", groups);
  const int64_t out_channels = weight.size(0);
  TORCH_CHECK(out_channels % groups == 0, "weight.size(0) (out_channels = ", out_channels,
              ") must be divisible by groups = ", groups);
  TORCH_CHECK(weight.size(1) >= 1, "weight.size(1) (in_channels / groups) must be >= 1, got 0: a convolution "
              "needs input channels");
  TORCH_CHECK(input.size(1) == weight.size(1) * groups, "input has ", input.size(1),
              " channels but weight expects ", weight.size(1) * groups, " (weight.size(1) = ", weight.size(1),
              " per group, groups = ", groups, ")");
  ConvArgs a = geometry_args(input, weight, stride, padding, dilation, groups);
  a.out_sizes[0] = input.size(0);
  a.out_sizes[1] = out_channels;
  for (int d = 0; d < 2; ++d) {
    const int64_t extent = a.dilation[d] * (weight.size(2 + d) - 1) + 1;
    TORCH_CHECK(input.size(2 + d) + 2 * a.padding[d] >= extent, "input ", d == 0 ? "height" : "width", " ",
                input.size(2 + d), " plus padding ", 2 * a.padding[d], " is smaller than the dilated kernel (",
                extent, ")");
    a.out_sizes[2 + d] = conv_output_size(input.size(2 + d), weight.size(2 + d), a.stride[d], a.padding[d],
                                          a.dilation[d]);
  }
  if (bias) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == out_channels, "bias must be 1-D of size out_channels = ",
                out_channels, ", got shape ", bias->sizes());
    check_like_input(*bias, "bias", input);
    a.bias = bias;
  }
  if (residual) {
    TORCH_CHECK(residual->sizes() == at::IntArrayRef(a.out_sizes), "residual must have the output's shape ",
                at::IntArrayRef(a.out_sizes), ", got ", residual->sizes());
    check_like_input(*residual, "residual", input);
    a.residual = residual;
  }
  a.act = parse_activation(activation, act_args);
  return a;
}

int64_t out_numel(const ConvArgs& a) {
  return a.out_sizes[0] * a.out_sizes[1] * a.out_sizes[2] * a.out_sizes[3];
}

at::Tensor empty_output(const ConvArgs& a) {
  return at::empty(a.out_sizes, a.input.options().memory_format(a.format));
}

std::tuple<at::Tensor, at::Tensor> conv2d_act_backward_cpu(const at::Tensor& grad_out, const at::Tensor& saved,
                                                           c10::string_view activation,
                                                           at::ArrayRef<double> act_args, bool bias_grad) {
  return act_backward_aten(grad_out, saved, check_backward_args(grad_out, saved, activation, act_args), bias_grad);
}

bool act_backward_setting(c10::string_view setting, const char* what) {
  TORCH_CHECK(setting == "aten" || setting == "kernel", what, " must be 'aten' or 'kernel', got '", setting, "'");
  return setting == "kernel";
}

// An invalid FASTPIPE_CONV_ACT_BACKWARD fails every backward call that reads it (the initialiser reruns).
std::atomic<bool>& act_backward_kernel() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("FASTPIPE_CONV_ACT_BACKWARD");
    return env != nullptr && *env != '\0' && act_backward_setting(env, "FASTPIPE_CONV_ACT_BACKWARD");
  }()};
  return on;
}

#ifndef FASTPIPE_WITH_CUDA
void no_cuda_kernels(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK(false, op.schema().name(),
              ": fastpipe was built without CUDA kernels (FASTPIPE_CUDA=0, a CPU-only torch or no CUDA toolkit at "
              "build time); rebuild it with CUDA to use CUDA tensors");
}
#endif

}  // namespace

bool act_backward_kernel_on() {
  return act_backward_kernel().load();
}

std::string act_backward_force(c10::string_view setting) {
  const bool on = act_backward_setting(setting, "the activation backward's setting");
  return act_backward_kernel().exchange(on) ? "kernel" : "aten";
}

at::Tensor conv2d_act(FASTPIPE_CONV_ACT_PARAMS) {
  const ConvArgs a = make_args(FASTPIPE_CONV_ACT_ARGS);
  const c10::OptionalDeviceGuard guard(input.device());
  if (out_numel(a) == 0) return empty_output(a);
  return run_engine(a).contiguous(a.format);
}

ConvActTrainRet conv2d_act_train(FASTPIPE_CONV_ACT_PARAMS) {
  ConvArgs a = make_args(FASTPIPE_CONV_ACT_ARGS);
  const c10::OptionalDeviceGuard guard(input.device());
  if (out_numel(a) == 0) return {empty_output(a), empty_output(a)};
  // The engines compute the pre-activation (their choice is that of the identity key); the activation
  // follows out of place so that both tensors survive.
  const ActSpec act = a.act;
  a.act = ActSpec{};
  at::Tensor preact = run_engine(a).contiguous(a.format);
  return {apply_activation(preact, act, /*inplace=*/false), preact};
}

ConvArgs backward_args(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                       std::array<bool, 3> need) {
  ConvArgs a = geometry_args(input, weight, stride, padding, dilation, groups);  // passed make_args' checks
  for (int d = 0; d < 4; ++d) a.out_sizes[d] = grad.size(d);
  a.backward = true;
  a.grad = grad;
  a.need = need;
  return a;
}

ActSpec check_backward_args(const at::Tensor& grad_out, const at::Tensor& saved, c10::string_view activation,
                            at::ArrayRef<double> act_args) {
  TORCH_CHECK(saved.dim() == 4, "saved must be 4-D (N, C, H, W), got ", saved.dim(), "-D");
  TORCH_CHECK(grad_out.sizes() == saved.sizes(), "grad_out has shape ", grad_out.sizes(), " but saved has ",
              saved.sizes());
  TORCH_CHECK(grad_out.scalar_type() == saved.scalar_type(), "grad_out has dtype ", grad_out.scalar_type(),
              " but saved has ", saved.scalar_type());
  TORCH_CHECK(grad_out.device() == saved.device(), "grad_out is on ", grad_out.device(), " but saved is on ",
              saved.device());
  return parse_activation(activation, act_args);
}

}  // namespace fastpipe::conv

TORCH_LIBRARY(fastpipe, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  // act(conv2d(input, weight) + bias + residual) with activation/act_args as in fastpipe/ops.py.
  m.def(
      "conv2d_act(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
      "int[2] dilation=1, int groups=1, str activation=\"relu\", float[] act_args=[], Tensor? residual=None) "
      "-> Tensor",
      tags);
  // The same, also returning the pre-activation (kept for backward by activations that need it).
  m.def(
      "_conv2d_act_train(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
      "int[2] dilation=1, int groups=1, str activation=\"relu\", float[] act_args=[], Tensor? residual=None) "
      "-> (Tensor, Tensor)",
      tags);
  // (grad w.r.t. the pre-activation, grad_bias or an empty tensor when not bias_grad) from the
  // gradient w.r.t. the output and the saved output or pre-activation.
  m.def(
      "_conv2d_act_backward(Tensor grad_out, Tensor saved, str activation, float[] act_args, bool bias_grad) "
      "-> (Tensor, Tensor)",
      tags);
  // Engine choice: names per device type, the cached choices, clearing them, and the choice rule.
  m.def("_conv_engines(str device, bool backward=False) -> str[]", &fastpipe::conv::engine_names);
  m.def("_conv_engine_cache() -> str[]", &fastpipe::conv::engine_cache);
  m.def("_conv_engine_clear() -> ()", &fastpipe::conv::engine_clear);
  m.def("_conv_engine_force(str name) -> str", &fastpipe::conv::engine_force);
  m.def("_conv_engine_export(str device) -> str[]", &fastpipe::conv::engine_export);
  m.def("_conv_engine_import(str[] lines) -> int", &fastpipe::conv::engine_import);
  m.def("_conv_engine_forget(str device, bool thin_only) -> str[]", &fastpipe::conv::engine_forget);
  m.def("_conv_engine_persist(str device, bool on) -> bool", &fastpipe::conv::engine_persist);
  m.def("_conv_engine_perturb_check(str name, float amount) -> ()", &fastpipe::conv::engine_perturb_check);
  m.def("_conv_engine_time_unvalidated(bool on) -> bool", &fastpipe::conv::engine_time_unvalidated);
  m.def("_conv_pick_engine(float[] fastest, float[] ratio) -> int", &fastpipe::conv::pick_engine_op);
  // The CUDA backward's activation gradient: "aten" or fastpipe's "kernel"; returns the previous setting.
  m.def("_conv_act_backward_force(str setting) -> str", &fastpipe::conv::act_backward_force);
  // The dtypes the CPU oneDNN engine declares on this CPU, and the test hook that overrides them.
  m.def("_conv_onednn_dtypes() -> str[]", &fastpipe::conv::onednn_dtype_names);
  m.def("_conv_onednn_dtypes_override(str[]? dtypes) -> ()", &fastpipe::conv::onednn_dtypes_override_op);
}

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) {
  m.impl("conv2d_act", &fastpipe::conv::conv2d_act);
  m.impl("_conv2d_act_train", &fastpipe::conv::conv2d_act_train);
  m.impl("_conv2d_act_backward", &fastpipe::conv::conv2d_act_backward_cpu);
}

#ifndef FASTPIPE_WITH_CUDA
TORCH_LIBRARY_IMPL(fastpipe, CUDA, m) {
  const auto fail = [] { return torch::CppFunction::makeFromBoxedFunction<&fastpipe::conv::no_cuda_kernels>(); };
  m.impl("conv2d_act", fail());
  m.impl("_conv2d_act_train", fail());
  m.impl("_conv2d_act_backward", fail());
}
#endif
