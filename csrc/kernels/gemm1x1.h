// A 1x1 convolution (stride 1, no padding, one group) on channels_last tensors is one GEMM: the NHWC input
// is a row-major [M = N*H*W, C_in] matrix, the weight a row-major [C_out, C_in] one, and the NHWC output
// the row-major [M, C_out] product. cuBLASLt adds a residual (its C operand, beta = 1) and a per-row bias
// and applies ReLU or tanh-GELU in the same kernel; other activations are one pass of fastpipe's epilogue
// kernel over the GEMM's output, as are the bias and activation of a GEMM with a dimension of 1. This header plans the call in cuBLASLt's column-major terms; plain C++ (no
// torch or CUDA headers), so the CPU tests run the plan through a host model of cuBLASLt's semantics.
#pragma once

#include <cstdint>

#include "kernels/activation.h"

namespace fastpipe::cuda {

// cuBLASLt's epilogues that fastpipe uses (mapped onto cublasLtEpilogue_t in gemm1x1.cu).
enum class LtEpilogue : int { Default, Bias, Relu, ReluBias, Gelu, GeluBias };

inline bool lt_epilogue_has_bias(LtEpilogue e) {
  return e == LtEpilogue::Bias || e == LtEpilogue::ReluBias || e == LtEpilogue::GeluBias;
}

// D (m x n) = epilogue(op(A) (m x k) * op(B) (k x n) + beta * C), every matrix column-major; C and D
// share the leading dimension ldd; the bias (m values) is added to every column before the activation.
struct GemmPlan {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldd = 0;
  float beta = 0.0f;              // 1: the residual is C
  LtEpilogue epilogue = LtEpilogue::Default;
  // What fastpipe's epilogue kernel applies to D after the GEMM: the bias where cuBLASLt's epilogue may not
  // add it, the activation where it is not one of cuBLASLt's (or cuBLASLt's epilogue may not run).
  bool bias_after = false;
  bool activation_after = false;
};

// Whether cuBLASLt's epilogues (bias, ReLU, GELU) may be used on an m x n x k GEMM: only when every operand has
// at least 2 rows and 2 columns. torch's addmm takes the same rule before it uses cuBLASLt's bias epilogue
// (isInputCompliesAddmmCudaLt in aten/src/ATen/native/cuda/Blas.cpp: with an operand of one row or column,
// cublasLtMatmulAlgoGetHeuristic fails with CUBLAS_STATUS_INVALID_VALUE) and runs a plain GEMM otherwise.
inline bool lt_epilogue_allowed(int64_t m, int64_t n, int64_t k) {
  return m > 1 && n > 1 && k > 1;
}

// The plan for a 1x1 convolution of `batch` x `spatial` pixels, C_in -> C_out channels, all NHWC. In column-
// major terms the input is C_in x M (ld C_in), the weight C_in x C_out (ld C_in), used transposed, and the
// output C_out x M (ld C_out): so m = C_out (the bias runs along channels), n = M, k = C_in.
inline GemmPlan plan_conv1x1(int64_t batch, int64_t spatial, int64_t in_channels, int64_t out_channels, bool bias,
                             bool residual, Act act) {
  GemmPlan p;
  p.m = out_channels;
  p.n = batch * spatial;
  p.k = in_channels;
  p.trans_a = true;   // A = weight
  p.trans_b = false;  // B = input
  p.lda = in_channels;
  p.ldb = in_channels;
  p.ldd = out_channels;
  p.beta = residual ? 1.0f : 0.0f;
  if (!lt_epilogue_allowed(p.m, p.n, p.k)) {  // a plain GEMM (with the residual as C), then the epilogue kernel
    p.bias_after = bias;
    p.activation_after = act != Act::Identity;
    return p;
  }
  switch (act) {
    case Act::Relu:
      p.epilogue = bias ? LtEpilogue::ReluBias : LtEpilogue::Relu;
      break;
    case Act::GeluTanh:  // cuBLASLt's GELU is the tanh approximation
      p.epilogue = bias ? LtEpilogue::GeluBias : LtEpilogue::Gelu;
      break;
    default:
      p.epilogue = bias ? LtEpilogue::Bias : LtEpilogue::Default;
      p.activation_after = act != Act::Identity;
  }
  return p;
}

// What cuBLASLt would compute from a plan, for the host model: (i, j) of D in column-major storage.
inline int64_t lt_index(int64_t row, int64_t col, int64_t ld) { return row + col * ld; }

// op(X)(row, col) of a column-major X with leading dimension ld, transposed when `trans`.
inline int64_t lt_op_index(int64_t row, int64_t col, int64_t ld, bool trans) {
  return trans ? col + row * ld : row + col * ld;
}

}  // namespace fastpipe::cuda
