#include "ops/traced_device.h"

#include <ATen/record_function.h>

#include <vector>

#include "core/trace.h"

#ifdef FASTPIPE_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace fastpipe {
namespace {

#ifdef FASTPIPE_WITH_CUDA
const trace::Hooks kNvtx{[](const char* name) { nvtxRangePushA(name); }, [] { nvtxRangePop(); }};
const bool nvtx_installed = (trace::install(&kNvtx), true);
#endif

constexpr const char* kCopy = "fastpipe::loader.copy";
constexpr const char* kTransform = "fastpipe::loader.transform";
constexpr const char* kDecode = "fastpipe::loader.decode";

}  // namespace

void TracedDevice::copy_to_device(void* dst, const void* src, size_t bytes, Stream* s) {
  RECORD_FUNCTION(kCopy, std::vector<c10::IValue>());
  trace::Range range(kCopy);
  inner_->copy_to_device(dst, src, bytes, s);
}

void TracedDevice::launch(const DeviceKernel& k, Stream* s) {
  RECORD_FUNCTION(kTransform, std::vector<c10::IValue>());
  trace::Range range(kTransform);
  inner_->launch(k, s);
}

images::DecodedLayout TracedDevice::decode_jpegs(const JpegDecodeJob& job, Stream* s) {
  RECORD_FUNCTION(kDecode, std::vector<c10::IValue>());
  trace::Range range(kDecode);
  return inner_->decode_jpegs(job, s);
}

}  // namespace fastpipe
