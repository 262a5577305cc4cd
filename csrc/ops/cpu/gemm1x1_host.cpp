// fastpipe::_gemm1x1_host: the gemm1x1 engine's plan (csrc/kernels/gemm1x1.h) run through a host model of
// cuBLASLt's semantics (column-major operands, transposes, leading dimensions, C with beta, a bias per row
// of D, ReLU / tanh-GELU epilogues), on the same NHWC buffers the GPU engine hands cuBLASLt, then the
// activation the epilogue kernel applies after it. A test op: the CPU tests check the plan against float64
// convolutions on every build, GPU or not.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <string>

#include "kernels/gemm1x1.h"
#include "ops/activations.h"

namespace fastpipe::conv {
namespace {

double lt_activation(cuda::LtEpilogue e, double x) {
  switch (e) {
    case cuda::LtEpilogue::Relu:
    case cuda::LtEpilogue::ReluBias:
      return x > 0 ? x : 0;
    case cuda::LtEpilogue::Gelu:
    case cuda::LtEpilogue::GeluBias:
      return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    default:
      return x;
  }
}

at::Tensor gemm1x1_host(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                        const std::optional<at::Tensor>& residual, c10::string_view activation,
                        at::ArrayRef<double> act_args) {
  TORCH_CHECK(input.dim() == 4 && weight.dim() == 4 && weight.size(2) == 1 && weight.size(3) == 1 &&
                  weight.size(1) == input.size(1),
              "_gemm1x1_host takes input [N, C_in, H, W] and weight [C_out, C_in, 1, 1]");
  const ActSpec act = parse_activation(activation, act_args);
  const auto cl = at::MemoryFormat::ChannelsLast;
  const at::Tensor in = input.to(at::kDouble).contiguous(cl), w = weight.to(at::kDouble).contiguous();
  const int64_t n = in.size(0), c_in = in.size(1), h = in.size(2), wd = in.size(3), c_out = w.size(0);
  at::Tensor out = at::empty({n, c_out, h, wd}, in.options().memory_format(cl));
  const at::Tensor b = bias ? bias->to(at::kDouble).contiguous() : at::Tensor();
  const at::Tensor r = residual ? residual->to(at::kDouble).contiguous(cl) : at::Tensor();
  TORCH_CHECK(!residual || r.sizes() == out.sizes(), "residual must have the output's shape ", out.sizes());

  const cuda::GemmPlan g = cuda::plan_conv1x1(n, h * wd, c_in, c_out, bias.has_value(), residual.has_value(), act.act);
  // cuBLASLt's heuristic refuses an epilogue when an operand has one row or column (torch's addmm avoids it).
  TORCH_CHECK(g.epilogue == cuda::LtEpilogue::Default || (g.m > 1 && g.n > 1 && g.k > 1),
              "cuBLASLt refuses epilogue ", static_cast<int>(g.epilogue), " on a GEMM of m=", g.m, ", n=", g.n,
              ", k=", g.k, " (CUBLAS_STATUS_INVALID_VALUE)");
  const double *A = w.data_ptr<double>(), *B = in.data_ptr<double>();
  const double* C = residual ? r.data_ptr<double>() : nullptr;
  const double* bias_ptr = bias ? b.data_ptr<double>() : nullptr;
  TORCH_CHECK(!cuda::lt_epilogue_has_bias(g.epilogue) || bias_ptr, "the plan adds a bias that was not given");
  double* D = out.data_ptr<double>();
  for (int64_t j = 0; j < g.n; ++j) {
    for (int64_t i = 0; i < g.m; ++i) {
      double acc = 0;
      for (int64_t l = 0; l < g.k; ++l)
        acc += A[cuda::lt_op_index(i, l, g.lda, g.trans_a)] * B[cuda::lt_op_index(l, j, g.ldb, g.trans_b)];
      const int64_t at = cuda::lt_index(i, j, g.ldd);
      if (g.beta != 0.0f) acc += g.beta * C[at];
      if (cuda::lt_epilogue_has_bias(g.epilogue)) acc += bias_ptr[i];
      D[at] = lt_activation(g.epilogue, acc);
    }
  }
  // The epilogue kernel's pass: the bias, then the activation.
  if (g.bias_after) out.add_(b.view({1, c_out, 1, 1}));
  return g.activation_after ? apply_activation(out, act, /*inplace=*/true) : out;
}

// The plan's choices as text: cuBLASLt's epilogue and what the epilogue kernel applies after it.
std::string gemm1x1_plan(int64_t batch, int64_t spatial, int64_t in_channels, int64_t out_channels, bool bias,
                         bool residual, c10::string_view activation, at::ArrayRef<double> act_args) {
  const cuda::GemmPlan g = cuda::plan_conv1x1(batch, spatial, in_channels, out_channels, bias, residual,
                                              parse_activation(activation, act_args).act);
  static const char* names[] = {"default", "bias", "relu", "relu_bias", "gelu", "gelu_bias"};
  return std::string(names[static_cast<int>(g.epilogue)]) + (g.bias_after ? " +bias after" : "") +
         (g.activation_after ? " +activation after" : "");
}

}  // namespace
}  // namespace fastpipe::conv

TORCH_LIBRARY_FRAGMENT(fastpipe, m) {
  m.def(
      "_gemm1x1_host(Tensor input, Tensor weight, Tensor? bias, Tensor? residual, str activation, float[] act_args) "
      "-> Tensor");
  m.def(
      "_gemm1x1_plan(int batch, int spatial, int in_channels, int out_channels, bool bias, bool residual, "
      "str activation, float[] act_args) -> str",
      &fastpipe::conv::gemm1x1_plan);
}

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) {
  m.impl("_gemm1x1_host", &fastpipe::conv::gemm1x1_host);
}
