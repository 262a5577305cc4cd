#include "ops/cuda_host/nvjpeg_guard_check.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "core/jpeg_header.h"
#include "ops/cuda_host/cuda_device.h"
#include "ops/cuda_host/nvjpeg.h"

namespace fastpipe::cuda {
namespace {

constexpr uint8_t kGuard = 0xA5;

}  // namespace

GuardedDecode guarded_decode(const std::vector<std::string>& jpegs, const std::string& library, int64_t guard) {
  std::string why;
  const std::unique_ptr<JpegBatchDecoder> decoder = make_jpeg_decoder(library, &why);
  if (!decoder) throw Error(ErrorKind::kState, "nvJPEG is unavailable: " + why);
  JpegDecodeJob job;
  std::vector<int64_t> start;  // each image's region in the buffer, guard bytes before the first and after each
  int64_t total = guard;
  for (const std::string& jpeg : jpegs) {
    const auto* data = reinterpret_cast<const uint8_t*>(jpeg.data());
    JpegInfo info;
    images::YccPlanes planes;
    if (read_jpeg_info(data, jpeg.size(), &info, &why) != JpegParse::kOk)
      throw Error(ErrorKind::kValue, "image " + std::to_string(start.size()) + " is not a JPEG: " + why);
    if (const char* no = device_jpeg_planes(info, &planes))
      throw Error(ErrorKind::kValue, "image " + std::to_string(start.size()) + " is not one a device decodes: " + no);
    const int64_t room = std::max(images::ycc_planes_bytes(planes), int64_t{3} * planes.height * planes.width);
    start.push_back(total);
    total += room + guard;
    job.data.push_back(data);
    job.sizes.push_back(jpeg.size());
    job.planes.push_back(planes);
  }
  void* raw = nullptr;
  check_cuda(cudaMalloc(&raw, static_cast<size_t>(total)), "cudaMalloc");
  auto* buffer = static_cast<uint8_t*>(raw);
  const std::unique_ptr<uint8_t, void (*)(uint8_t*)> owned(buffer, [](uint8_t* p) { cudaFree(p); });
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_owned(stream, [](cudaStream_t s) {
    cudaStreamDestroy(s);
  });
  check_cuda(cudaMemsetAsync(buffer, kGuard, static_cast<size_t>(total), stream), "cudaMemsetAsync");
  for (int64_t at : start) job.out.push_back(buffer + at);
  GuardedDecode result;
  result.layout = decoder->decode(job, stream);
  std::vector<uint8_t> host(static_cast<size_t>(total));
  check_cuda(cudaMemcpyAsync(host.data(), buffer, host.size(), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  // Image k answers for the bytes after its region up to the next one (the first also for those before it).
  for (size_t k = 0; k < start.size(); ++k) {
    const images::YccPlanes& p = job.planes[k];
    const int64_t written = result.layout == images::DecodedLayout::kYccPlanar ? images::ycc_planes_bytes(p)
                                                                               : int64_t{3} * p.height * p.width;
    const int64_t next = k + 1 < start.size() ? start[k + 1] : total;
    int64_t changed = 0;
    for (int64_t i = k == 0 ? 0 : start[k]; i < start[k]; ++i) changed += host[i] != kGuard;
    for (int64_t i = start[k] + written; i < next; ++i) changed += host[i] != kGuard;
    result.overwritten.push_back(changed);
    result.outputs.emplace_back(reinterpret_cast<const char*>(host.data() + start[k]), static_cast<size_t>(written));
  }
  return result;
}

}  // namespace fastpipe::cuda
