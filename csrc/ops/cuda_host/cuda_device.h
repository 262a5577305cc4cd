// The CUDA implementation of core/device.h: streams and events of one GPU, the consumer's stream being
// torch's current stream of that device. Every CUDA call is checked; a failure that is deliberately
// handled is cleared (cudaGetLastError) so that it does not surface later in an unrelated kernel.
#pragma once

#include <memory>
#include <string>

#include <cuda_runtime_api.h>

#include "core/device.h"

namespace fastpipe {

// Throws Error(kState) "CUDA <what> failed: <reason>" when err is not cudaSuccess, clearing the error.
void check_cuda(cudaError_t err, const char* what);

// `nvjpeg_path`: the nvJPEG library to load on the first JPEG decode ("": the usual names).
std::shared_ptr<Device> make_cuda_device(int index, const std::string& nvjpeg_path = "");

// A stream of torch's (torch.cuda.Stream.cuda_stream) as a Stream of the CUDA device.
inline Stream* cuda_stream_handle(uintptr_t cuda_stream) { return reinterpret_cast<Stream*>(cuda_stream); }

}  // namespace fastpipe
