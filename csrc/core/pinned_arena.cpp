#include "core/pinned_arena.h"

#include <chrono>
#include <thread>

#include "core/error.h"
#include "core/process.h"

namespace fastpipe {

void pin_reader_arena(ReaderOptions& opt, std::shared_ptr<Device> device, std::function<void()> wait_all,
                      const char* what) {
  opt.on_arena_alloc = [device](void* p, size_t n) {
    DeviceGuard guard(*device);
    device->pin(p, n);
  };
  opt.on_arena_free = [device, wait_all = std::move(wait_all), what, owner = current_pid()](void* p, size_t) {
    if (current_pid() != owner) return true;
    try {
      DeviceGuard guard(*device);
      refuse_teardown_in_capture(*device);
      wait_all();
      device->unpin(p);
      return true;
    } catch (const std::exception& e) {
      report_teardown_failure(what, e.what());
      return false;
    }
  };
}

PinnedArena::PinnedArena(std::shared_ptr<Device> device) : device_(std::move(device)), owner_(current_pid()) {}

PinnedArena::~PinnedArena() {
  if (current_pid() != owner_) return;
  try {
    for (auto& slot : events_)
      for (Event* e : slot) device_->delete_event(e);
  } catch (const std::exception& e) {
    report_teardown_failure("deleting the pinned arena's events", e.what());
  }
}

void PinnedArena::install(ReaderOptions& opt, const std::shared_ptr<PinnedArena>& self) {
  pin_reader_arena(opt, device_, [self] { self->wait_all(); }, "unpinning the loader's arena");
  opt.on_slot_release = [self](int slot) { self->released(slot); };
  opt.before_slot_fill = [self](int slot) { self->before_fill(slot); };
}

void PinnedArena::used_on(int slot, Stream* s) {
  std::lock_guard<std::mutex> lk(mu_);
  grow(slot);
  extra_[slot].push_back(s);
}

void PinnedArena::grow(int slot) {
  if (static_cast<size_t>(slot) < events_.size()) return;
  events_.resize(slot + 1);
  extra_.resize(slot + 1);
  recorded_.resize(slot + 1, 0);
  releasing_.resize(slot + 1);
}

// With mu_ held.
void PinnedArena::fence(int slot, const std::vector<Stream*>& streams) {
  auto& events = events_[slot];
  while (events.size() < streams.size()) events.push_back(device_->new_event());
  for (size_t k = 0; k < streams.size(); ++k) device_->record(events[k], streams[k]);
  recorded_[slot] = streams.size();
}

// Fences a release deferred by a graph capture; false while a stream still captures. With mu_ held.
bool PinnedArena::finish_release(int slot) {
  if (releasing_[slot].empty()) return true;
  for (Stream* s : releasing_[slot])
    if (device_->capturing(s)) return false;
  fence(slot, releasing_[slot]);
  releasing_[slot].clear();
  return true;
}

// From a batch's last reference going (a destructor): a device failure is reported, never thrown.
void PinnedArena::released(int slot) {
  if (current_pid() != owner_) return;
  try {
    DeviceGuard guard(*device_);
    std::lock_guard<std::mutex> lk(mu_);
    grow(slot);
    std::vector<Stream*> streams{device_->consumer_stream()};
    streams.insert(streams.end(), extra_[slot].begin(), extra_[slot].end());
    extra_[slot].clear();
    recorded_[slot] = 0;
    releasing_[slot] = std::move(streams);
    finish_release(slot);
  } catch (const std::exception& e) {
    report_teardown_failure("fencing a pinned batch's release", e.what());
  }
}

void PinnedArena::before_fill(int slot) {
  std::unique_lock<std::mutex> lk(mu_);
  grow(slot);
  if (recorded_[slot] == 0 && releasing_[slot].empty()) return;
  lk.unlock();
  DeviceGuard guard(*device_);
  lk.lock();
  while (!finish_release(slot)) {  // a capture's end is signalled nowhere: look again every millisecond
    lk.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    lk.lock();
  }
  const std::vector<Event*> wait(events_[slot].begin(), events_[slot].begin() + static_cast<long>(recorded_[slot]));
  lk.unlock();
  for (Event* e : wait) device_->synchronize(e);
}

void PinnedArena::wait_all() {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t s = 0; s < events_.size(); ++s) {
    if (!finish_release(static_cast<int>(s)))  // the arena is then leaked, not unpinned under the graph
      throw Error(ErrorKind::kState, "a pinned batch was dropped during a graph capture that has not ended");
    for (size_t k = 0; k < recorded_[s]; ++k) device_->synchronize(events_[s][k]);
  }
}

}  // namespace fastpipe
