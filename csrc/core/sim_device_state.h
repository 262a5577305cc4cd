// The simulated device's state (sim_device.h): streams (a worker thread each, with random delays),
// events, graph captures and the rules CUDA enforces on them, failure injection, the misuse log. The
// Device interface over it is sim_device.cpp.
#pragma once

#include "core/sim_device.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/gather.h"
#include "core/jpeg_decode.h"
#include "core/jpeg_header.h"
#include "kernels/augment_images.h"

namespace fastpipe {

struct Event {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // records made
  uint64_t completed = 0;  // records a stream reached
  bool captured = false;   // its last record went into a graph being captured, not into a stream's work
};

struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool busy = false;
  bool stop = false;
  bool deleted = false;  // delete_stream() was called: queuing more is a use after free on a GPU
  std::function<void(const std::string&)> misuse;
  std::atomic<int> max_delay_us{0};
  std::mt19937_64 rng;
  std::thread worker;

  void run();

  void push(std::function<void()> op) {
    bool was_deleted;
    {
      std::lock_guard<std::mutex> lk(mu);
      was_deleted = deleted;
      queue.push_back(std::move(op));  // still run: the simulation's memory outlives its streams
    }
    if (was_deleted) misuse("work queued on a deleted stream");
    cv.notify_all();
  }

  void drain() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return queue.empty() && !busy; });
  }
};

namespace sim {
inline thread_local int tl_capture_mode = kCaptureGlobal;
inline thread_local int tl_current_device = 0;
inline thread_local bool tl_stream_worker = false;  // the calling thread runs a stream's queue
// The calls fail() can make fail, by kind (Impl::pass and failing are indexed alike). "reject": the JPEG
// decoder refuses a batch's data (as nvJPEG does an image it finds corrupt), not a device failure;
// "hang": the decode call does not return (a stuck driver call) until release_hangs().
constexpr int kNumFailKinds = 10;
constexpr int kReject = 7;
constexpr int kHang = 8;
constexpr int kAlloc = 9;
constexpr const char* kFailKinds[kNumFailKinds] = {"copy", "launch", "decode", "record", "wait",
                                                   "synchronize", "free", "reject", "hang", "alloc"};
}  // namespace sim

// A graph capture begun on `stream` by the thread `owner` (begin_capture).
struct Capture {
  Stream* stream;
  std::thread::id owner;
  int mode;
  std::string invalidated;  // why, once a call invalidated it
};

struct SimDevice::Impl {
  std::mutex mu;
  // fail(): per kind (sim::kFailKinds), calls still to let through, then calls to fail.
  int pass[sim::kNumFailKinds] = {}, failing[sim::kNumFailKinds] = {};
  int hanging = 0;        // calls stuck in a "hang" now
  std::atomic<int64_t> live_allocations{0};  // alloc() minus free()
  uint64_t released = 0;  // release_hangs() calls so far
  std::condition_variable unhang;

  void maybe_fail(int kind, const char* call) {
    std::unique_lock<std::mutex> lk(mu);
    if (failing[kind] == 0) return;
    if (pass[kind] > 0) {
      --pass[kind];
      return;
    }
    --failing[kind];
    if (kind == sim::kHang) {
      ++hanging;
      const uint64_t generation = released;
      unhang.wait(lk, [&] { return released != generation; });
      --hanging;
      return;
    }
    if (kind == sim::kReject)
      throw Error(ErrorKind::kValue, std::string("simulated device: ") + call +
                                         ": the decoder rejected the batch's data (injected by a test)");
    throw Error(ErrorKind::kState, std::string("simulated device: ") + call + " failed (injected by a test)");
  }

  std::vector<std::unique_ptr<Stream>> streams;
  Stream* consumer = nullptr;
  int max_delay_us = 0;
  uint64_t seed = 0;
  int index = 1;
  std::atomic<images::DecodedLayout> jpeg_layout{images::DecodedLayout::kYccPlanar};
  // What a GPU would not survive (queuing on a deleted stream, ...), for tests to assert there was none.
  std::vector<std::string> misuses;
  // The overflow allocator's pool: blocks by size, reusable as soon as they are back (torch's caching
  // allocator reuses a block at once for the stream it was allocated on).
  std::unordered_map<size_t, std::vector<void*>> pool;
  std::unordered_map<const void*, size_t> pinned;  // page-locked host ranges, by start
  std::vector<std::unique_ptr<Event>> events;       // every event made, freed with the device
  std::vector<Capture> captures;                    // in progress

  Capture* capture_of(Stream* s) {  // with mu held
    for (Capture& c : captures)
      if (c.stream == s) return &c;
    return nullptr;
  }

  bool capturing(Stream* s) {
    std::lock_guard<std::mutex> lk(mu);
    return capture_of(s) != nullptr;
  }

  // A capture the calling thread's call would break: a call that does so fails (and invalidates it).
  void refuse(Capture& c, const std::string& why) {  // with mu held
    if (c.invalidated.empty()) c.invalidated = why;
    misuses.push_back(why);
    throw Error(ErrorKind::kState, "simulated device: " + why + " (cudaErrorStreamCaptureUnsupported)");
  }

  // CUDA's rule for a potentially unsafe call (one that may synchronize: a host wait, an allocation,
  // page-locking): forbidden by the thread's own capture unless the thread is relaxed, and by another
  // thread's global-mode capture while the calling thread is in global mode.
  void unsafe_call(const char* call) {
    if (sim::tl_capture_mode == kCaptureRelaxed) return;
    std::lock_guard<std::mutex> lk(mu);
    for (Capture& c : captures) {
      const bool own = c.owner == std::this_thread::get_id();
      if (own && c.mode != kCaptureRelaxed)
        refuse(c, std::string(call) + " in the thread that is capturing a graph");
      if (!own && c.mode == kCaptureGlobal && sim::tl_capture_mode == kCaptureGlobal)
        refuse(c, std::string(call) + " in another thread, in global capture mode, while a graph is captured");
    }
  }

  // Work that runs now (the host, or a stream not capturing) cannot wait for a node of a graph (CUDA:
  // invalid to synchronize, query or wait for a captured event outside its capture).
  void refuse_captured_event(Event* e, const std::string& who) {
    {
      std::lock_guard<std::mutex> lk(e->mu);
      if (!e->captured) return;
    }
    const std::string why = who + " waited for an event recorded in a graph capture";
    report(why);
    throw Error(ErrorKind::kState, "simulated device: " + why);
  }

  // The loader's copies and kernels go to its own stream, never into a graph being captured (a replay
  // would repeat them into a slot long since reused).
  void loader_work(const char* call, Stream* s) {
    std::lock_guard<std::mutex> lk(mu);
    if (Capture* c = capture_of(s)) refuse(*c, std::string(call) + " queued into a graph being captured");
  }

  bool is_pinned(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lk(mu);
    const auto* c = static_cast<const char*>(p);
    for (const auto& [start, n] : pinned) {
      const auto* s0 = static_cast<const char*>(start);
      if (c >= s0 && c + bytes <= s0 + n) return true;
    }
    return false;
  }

  void report(const std::string& what) {
    std::lock_guard<std::mutex> lk(mu);
    misuses.push_back(what);
  }

  Stream* make_stream() {
    auto s = std::make_unique<Stream>();
    s->misuse = [this](const std::string& what) { report(what); };
    s->max_delay_us = max_delay_us;
    s->rng.seed(seed + streams.size());
    Stream* raw = s.get();
    raw->worker = std::thread([raw] { raw->run(); });
    streams.push_back(std::move(s));
    return raw;
  }
};

}  // namespace fastpipe
