// The device pipeline's fences of the host slots (core/device_pipeline.h): the copy out of host slot s
// records events[s]; a reader thread blocks on it before refilling s.
#pragma once

#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/process.h"

namespace fastpipe {

struct HostFences {
  std::shared_ptr<Device> device;
  pid_t owner_pid;
  std::mutex mu;
  std::vector<Event*> events;
  std::vector<bool> recorded;

  HostFences(std::shared_ptr<Device> d) : device(std::move(d)), owner_pid(current_pid()) {}
  ~HostFences() {
    if (current_pid() != owner_pid) return;  // a forked child must not touch the device
    try {
      for (Event* e : events)
        if (e) device->delete_event(e);
    } catch (const std::exception& e) {
      report_teardown_failure("deleting the loader's host-slot fences", e.what());
    }
  }

  void record(int slot, Stream* s) {
    std::lock_guard<std::mutex> lk(mu);
    if (static_cast<size_t>(slot) >= events.size()) {
      events.resize(slot + 1, nullptr);
      recorded.resize(slot + 1, false);
    }
    if (!events[slot]) events[slot] = device->new_event();
    device->record(events[slot], s);
    recorded[slot] = true;
  }

  void wait(int slot) {
    Event* e = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (static_cast<size_t>(slot) < events.size() && recorded[slot]) e = events[slot];
    }
    if (e) {
      DeviceGuard guard(*device);
      device->synchronize(e);
    }
  }

  void wait_all() {
    std::lock_guard<std::mutex> lk(mu);
    for (size_t s = 0; s < events.size(); ++s)
      if (recorded[s]) device->synchronize(events[s]);
  }
};
}  // namespace fastpipe
