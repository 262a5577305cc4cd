// The page-locked arena of a CPU loader with pin_memory=True, and the fences that keep its slots from
// being refilled under the asynchronous copies that read them.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/batch_reader.h"
#include "core/device.h"

namespace fastpipe {

// Makes the reader page-lock its arena on `device`, and at the reader's end unpin it once `wait_all`
// returned (no copy out of it still in flight). When those copies cannot be waited for (a failed device,
// or a graph capture in the closing thread) that is reported once and the arena is leaked rather than
// freed under them. A forked child leaves the device alone. `what` names the arena in the report.
void pin_reader_arena(ReaderOptions& opt, std::shared_ptr<Device> device, std::function<void()> wait_all,
                      const char* what);

// pin_memory=True: the arena page-locked, so that batch.to("cuda", non_blocking=True) is a true
// asynchronous copy. A pinned batch may still be the source of such a copy when the program drops it:
// its release records an event on the pin device's current stream and on every stream record_stream
// named for it, and the reader waits for those before writing into the slot again; the arena is
// unpinned only after all of them completed. A batch dropped while one of those streams captures a graph
// is fenced once the capture is over (an event recorded into the graph is completed by nothing that
// runs): its slot's reader waits for that. A forked child never touches the device.
class PinnedArena {
 public:
  explicit PinnedArena(std::shared_ptr<Device> device);
  ~PinnedArena();

  // Makes the reader page-lock its arena on `self`'s device and fence its slots' releases.
  void install(ReaderOptions& opt, const std::shared_ptr<PinnedArena>& self);
  // record_stream: the batch in `slot` is also used on s.
  void used_on(int slot, Stream* s);

 private:
  void grow(int slot);
  void fence(int slot, const std::vector<Stream*>& streams);
  bool finish_release(int slot);
  void released(int slot);
  void before_fill(int slot);
  void wait_all();

  std::shared_ptr<Device> device_;
  pid_t owner_;
  std::mutex mu_;
  std::vector<std::vector<Event*>> events_;      // per slot: one per stream of its last release
  std::vector<std::vector<Stream*>> extra_;      // per slot: streams record_stream named for its batch
  std::vector<size_t> recorded_;                 // per slot: events its last release recorded
  std::vector<std::vector<Stream*>> releasing_;  // per slot: streams to fence once no capture is on
};

}  // namespace fastpipe
