#include "ops/activations.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/hardswish.h>
#include <ATen/ops/hardswish_backward.h>
#include <ATen/ops/hardtanh.h>
#include <ATen/ops/hardtanh_backward.h>
#include <ATen/ops/leaky_relu.h>
#include <ATen/ops/leaky_relu_backward.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sigmoid_backward.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/tanh_backward.h>
#include <ATen/ops/threshold_backward.h>
#include <c10/util/Exception.h>

#include <string>

namespace fastpipe::conv {

ActSpec parse_activation(c10::string_view name, at::ArrayRef<double> args) {
  for (const auto& e : kActivations) {
    if (name != e.name) continue;
    TORCH_CHECK(args.size() == static_cast<size_t>(e.nargs), "act_args: activation '", e.name, "' takes ", e.nargs, " value(s), got ",
                args.size());
    const ActSpec s{e.act, e.nargs > 0 ? args[0] : 0.0, e.nargs > 1 ? args[1] : 0.0};
    TORCH_CHECK(s.act != Act::Hardtanh || s.alpha < s.beta, "act_args: hardtanh needs min < max, got min=",
                s.alpha, " max=", s.beta);
    return s;
  }
  std::string names;
  for (const auto& e : kActivations) names += std::string(names.empty() ? "" : ", ") + e.name;
  C10_THROW_ERROR(ValueError, c10::str("activation must be one of ", names, "; got '", name, "'"));
}

std::vector<double> act_args_of(const ActSpec& s) {
  const int n = act_info(s.act).nargs;
  std::vector<double> args;
  if (n > 0) args.push_back(s.alpha);
  if (n > 1) args.push_back(s.beta);
  return args;
}

at::Tensor apply_activation(const at::Tensor& t, const ActSpec& s, bool inplace) {
  at::Tensor x = t;
  switch (s.act) {
    case Act::Identity: return inplace ? x : x.clone();
    case Act::Relu: return inplace ? at::relu_(x) : at::relu(x);
    case Act::Hardtanh: return inplace ? at::hardtanh_(x, s.alpha, s.beta) : at::hardtanh(x, s.alpha, s.beta);
    case Act::LeakyRelu: return inplace ? at::leaky_relu_(x, s.alpha) : at::leaky_relu(x, s.alpha);
    case Act::Silu: return inplace ? at::silu_(x) : at::silu(x);
    case Act::Gelu: return inplace ? at::gelu_(x) : at::gelu(x);
    case Act::GeluTanh: return inplace ? at::gelu_(x, "tanh") : at::gelu(x, "tanh");
    case Act::Sigmoid: return inplace ? at::sigmoid_(x) : at::sigmoid(x);
    case Act::Tanh: return inplace ? at::tanh_(x) : at::tanh(x);
    case Act::Hardswish: return inplace ? at::hardswish_(x) : at::hardswish(x);
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled activation");
}

std::tuple<at::Tensor, at::Tensor> act_backward_aten(const at::Tensor& grad_out, const at::Tensor& saved,
                                                     const ActSpec& act, bool bias_grad) {
  const auto fmt = saved.suggest_memory_format();
  const at::Tensor g = grad_out.contiguous(fmt);
  const at::Tensor s = saved.contiguous(fmt);
  at::Tensor gz;
  switch (act.act) {
    case Act::Identity: gz = g.clone(fmt); break;
    case Act::Relu: gz = at::threshold_backward(g, s, 0); break;
    case Act::Hardtanh: gz = at::hardtanh_backward(g, s, act.alpha, act.beta); break;
    case Act::LeakyRelu: gz = at::leaky_relu_backward(g, s, act.alpha, /*self_is_result=*/false); break;
    case Act::Silu: gz = at::silu_backward(g, s); break;
    case Act::Gelu: gz = at::gelu_backward(g, s, "none"); break;
    case Act::GeluTanh: gz = at::gelu_backward(g, s, "tanh"); break;
    case Act::Sigmoid: gz = at::sigmoid_backward(g, s); break;
    case Act::Tanh: gz = at::tanh_backward(g, s); break;
    case Act::Hardswish: gz = at::hardswish_backward(g, s); break;
  }
  gz = gz.contiguous(fmt);
  at::Tensor gb = bias_grad ? gz.sum({0, 2, 3}) : at::empty({0}, gz.options());
  return {gz, gb};
}

}  // namespace fastpipe::conv
