// The device as the pipeline sees it, with each copy and kernel launch a named range: in torch.profiler
// traces (they run in the training loop's thread, inside next()) and in NVTX on CUDA builds. On CUDA
// builds NVTX also receives the engine's own ranges (core/trace.h: the reader threads' reads).
#pragma once

#include <memory>

#include "core/device.h"

namespace fastpipe {

class TracedDevice final : public Device {
 public:
  explicit TracedDevice(std::shared_ptr<Device> inner) : inner_(std::move(inner)) {}

  int make_current() override { return inner_->make_current(); }
  void restore_current(int previous) noexcept override { inner_->restore_current(previous); }
  void* alloc(size_t bytes) override { return inner_->alloc(bytes); }
  void free(void* p) override { inner_->free(p); }
  void pin(void* host, size_t bytes) override { inner_->pin(host, bytes); }
  void unpin(void* host) override { inner_->unpin(host); }
  Stream* new_stream() override { return inner_->new_stream(); }
  void delete_stream(Stream* s) override { inner_->delete_stream(s); }
  Stream* consumer_stream() override { return inner_->consumer_stream(); }
  Event* new_event() override { return inner_->new_event(); }
  void delete_event(Event* e) override { inner_->delete_event(e); }
  void copy_to_device(void* dst, const void* src, size_t bytes, Stream* s) override;
  void launch(const DeviceKernel& k, Stream* s) override;
  images::DecodedLayout decode_jpegs(const JpegDecodeJob& job, Stream* s) override;
  void open_jpeg_decoder() override { inner_->open_jpeg_decoder(); }
  std::string jpeg_decoder() const override { return inner_->jpeg_decoder(); }
  void record(Event* e, Stream* s) override { inner_->record(e, s); }
  void wait(Stream* s, Event* e) override { inner_->wait(s, e); }
  void synchronize(Event* e) override { inner_->synchronize(e); }
  bool query(Event* e) override { return inner_->query(e); }
  bool capturing(Stream* s) override { return inner_->capturing(s); }
  int exchange_capture_mode(int mode) noexcept override { return inner_->exchange_capture_mode(mode); }

 private:
  std::shared_ptr<Device> inner_;
};

}  // namespace fastpipe
