// The launchers of the direct depthwise kernels (depthwise.h has their parameters and index math).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/depthwise.h"
#include "cuda/epilogue.h"

namespace fastpipe::cuda {

// p.dtype is a DType (dtype.h); pointers need only their type's alignment. Returns
// cudaErrorInvalidValue for bad sizes, else the launch's cudaGetLastError().
cudaError_t launch_depthwise(const DepthwiseParams& p, int num_sms, cudaStream_t stream);

// The NCHW shared-memory-tile variant (depthwise.h); cudaErrorInvalidValue where depthwise_tiled_why_not.
cudaError_t launch_depthwise_tiled(const DepthwiseParams& p, cudaStream_t stream);

// The backward kernels (depthwise.h): dx from the gradient g and the weight, all in p's layout and dtype;
// cudaErrorInvalidValue where depthwise_backward_why_not.
cudaError_t launch_depthwise_input_grad(const DepthwiseParams& p, const void* grad, const void* weight,
                                        void* grad_input, int num_sms, cudaStream_t stream);

// The weight-gradient blocks of `plan` (depthwise_wgrad_plan(p, ...)): partial sums into
// partial[plan.splits][p.c][kh * kw + 1], every entry written. launch_bias_grad_finalize over
// p.c * (kh * kw + 1) "channels" then adds them over the splits.
cudaError_t launch_depthwise_wgrad(const DepthwiseParams& p, const WgradPlan& plan, const void* grad,
                                   const void* input, float* partial, cudaStream_t stream);

}  // namespace fastpipe::cuda
