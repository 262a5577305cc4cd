// CUDA kernels around a convolution: the forward epilogue (bias + residual + activation, one pass over
// the conv output) and the backward prologue (activation gradient + bias-gradient partial sums, one
// pass over the incoming gradient). They see raw pointers only; the op layer fills the structs.
//
// Layout: a 4-D tensor stored densely as NCHW or NHWC (channels_last); the channel of flat element i is
// (i / (H*W)) % C for NCHW and i % C for NHWC, which is all the kernels need to know of the shape.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/activation.h"
#include "kernels/dtype.h"

namespace fastpipe::cuda {

// The kernels index with 32-bit integers; the op layer sends larger tensors down ATen paths.
constexpr int64_t kMaxElements = (int64_t(1) << 31) - 1;

struct EpilogueParams {
  void* out = nullptr;               // act(y + bias[c] + residual); may be the same buffer as y
  const void* y = nullptr;           // conv output
  const void* bias = nullptr;        // [channels] or null
  const void* residual = nullptr;    // same shape and layout as y, or null
  int64_t batch = 0;                 // N
  int64_t channels = 0;              // C
  int64_t spatial = 1;               // H*W
  bool channels_last = false;
  DType dtype = DType::Float;
  ActSpec act;
};

struct ActBackwardParams {
  void* grad_in = nullptr;           // written: gradient w.r.t. the pre-activation
  const void* grad_out = nullptr;    // gradient w.r.t. the output, same layout as saved
  const void* saved = nullptr;       // output or pre-activation (see activation.h)
  float* bias_partial = nullptr;     // [splits, channels] partial sums of grad_in, or null to skip
  int64_t batch = 0;                 // N
  int64_t channels = 0;              // C
  int64_t spatial = 1;               // H*W
  bool channels_last = false;
  int splits = 1;                    // rows of bias_partial; see act_backward_splits
  DType dtype = DType::Float;
  ActSpec act;
};

// Pointers must be 16-byte aligned (the kernels load 16 bytes at a time); each launcher returns
// cudaErrorInvalidValue for bad arguments and otherwise the launch's cudaGetLastError().
cudaError_t launch_epilogue(const EpilogueParams& p, int num_sms, cudaStream_t stream);

// How many partial sums per channel the backward kernel produces, for a buffer of [splits, channels].
int act_backward_splits(int64_t batch, int64_t channels, int64_t spatial, bool channels_last, int num_sms);
cudaError_t launch_act_backward(const ActBackwardParams& p, cudaStream_t stream);

// grad_bias[c] = sum over splits of partial[s, c], written in `dtype`.
cudaError_t launch_bias_grad_finalize(void* grad_bias, const float* partial, int splits, int64_t channels,
                                      DType dtype, cudaStream_t stream);

}  // namespace fastpipe::cuda
