// The storage types of the CUDA kernels' tensors (they all accumulate in float). Plain C++: the host
// code that fills the kernels' parameter structs includes it without the CUDA headers.
#pragma once

namespace fastpipe::cuda {

enum class DType : int { Float, Half, BFloat16 };

}  // namespace fastpipe::cuda
