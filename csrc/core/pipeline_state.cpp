#include "core/pipeline_state.h"

#include "core/error.h"
#include "core/process.h"

namespace fastpipe {

PipelineState::~PipelineState() {
  if (current_pid() != owner_pid || !device) return;  // a forked child must not touch the device
  try {
    teardown();
  } catch (const std::exception& e) {
    report_teardown_failure("releasing the loader's device arena", e.what());
  }
}

void PipelineState::teardown() {
  DeviceGuard guard(*device);
  refuse_teardown_in_capture(*device);
  // Batches issued and never taken go first: an overflow one's memory is freed after the copy stream's
  // work (it is recorded on it), so the stream must still exist then.
  issued.clear();
  {
    std::lock_guard<std::mutex> lk(mu);
    finish_releases();
    if (releasing)  // what a graph still being captured may use cannot be freed: leaked (reported)
      throw Error(ErrorKind::kState, "a batch was dropped during a graph capture that has not ended");
  }
  for (DeviceSlot& s : slots) {  // every copy and every use of the arena finished before it goes
    if (s.ready) device->synchronize(s.ready);
    for (size_t k = 0; k < s.released; ++k) device->synchronize(s.release[k]);
  }
  for (DeviceSlot& s : slots) {
    if (s.ready) device->delete_event(s.ready);
    for (Event* e : s.release) device->delete_event(e);
  }
  if (overflow_ready) {
    device->synchronize(overflow_ready);
    device->delete_event(overflow_ready);
  }
  if (overflow_alloc) device->delete_event(overflow_alloc);
  if (lanes) lanes->teardown();
  if (arena) device->free(arena);
  if (copy) device->delete_stream(copy);
}

// A dropped batch's slot is reused after the work queued so far on every stream it was used on: an
// event per stream, which the copy into the slot waits for. A stream capturing a graph cannot take one
// (it would be a node of the graph, which nothing that runs completes): the slot waits, kReleasing,
// until the capture is over (as torch's caching allocator defers a block freed during a capture).
// With mu held.
void PipelineState::release_slot(DeviceSlot& s, const std::vector<Stream*>& streams) {
  if (!skip_release_fence) {
    for (Stream* stream : streams) {
      if (!device->capturing(stream)) continue;
      if (s.state != DeviceSlot::State::kReleasing) ++releasing;
      s.state = DeviceSlot::State::kReleasing;
      s.releasing = streams;
      return;
    }
  }
  s.released = 0;
  if (!skip_release_fence) {
    for (Stream* stream : streams) {
      if (s.released == s.release.size()) s.release.push_back(device->new_event());
      device->record(s.release[s.released++], stream);
    }
  }
  if (s.state == DeviceSlot::State::kReleasing) --releasing;
  s.releasing.clear();
  s.state = DeviceSlot::State::kFree;
}

// The releases deferred by a capture that has ended since. With mu held.
void PipelineState::finish_releases() {
  for (DeviceSlot& s : slots) {
    if (!releasing) return;
    if (s.state == DeviceSlot::State::kReleasing) release_slot(s, std::vector<Stream*>(s.releasing));
  }
}

}  // namespace fastpipe
