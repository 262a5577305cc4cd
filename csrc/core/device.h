// Streams, events, asynchronous copies, device memory and the batch kernels behind one narrow interface.
// The device pipeline (device_pipeline.h) is written against it; CUDA implements it
// (csrc/ops/cuda_host/cuda_device.cpp) and a CPU simulation (sim_device.h) lets the pipeline's ordering logic
// run, and be tested, on a machine without a GPU.
//
// Semantics are CUDA's: work queued on one stream runs in order; record(e, s) marks the point of s where
// e completes; wait(s, e) makes s wait for the last record of e made before the call, without the host
// waiting; synchronize(e) makes the host wait for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/image_transform.h"
#include "kernels/transforms.h"

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
// decoded whole at staging + k * image_stride in `layout` becomes output image k of `out`; records
// decoded on the host (DecodeOn::kHost) are left alone (their outputs are copied). With `work` (an
// augmented transform) the resized images go to record k's work area (work + k * work_stride) instead.
struct ResampleImagesKernel {
  images::ImageTransformParams params;
  images::DecodedLayout layout = images::DecodedLayout::kYccPlanar;
  const images::ImageDesc* descs = nullptr;
  const uint8_t* staging = nullptr;
  int64_t image_stride = 0;
  void* out = nullptr;
  int64_t count = 0;
  uint8_t* work = nullptr;
  int64_t work_stride = 0;
};

// The augmentations (kernels/augment_images.h) of the records the resample left in their work areas, and
// their outputs.
struct AugmentImagesKernel {
  images::ImageTransformParams params;
  const images::ImageDesc* descs = nullptr;
  uint8_t* work = nullptr;
  int64_t work_stride = 0;
  void* out = nullptr;
  int64_t count = 0;
};

struct DeviceKernel {
  enum class Kind { kWidenTokens, kCropMirrorNormalize, kResampleImages, kAugmentImages } kind;
  WidenTokensKernel widen;
  CropMirrorNormalizeKernel cmn;
  ResampleImagesKernel resample;
  AugmentImagesKernel augment;
};

// JPEG images to decode on the device, each whole from its bitstream in page-locked host memory into
// out[k] (device memory, height * width * 3 bytes): as planes[k] says (DecodedLayout::kYccPlanar), or
// as interleaved RGB where the decoder cannot write planes.
struct JpegDecodeJob {
  std::vector<const uint8_t*> data;
  std::vector<size_t> sizes;
  std::vector<uint8_t*> out;
  std::vector<images::YccPlanes> planes;
};

// How a thread's calls interact with graph captures (CUDA's cudaStreamCaptureMode, same values). Under
// kCaptureGlobal (every thread's default) a call that may synchronize (a host wait, an allocation,
// page-locking) fails, and invalidates the capture, while any thread captures in global mode (torch.cuda.graph's
// default); under kCaptureThreadLocal only the thread's own captures forbid it.
enum CaptureMode : int { kCaptureGlobal = 0, kCaptureThreadLocal = 1, kCaptureRelaxed = 2 };

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
  // Decodes the job's images on s (the bitstreams must stay unchanged until s passes this point);
  // returns the layout it wrote them in. Throws Error(kValue) when the decoder refuses an image's data
  // (nvJPEG finds some JPEGs corrupt that libjpeg decodes; nothing was queued then), Error(kState) when
  // the device fails.
  virtual images::DecodedLayout decode_jpegs(const JpegDecodeJob& job, Stream* s) = 0;
  // Opens the JPEG decoder decode_jpegs uses, once (a pipeline that decodes images calls it when it is
  // made, so that a decoder that cannot work here is an error then, saying why, not at the first batch).
  virtual void open_jpeg_decoder() = 0;
  // The JPEG decoder in use and the layout it writes, decided once for every stream (nvJPEG's backend
  // and planar YCbCr, or interleaved RGB and why); "" before a decoder is opened.
  virtual std::string jpeg_decoder() const { return ""; }
  virtual void record(Event* e, Stream* s) = 0;
  virtual void wait(Stream* s, Event* e) = 0;
  virtual void synchronize(Event* e) = 0;
  virtual bool query(Event* e) = 0;  // the event's last record completed (or it was never recorded)

  // Whether work queued on s now goes into a graph being captured rather than running.
  virtual bool capturing(Stream* s) = 0;
  // Sets the calling thread's CaptureMode; returns the previous one. Never throws: it runs in destructors.
  virtual int exchange_capture_mode(int mode) noexcept = 0;
};

// The device current in the calling thread for the guard's life, then the thread's previous one again:
// the loader's entry points run on the program's threads, whose current device they must leave as they
// found it (a torch.empty(device="cuda") after next() must not land on the loader's GPU). For the same
// span the thread is in kCaptureThreadLocal mode: the loader's host waits (reader threads block on
// fences), allocations and page-locking never touch a stream being captured, so they must not invalidate
// a graph that the training thread captures meanwhile (torch.compile's CUDA graphs, torch.cuda.graph); the
// calling thread's own capture still forbids them. Every device call of the loader runs under one.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device& d)
      : d_(d), previous_(d.make_current()), mode_(d.exchange_capture_mode(kCaptureThreadLocal)) {}
  ~DeviceGuard() {
    d_.exchange_capture_mode(mode_);
    d_.restore_current(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  Device& d_;
  int previous_;
  int mode_;
};

// The loader's teardown waits for its copies before it frees their memory; in the thread that is
// capturing a graph (the loader dropped inside a capture) a host wait would invalidate the capture: it
// throws instead, so that the teardown reports it and leaves that memory allocated.
inline void refuse_teardown_in_capture(Device& d) {
  if (d.capturing(d.consumer_stream()))
    throw Error(ErrorKind::kState, "the loader was closed while the current stream captures a graph");
}

// The host version of each kernel, for devices whose memory the host can address (the simulation).
void run_kernel_on_host(const DeviceKernel& k);

}  // namespace fastpipe
