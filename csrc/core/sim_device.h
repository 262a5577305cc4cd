// A CPU simulation of a device (device.h), for tests: each stream is a worker thread that runs its queue
// in order, sleeping a random delay (up to max_delay_us) before every operation, so that work queued on
// different streams interleaves differently from run to run; an event completes when its stream reaches
// it. Memory is host memory. The consumer stream stands for the training loop's: tests queue work on it
// (enqueue) to play a slow model that reads a batch long after the Python code dropped it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"

namespace fastpipe {

class SimDevice : public Device {
 public:
  // `index`: the device number it plays; each thread's current device starts at 0 (as CUDA's does).
  SimDevice(int max_delay_us, uint64_t seed, int index = 1);
  ~SimDevice() override;  // drains every stream

  int make_current() override;
  void restore_current(int previous) noexcept override;
  static int current_device();  // the calling thread's
  void* alloc(size_t bytes) override;
  void free(void* p) override;
  void pin(void* host, size_t bytes) override;  // remembered: copies check their source is page-locked
  void unpin(void* host) override;
  Stream* new_stream() override;
  void delete_stream(Stream* s) override;
  Stream* consumer_stream() override;
  Event* new_event() override;
  void delete_event(Event* e) override;
  void copy_to_device(void* dst, const void* src, size_t bytes, Stream* s) override;
  void launch(const DeviceKernel& k, Stream* s) override;
  // libjpeg, whole images, into planes (libjpeg's raw output) or, after set_jpeg_layout, interleaved RGB.
  images::DecodedLayout decode_jpegs(const JpegDecodeJob& job, Stream* s) override;
  void open_jpeg_decoder() override {}  // libjpeg, a decoder per call
  std::string jpeg_decoder() const override;
  void record(Event* e, Stream* s) override;
  void wait(Stream* s, Event* e) override;
  void synchronize(Event* e) override;
  bool query(Event* e) override;
  bool capturing(Stream* s) override;
  int exchange_capture_mode(int mode) noexcept override;

  // A graph capture on s by the calling thread (CaptureMode), as torch.cuda.graph begins one: until
  // end_capture, work queued on s is not run, an event recorded on it completes with nothing that runs,
  // and the calls CUDA forbids during a capture fail and invalidate it. end_capture returns why the
  // capture was invalidated ("" when it is valid).
  void begin_capture(Stream* s, int mode);
  std::string end_capture(Stream* s);

  // Queues fn on s (runs in the stream's worker, after the stream's earlier work and a random delay).
  void enqueue(Stream* s, std::function<void()> fn);
  // Waits until every stream has run everything queued before the call.
  void drain();
  void set_max_delay_us(int us);
  // The layout decode_jpegs writes: a GPU decoder that cannot write planes writes interleaved RGB.
  void set_jpeg_layout(images::DecodedLayout layout);
  // The overflow allocator's model of torch's caching allocator: a block given back is handed out again
  // at once, whatever streams still read it, unless the caller waits for them (stream-ordered frees).
  void* pool_alloc(size_t bytes);
  void pool_free(void* p, size_t bytes);
  // What the program did that a GPU would not survive (work queued on a deleted stream, ...).
  std::vector<std::string> misuses() const;
  // Test hook: the next `count` calls of `what` (copy, launch, decode, record, wait, synchronize, free, alloc)
  // fail as a device reports a failure (Error kState naming the call), or for "reject" the decode calls
  // refuse their batch's data as a decoder refuses a corrupt image (Error kValue), or for "hang" the
  // decode calls do not return (a stuck driver call) until release_hangs(), after the first `after` of
  // them succeed.
  void fail(const std::string& what, int count, int after);
  void release_hangs();  // also at destruction
  int hanging() const;   // decode calls stuck in a "hang" now
  int64_t live_allocations() const;  // alloc() calls not yet freed

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastpipe
