// The device pipeline's shared state (device_pipeline.h): the plans by which columns become device
// outputs, the device slots and their release fences, and what the submitter thread queues per batch
// (device_enqueue.cpp); the pipeline itself is device_pipeline.cpp.
#pragma once

#include <unistd.h>

#include <atomic>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "core/decode_lanes.h"
#include "core/device_pipeline.h"
#include "core/host_fences.h"
#include "kernels/augment_images.h"

namespace fastpipe {
namespace pipeline {

enum class Conversion { kCopy, kWidenTokens, kCropMirrorNormalize, kDecodeImages };

// How column k's host records become device outputs.
struct Plan {
  Conversion kind = Conversion::kCopy;
  int host_output = 0;
  int64_t host_record_bytes = 0;
  int64_t staging = 0;  // device offset of the raw records, when they are converted
  int first_output = 0;
  int token_bytes = 0;
  bool token_signed = false;
  std::shared_ptr<const transforms::CropMirrorNormalizeParams> cmn;
  std::shared_ptr<const ImageColumnSpec> image;  // kDecodeImages: host outputs desc, encoded, host-decoded
};

struct Issued {
  int slot;  // -1: overflow
  char* base;
  int64_t records;
  Event* ready;
  std::shared_ptr<void> overflow;
  std::exception_ptr error;  // the device refused its copies or kernels: next() raises this at its turn
  std::shared_ptr<SerialWorker::Ticket> submission;  // queued by the submitter thread (null: by issue())
};

// A batch whose device work the submitter thread queues: it holds the host batch (its slot is not
// refilled) until the copy out of it is fenced.
struct Job {
  std::shared_ptr<Lease> lease;
  char* base;
  Event* ready;
  int slot;
};

}  // namespace pipeline

struct DeviceSlot {
  // kReleasing: its batch was dropped while a stream it was used on was capturing a graph; the release
  // fences are recorded once the capture is over.
  enum class State { kFree, kIssued, kLeased, kReleasing } state = State::kFree;
  Event* ready = nullptr;
  std::vector<Event*> release;  // per stream the last batch in it was used on
  size_t released = 0;          // entries of `release` its last batch recorded
  std::vector<Stream*> releasing;  // kReleasing: the streams to fence
};

struct PipelineState {
  std::shared_ptr<Device> device;
  std::shared_ptr<HostFences> fences;
  pid_t owner_pid = 0;
  Stream* copy = nullptr;
  char* arena = nullptr;
  int64_t slot_bytes = 0;
  int64_t batch_size = 0;
  std::vector<OutputLayout> outputs;
  std::vector<pipeline::Plan> plans;
  int64_t index_offset = -1;  // of the device copy of the sample indices, when a transform needs them
  std::unique_ptr<DecodeLanes> lanes;  // where images are decoded on the device
  Event* overflow_ready = nullptr;
  Event* overflow_alloc = nullptr;  // the consumer's stream when an overflow buffer was allocated
  OverflowFn overflow;
  std::atomic<bool> skip_release_fence{false};

  std::mutex mu;  // slots, issued, stats: batches are released from any thread
  std::vector<DeviceSlot> slots;
  std::deque<pipeline::Issued> issued;
  int leased = 0;
  int releasing = 0;  // slots kReleasing
  int64_t overflow_batches = 0;

  ~PipelineState();
  void teardown();
  // A dropped batch's slot is reused after the work queued so far on every stream it was used on: an
  // event per stream, which the copy into the slot waits for. A stream capturing a graph cannot take one
  // (it would be a node of the graph, which nothing that runs completes): the slot waits, kReleasing,
  // until the capture is over (as torch's caching allocator defers a block freed during a capture).
  // With mu held.
  void release_slot(DeviceSlot& s, const std::vector<Stream*>& streams);
  // The releases deferred by a capture that has ended since. With mu held.
  void finish_releases();
  // Queues batch `lease`'s copies and conversions into `base`, then `ready`: on the copy stream, and a
  // batch with images to decode also on a lane (its decode and resample; `ready` there, after the copies).
  // An overflow batch's lane work is followed by the copy stream, whose order its memory's free follows.
  void enqueue(const Lease& lease, char* base, Event* ready, bool overflow);
  // Plan p's kernel for batch `lease` in `base`, if it has one: on the copy stream, the resample on `lane`.
  void launch_kernel(const pipeline::Plan& p, const Lease& lease, char* base, const std::vector<images::DecodedLayout>& layouts, DecodeLanes::Lane* lane);
  // A batch's images: those the reader left to the device decoded on `lane`, the others' outputs copied.
  images::DecodedLayout enqueue_decode(const pipeline::Plan& p, const Lease& lease, char* base, DecodeLanes::Lane& lane);
  // A job's work on the copy stream and its lane (the submitter thread). A failure fences the host slot
  // after whatever was queued from it (as issue() does for work it queues itself), frees the device
  // slot, and is raised at the batch's turn.
  void run(const pipeline::Job& job);
};

}  // namespace fastpipe
