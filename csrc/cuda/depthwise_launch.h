// The launcher of the direct depthwise kernel (depthwise.h has its parameters and index math).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/depthwise.h"
#include "cuda/epilogue.h"

namespace fastpipe::cuda {

// p.dtype is a DType (epilogue.h); pointers need only their type's alignment. Returns
// cudaErrorInvalidValue for bad sizes, else the launch's cudaGetLastError().
cudaError_t launch_depthwise(const DepthwiseParams& p, int num_sms, cudaStream_t stream);

// The NCHW shared-memory-tile variant (depthwise.h); cudaErrorInvalidValue where depthwise_tiled_why_not.
cudaError_t launch_depthwise_tiled(const DepthwiseParams& p, cudaStream_t stream);

}  // namespace fastpipe::cuda
