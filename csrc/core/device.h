// Streams, events, asynchronous copies, device memory and the batch kernels behind one narrow interface.
// The device pipeline (device_pipeline.h) is written against it; CUDA implements it
// (csrc/ops/cuda/cuda_device.cpp) and a CPU simulation (sim_device.h) lets the pipeline's ordering logic
// run, and be tested, on a machine without a GPU.
//
// Semantics are CUDA's: work queued on one stream runs in order; record(e, s) marks the point of s where
// e completes; wait(s, e) makes s wait for the last record of e made before the call, without the host
// waiting; synchronize(e) makes the host wait for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/image_transform.h"
#include "cuda/transforms.h"

namespace fastpipe {

struct Stream;  // opaque: owned by the Device that made it
struct Event;

// token windows widened to int64 on the device: records of `src` (src_stride bytes apart) hold
// block + 1 tokens of token_bytes; x = tokens[:-1], y = tokens[1:], `block` int64 each per record.
struct WidenTokensKernel {
  const void* src = nullptr;
  int64_t src_stride = 0;
  int token_bytes = 0;
  bool is_signed = false;
  int64_t records = 0;
  int64_t block = 0;
  int64_t* x = nullptr;
  int64_t* y = nullptr;
};

// CropMirrorNormalize over a batch of `count` images; index[k] (device memory) is image k's sample index.
struct CropMirrorNormalizeKernel {
  transforms::CropMirrorNormalizeParams params;
  const uint8_t* images = nullptr;
  void* out = nullptr;
  int64_t count = 0;
  const int64_t* index = nullptr;
  uint64_t epoch = 0;
};

// The JPEG transforms' last pass for images decoded on the device: record k (descs[k], device memory)
// decoded whole at staging + k * image_stride becomes output image k of `out`; records decoded on the
// host (DecodeOn::kHost) are left alone (their outputs are copied).
struct ResampleImagesKernel {
  images::ImageTransformParams params;
  const images::ImageDesc* descs = nullptr;
  const uint8_t* staging = nullptr;
  int64_t image_stride = 0;
  void* out = nullptr;
  int64_t count = 0;
};

struct DeviceKernel {
  enum class Kind { kWidenTokens, kCropMirrorNormalize, kResampleImages } kind;
  WidenTokensKernel widen;
  CropMirrorNormalizeKernel cmn;
  ResampleImagesKernel resample;
};

// JPEG images to decode on the device, each whole into interleaved RGB (height * width * 3 bytes at
// out[k], device memory) from its bitstream in page-locked host memory.
struct JpegDecodeJob {
  std::vector<const uint8_t*> data;
  std::vector<size_t> sizes;
  std::vector<uint8_t*> out;
  std::vector<int> heights, widths;
};

// Every call throws Error(kState) naming the call when the device reports a failure.
class Device {
 public:
  virtual ~Device() = default;

  // Makes this device current in the calling thread and returns the one that was (DeviceGuard pairs
  // it with restore_current).
  virtual int make_current() = 0;
  // Makes `previous` current again. Never throws: it runs in destructors.
  virtual void restore_current(int previous) noexcept = 0;

  virtual void* alloc(size_t bytes) = 0;  // device memory
  virtual void free(void* p) = 0;
  virtual void pin(void* host, size_t bytes) = 0;  // page-locks host memory for asynchronous copies
  virtual void unpin(void* host) = 0;

  virtual Stream* new_stream() = 0;
  virtual void delete_stream(Stream* s) = 0;
  // The stream the calling thread's work is queued on now (the training loop's: torch's current stream).
  virtual Stream* consumer_stream() = 0;

  virtual Event* new_event() = 0;  // waited on by blocking the host thread, not by spinning
  virtual void delete_event(Event* e) = 0;

  virtual void copy_to_device(void* dst, const void* src, size_t bytes, Stream* s) = 0;
  virtual void launch(const DeviceKernel& k, Stream* s) = 0;
  // Decodes the job's images on s (the bitstreams must stay unchanged until s passes this point).
  virtual void decode_jpegs(const JpegDecodeJob& job, Stream* s) = 0;
  virtual void record(Event* e, Stream* s) = 0;
  virtual void wait(Stream* s, Event* e) = 0;
  virtual void synchronize(Event* e) = 0;
  virtual bool query(Event* e) = 0;  // the event's last record completed (or it was never recorded)
};

// The device current in the calling thread for the guard's life, then the thread's previous one again:
// the loader's entry points run on the program's threads, whose current device they must leave as they
// found it (a torch.empty(device="cuda") after next() must not land on the loader's GPU).
class DeviceGuard {
 public:
  explicit DeviceGuard(Device& d) : d_(d), previous_(d.make_current()) {}
  ~DeviceGuard() { d_.restore_current(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  Device& d_;
  int previous_;
};

// The host version of each kernel, for devices whose memory the host can address (the simulation).
void run_kernel_on_host(const DeviceKernel& k);

}  // namespace fastpipe
