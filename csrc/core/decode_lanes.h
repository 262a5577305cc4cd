// The device pipeline's JPEG decode (core/device_pipeline.h): lanes, each a stream, a decoder state (the
// device keeps one per stream) and a buffer of decoded images, used in turn, so that one batch decodes
// while the other is resampled (and augmented); and libjpeg for a batch the device's decoder refuses. Used by the
// pipeline's submitter thread only; the counters are read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/device.h"
#include "core/file.h"
#include "core/jpeg_decode.h"

namespace fastpipe {

class DecodeLanes {
 public:
  // A lane's decode and resample run on its stream, in order after the lane's previous batch (which read
  // its buffer last); the resample waits for the batch's copies on the copy stream (`copied`).
  struct Lane {
    Stream* stream = nullptr;
    uint8_t* decoded = nullptr;  // image k of a batch at k * stride()
    uint8_t* work = nullptr;     // augmented transforms: record k's work area at k * work_stride()
    Event* copied = nullptr;     // the copy stream after the batch's copies
    Event* done = nullptr;       // the lane after a batch, where the copy stream must follow it
  };

  // `lanes` lanes for batches of batch_size images of up to `stride` bytes decoded, and of work_stride
  // bytes of augmentation work each (0: none) (with a DeviceGuard).
  DecodeLanes(Device& device, int lanes, int64_t stride, int64_t batch_size, int64_t work_stride);
  // Waits for the lanes' work and frees them (with a DeviceGuard; at the pipeline's teardown).
  void teardown();

  int64_t stride() const { return stride_; }
  int64_t work_stride() const { return work_stride_; }
  Lane& next() { return lanes_[next_++ % lanes_.size()]; }
  // `copy` waits for the lane's work so far (or every lane's).
  void follow(Lane& lane, Stream* copy);
  void follow_all(Stream* copy);

  // A batch of `records` records (descs and encoded bytes, encoded_budget apart, in page-locked host
  // memory; samples[k]: record k's sample): those the reader left to the device decoded on the lane into
  // its buffer (decode), those the reader decoded itself copied from host_out to out (out_bytes each) on
  // `copy`. Returns the decoded layout.
  images::DecodedLayout decode_batch(const images::ImageDesc* descs, const uint8_t* encoded, int64_t encoded_budget,
                                     const char* host_out, char* out, int64_t out_bytes, const int64_t* samples,
                                     int64_t records, Stream* copy, Lane& lane);
  // Decodes `job` (into lane's buffer) on the lane: on the device, or, for a batch its decoder refuses as
  // corrupt (nvJPEG finds some JPEGs corrupt that libjpeg decodes), by libjpeg into planes copied where
  // the device would have put them; an image libjpeg cannot decode either fails the batch naming its
  // sample (samples[k]: image k's). Returns the layout written.
  images::DecodedLayout decode(const JpegDecodeJob& job, const std::vector<int64_t>& samples, Lane& lane);

  // Queues, on the lane, the resample of a batch of n records (descs, device memory) decoded into its
  // buffer into `out`, by `transform`; with augmentations, the resample into the lane's work areas and the
  // augmentation kernel after it.
  void resample(const images::ImageTransformParams& transform, images::DecodedLayout layout,
                const images::ImageDesc* descs, void* out, int64_t n, Lane& lane);

  int64_t on_device() const { return on_device_.load(); }  // records decoded on the device
  int64_t on_host() const { return on_host_.load(); }      // ... and by the reader threads instead
  int64_t planar() const { return planar_.load(); }               // images decoded into planes
  int64_t after_refusal() const { return after_refusal_.load(); }  // ... of them, by libjpeg

 private:
  void decode_refused(const JpegDecodeJob& job, const std::vector<int64_t>& samples, const char* why, Stream* on);

  Device& device_;
  std::vector<Lane> lanes_;
  uint64_t next_ = 0;
  int64_t stride_, batch_size_, work_stride_;
  std::atomic<int64_t> on_device_{0}, on_host_{0}, planar_{0}, after_refusal_{0};
  // decode_refused's page-locked planes, the event after their copies, and the decoder: made at the first
  // refusal.
  std::unique_ptr<AlignedBuffer> refused_planes_;
  Event* refused_copied_ = nullptr;
  std::unique_ptr<JpegDecoder> refused_decoder_;
};

}  // namespace fastpipe
