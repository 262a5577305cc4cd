// The device data path. A BatchReader fills page-locked host slots with records as they are; each batch
// is copied into a fixed device arena (prefetch + 2 slots, allocated once) on one copy stream, converted
// there (token windows widened to int64, images through CropMirrorNormalize, JPEGs decoded and
// resampled) and marked by an event; the consumer's stream waits on that event, the host never does.
// Where images are decoded on the device, a thread of the pipeline's own queues each batch's work (the
// decoder parses the bitstreams on the host in its call), so that next() only hands batches out, and a
// batch's decode and resample run on one of two lanes (a stream each, after the batch's copies), so
// that one batch decodes while the other resamples. Batches are issued ahead of the one handed
// out, so that the copy of batch k+1 overlaps the model's work on batch k while the readers fill k+2.
//
// Reuse is stream-ordered: dropping a batch's last tensor records a release event on every stream it was
// used on (the consumer's at next(), and those added by used_on: fastpipe.record_stream), and the copy
// stream waits on them before writing the slot again; a host slot is refilled only after the copy out of
// it completed (its reader thread blocks on the copy's event).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/batch_reader.h"
#include "core/device.h"
#include "core/serial_worker.h"

namespace fastpipe {

// Memory outside the arena for a batch when every device slot is held by the consumer: `data` stays
// valid while `keep` lives (the caller's allocator frees it after the consumer is done with it).
struct OverflowBuffer {
  char* data = nullptr;
  std::shared_ptr<void> keep;
};
using OverflowFn = std::function<OverflowBuffer(int64_t bytes, Stream* copy_stream)>;

// The device pipeline's counters, under the names Loader.stats() gives them (after the reader's, whose
// overflow_batches this one's replaces). X(type, name).
#define FASTPIPE_DEVICE_STATS(X)                                                                                   \
  X(int64_t, device_arena_bytes)                                                                                   \
  X(int, device_slots)                                                                                             \
  X(int, device_slots_leased)                                                                                      \
  X(int64_t, overflow_batches)                                                                                     \
  X(int64_t, images_decoded_on_device)     /* image_decode="device": records decoded on the device */              \
  X(int64_t, images_decoded_on_host)       /* ... and those the reader threads decoded instead */                  \
  X(int64_t, images_decoded_planar)        /* ... of those on the device, into planes (the host's colours) */      \
  X(int64_t, images_decoded_after_refusal) /* ... of those, in batches the decoder refused: by libjpeg */           \
  X(std::optional<std::string>, jpeg_decoder) /* Device::jpeg_decoder(): the decoder and its layout */

struct DeviceStats {
#define FASTPIPE_FIELD(type, name) type name{};
  FASTPIPE_DEVICE_STATS(FASTPIPE_FIELD)
#undef FASTPIPE_FIELD
};

struct PipelineState;

// A batch on the device. Destroying the last reference releases its slot (stream-ordered).
class DeviceBatch {
 public:
  DeviceBatch(std::shared_ptr<PipelineState> state, int slot, char* base, int64_t records, Stream* consumer,
              std::shared_ptr<void> overflow);
  ~DeviceBatch();
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;
  char* data(int output) const;
  char* base() const { return base_; }  // the batch's memory: a slot, or the overflow buffer
  int64_t records() const { return records_; }
  bool overflow() const { return slot_ < 0; }
  const std::shared_ptr<void>& overflow_buffer() const { return overflow_; }
  // The batch is also used on `s`: its release waits for the work queued there too.
  void used_on(Stream* s);

 private:
  std::shared_ptr<PipelineState> state_;
  int slot_;  // -1: an overflow batch
  char* base_;
  int64_t records_;
  std::vector<Stream*> streams_;
  std::shared_ptr<void> overflow_;
};

class DevicePipeline {
 public:
  // Reads `columns` with a BatchReader configured by `options` (to which this adds raw outputs, the
  // index output, page-locking and the fill fences) and converts each on the device as its spec says:
  // token windows widened, images transformed, other records copied. `overflow` may be null: then a
  // next() that finds every device slot held by the consumer raises at once.
  DevicePipeline(std::shared_ptr<Device> device, std::vector<ColumnSpec> columns, ReaderOptions options,
                 OverflowFn overflow);
  ~DevicePipeline();
  DevicePipeline(const DevicePipeline&) = delete;
  DevicePipeline& operator=(const DevicePipeline&) = delete;

  BatchReader& reader() { return *reader_; }
  // A new pass. Waits (as next() does) for the submitter to queue the abandoned pass's work.
  void start(std::vector<int64_t> indices, bool drop_last, uint64_t epoch, double timeout_s,
             const std::function<void()>& poll);
  // The next batch, ready on the consumer's stream when it returns (nullptr at the pass's end).
  std::shared_ptr<DeviceBatch> next(double timeout_s, const std::function<void()>& poll);
  // Waits for the copies in flight and stops the reader. Batches handed out stay valid. A device failure
  // here is reported once (report_teardown_failure), not thrown; what poll throws is. The submitter is
  // waited for up to timeout_s (> 0; kStuckGraceSeconds if a wait for it already failed), polling, then
  // left running (reported).
  void close(double timeout_s, const std::function<void()>& poll);
  static constexpr double kStuckGraceSeconds = 0.2;

  // Device outputs: per column one (copies and transforms) or two (token windows: x, y).
  const std::vector<OutputLayout>& outputs() const;
  int64_t slot_bytes() const;
  DeviceStats stats() const;
  Device& device() { return *device_; }

  // Test hook: release without a fence (the canary that proves the race test can fail).
  void set_skip_release_fence(bool on);

 private:
  bool issue(bool block, double timeout_s, const std::function<void()>& poll);
  // Runs a wait for the submitter; one that raises (a timeout, an interrupt) marks it as maybe stuck.
  void wait_for_submitter(const std::function<void()>& wait);
  std::shared_ptr<Device> device_;
  std::shared_ptr<PipelineState> state_;
  std::unique_ptr<BatchReader> reader_;
  std::unique_ptr<SerialWorker> submitter_;  // image pipelines: queues each batch's device work
  bool submitter_missed_ = false;            // a wait for it ran out or was interrupted
};

}  // namespace fastpipe
