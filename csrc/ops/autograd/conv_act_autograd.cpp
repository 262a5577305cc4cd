// Autograd of the fused convolution ops, in C++ rather than torch.library.register_autograd: the Python
// wrapper costs ~0.1 ms per call, more than a small convolution (and far more than its CUDA kernels).
// Backward runs _conv2d_act_backward (the activation's gradient and, on CUDA, the bias gradient in one
// pass) then the convolution's backward engine of the key (conv_tuner.h: aten::convolution_backward, or
// a fastpipe kernel).
#include <torch/autograd.h>
#include <torch/library.h>

#include "ops/activations.h"
#include "ops/conv_act.h"
#include "ops/conv_tuner.h"

namespace fastpipe::conv {
namespace {

using ActBackwardFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, c10::string_view,
                                                         at::ArrayRef<double>, bool);

// act(conv(input) + bias + residual). An absent bias or residual is no input of the node: the inputs
// (edges) are input, weight, then bias and residual where given. `act` is `activation` parsed, once per
// call; backward works from it.
struct ConvActFunction : public torch::autograd::Function<ConvActFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                                                const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                                const std::optional<at::Tensor>& residual, at::IntArrayRef stride,
                                                at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                                                c10::string_view activation, at::ArrayRef<double> act_args,
                                                const ActSpec& act, bool return_preact) {
    static const auto fwd = op_handle<ConvActFn<at::Tensor>>(kConv2dAct);
    static const auto train = op_handle<ConvActFn<ConvActTrainRet>>(kConv2dActTrain);
    // Backward keeps the output where it determines the activation's derivative, else the pre-activation.
    const bool keep_output = grad_from_output(act);
    at::Tensor out, preact;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      if (!keep_output || return_preact) {
        std::tie(out, preact) = train.call(FASTPIPE_CONV_ACT_ARGS);
      } else {
        out = fwd.call(FASTPIPE_CONV_ACT_ARGS);
      }
    }
    ctx->saved_data["stride"] = stride.vec();
    ctx->saved_data["padding"] = padding.vec();
    ctx->saved_data["dilation"] = dilation.vec();
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["act"] = static_cast<int64_t>(act.act);
    ctx->saved_data["alpha"] = act.alpha;
    ctx->saved_data["beta"] = act.beta;
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["has_residual"] = residual.has_value();
    ctx->save_for_backward({input, weight, keep_output ? out : preact});
    if (!return_preact) return {out};
    ctx->mark_non_differentiable({preact});
    ctx->set_materialize_grads(false);  // else autograd fills a zero gradient for preact on every backward
    return {out, preact};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto act_backward = op_handle<ActBackwardFn>(kConv2dActBackward);
    constexpr size_t kInputs = 12;  // forward's arguments after ctx
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) return torch::autograd::variable_list(kInputs);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &weight = saved[1], &act_saved = saved[2];
    TORCH_INTERNAL_ASSERT(act_saved.defined(), "conv2d_act backward without the tensor it keeps");
    const auto stride = ctx->saved_data["stride"].toIntVector();
    const auto padding = ctx->saved_data["padding"].toIntVector();
    const auto dilation = ctx->saved_data["dilation"].toIntVector();
    const int64_t groups = ctx->saved_data["groups"].toInt();
    const ActSpec act{static_cast<Act>(ctx->saved_data["act"].toInt()), ctx->saved_data["alpha"].toDouble(),
                      ctx->saved_data["beta"].toDouble()};
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    const bool need_b = has_bias && ctx->needs_input_grad(2);
    const bool need_r = ctx->saved_data["has_residual"].toBool() && ctx->needs_input_grad(has_bias ? 3 : 2);
    const bool identity = act.act == Act::Identity;
    // The bias gradient comes from convolution_backward where no activation kernel runs, and on the CPU,
    // where oneDNN sums it inside its weight-gradient pass; on CUDA the activation kernel sums it in the
    // same pass over the gradient.
    const bool bias_from_conv = need_b && (identity || !grad.is_cuda());
    at::Tensor grad_pre = grad, grad_bias;
    if (!identity) {
      std::tie(grad_pre, grad_bias) =
          act_backward.call(grad, act_saved, act_info(act.act).name, act_args_of(act), need_b && !bias_from_conv);
    }
    at::Tensor grad_x, grad_w;
    if (need_x || need_w || bias_from_conv) {
      EngineOut g = run_backward_engine(
          backward_args(grad_pre, input, weight, stride, padding, dilation, groups, {need_x, need_w, bias_from_conv}));
      grad_x = std::move(g[0]);
      grad_w = std::move(g[1]);
      if (bias_from_conv) grad_bias = std::move(g[2]);
    }
    torch::autograd::variable_list out(kInputs);  // by forward argument
    out[0] = grad_x;
    out[1] = grad_w;
    out[2] = need_b ? grad_bias : at::Tensor();
    out[3] = need_r ? grad_pre : at::Tensor();
    return out;
  }
};

bool requires_grad(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->requires_grad();
}

at::Tensor conv2d_act_autograd(FASTPIPE_CONV_ACT_PARAMS) {
  if (!at::GradMode::is_enabled() ||
      !(input.requires_grad() || weight.requires_grad() || requires_grad(bias) || requires_grad(residual))) {
    // No backward will run: skip building an autograd node (a few microseconds per call).
    static const auto fwd = op_handle<ConvActFn<at::Tensor>>(kConv2dAct);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return fwd.call(FASTPIPE_CONV_ACT_ARGS);
  }
  return ConvActFunction::apply(input, weight, bias, residual, stride, padding, dilation, groups, activation,
                                act_args, parse_activation(activation, act_args), false)[0];
}

ConvActTrainRet conv2d_act_train_autograd(FASTPIPE_CONV_ACT_PARAMS) {
  auto out = ConvActFunction::apply(input, weight, bias, residual, stride, padding, dilation, groups, activation,
                                    act_args, parse_activation(activation, act_args), true);
  return {out[0], out[1]};
}

}  // namespace
}  // namespace fastpipe::conv

TORCH_LIBRARY_IMPL(fastpipe, Autograd, m) {
  m.impl("conv2d_act", &fastpipe::conv::conv2d_act_autograd);
  m.impl("_conv2d_act_train", &fastpipe::conv::conv2d_act_train_autograd);
}
