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

namespace {
thread_local int tl_capture_mode = kCaptureGlobal;
thread_local int tl_current_device = 0;
thread_local bool tl_stream_worker = false;  // the calling thread runs a stream's queue
// The calls fail() can make fail, by kind (Impl::pass and failing are indexed alike). "reject": the JPEG
// decoder refuses a batch's data (as nvJPEG does an image it finds corrupt), not a device failure;
// "hang": the decode call does not return (a stuck driver call) until release_hangs().
constexpr int kNumFailKinds = 10;
constexpr int kReject = 7;
constexpr int kHang = 8;
constexpr int kAlloc = 9;
constexpr const char* kFailKinds[kNumFailKinds] = {"copy", "launch", "decode", "record", "wait",
                                                   "synchronize", "free", "reject", "hang", "alloc"};
}  // namespace

// A graph capture begun on `stream` by the thread `owner` (begin_capture).
struct Capture {
  Stream* stream;
  std::thread::id owner;
  int mode;
  std::string invalidated;  // why, once a call invalidated it
};

struct SimDevice::Impl {
  std::mutex mu;
  // fail(): per kind (kFailKinds), calls still to let through, then calls to fail.
  int pass[kNumFailKinds] = {}, failing[kNumFailKinds] = {};
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
    if (kind == kHang) {
      ++hanging;
      const uint64_t generation = released;
      unhang.wait(lk, [&] { return released != generation; });
      --hanging;
      return;
    }
    if (kind == kReject)
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
    if (tl_capture_mode == kCaptureRelaxed) return;
    std::lock_guard<std::mutex> lk(mu);
    for (Capture& c : captures) {
      const bool own = c.owner == std::this_thread::get_id();
      if (own && c.mode != kCaptureRelaxed)
        refuse(c, std::string(call) + " in the thread that is capturing a graph");
      if (!own && c.mode == kCaptureGlobal && tl_capture_mode == kCaptureGlobal)
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


void Stream::run() {
  tl_stream_worker = true;
  std::unique_lock<std::mutex> lk(mu);
  for (;;) {
    cv.wait(lk, [&] { return stop || !queue.empty(); });
    if (queue.empty()) return;  // stopped and drained
    std::function<void()> op = std::move(queue.front());
    queue.pop_front();
    busy = true;
    const int max_us = max_delay_us.load();
    const int delay = max_us > 0 ? static_cast<int>(rng() % static_cast<uint64_t>(max_us + 1)) : 0;
    lk.unlock();
    if (delay) std::this_thread::sleep_for(std::chrono::microseconds(delay));
    op();
    op = nullptr;  // its captures may need other locks to go (a tensor's Python object, the GIL): not ours
    lk.lock();
    busy = false;
    cv.notify_all();
  }
}


SimDevice::SimDevice(int max_delay_us, uint64_t seed, int index) : impl_(std::make_unique<Impl>()) {
  impl_->max_delay_us = max_delay_us;
  impl_->seed = seed;
  impl_->index = index;
  impl_->consumer = impl_->make_stream();
}

SimDevice::~SimDevice() {
  release_hangs();
  for (auto& s : impl_->streams) {
    {
      std::lock_guard<std::mutex> lk(s->mu);
      s->stop = true;
    }
    s->cv.notify_all();
  }
  for (auto& s : impl_->streams) s->worker.join();
  for (auto& [bytes, blocks] : impl_->pool)  // after the streams: their queued frees return blocks here
    for (void* p : blocks) std::free(p);
}

int SimDevice::make_current() {
  const int previous = tl_current_device;
  tl_current_device = impl_->index;
  return previous;
}

void SimDevice::restore_current(int previous) noexcept { tl_current_device = previous; }

int SimDevice::current_device() { return tl_current_device; }

void* SimDevice::alloc(size_t bytes) {
  impl_->unsafe_call("alloc");
  impl_->maybe_fail(kAlloc, "alloc");
  void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (!p) throw Error(ErrorKind::kState, "simulated device: out of memory for " + std::to_string(bytes) + " bytes");
  ++impl_->live_allocations;
  return p;
}

int64_t SimDevice::live_allocations() const { return impl_->live_allocations.load(); }

void SimDevice::free(void* p) {
  impl_->maybe_fail(6, "free");
  if (!tl_stream_worker) impl_->unsafe_call("free");  // a stream's own free is stream-ordered
  // As cudaFree, which waits for the device's work: nothing queued may still write there. Called from a
  // stream's own work (a stream-ordered free, as cudaFreeAsync) it is ordered already.
  if (!tl_stream_worker) drain();
  std::free(p);
  --impl_->live_allocations;
}

Stream* SimDevice::new_stream() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->make_stream();
}

void SimDevice::delete_stream(Stream* s) {
  s->drain();  // the thread is joined with the device (streams are few); the stream is dead from here
  std::lock_guard<std::mutex> lk(s->mu);
  s->deleted = true;
}

void* SimDevice::pool_alloc(size_t bytes) {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    auto it = impl_->pool.find(bytes);
    if (it != impl_->pool.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return p;
    }
  }
  return alloc(bytes);
}

void SimDevice::pool_free(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->pool[bytes].push_back(p);
}

std::vector<std::string> SimDevice::misuses() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->misuses;
}

Stream* SimDevice::consumer_stream() { return impl_->consumer; }

Event* SimDevice::new_event() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->events.push_back(std::make_unique<Event>());
  return impl_->events.back().get();
}

// As cudaEventDestroy, which may be called while records of the event are queued: the event lives on
// (until the device goes) for the streams that still reach it.
void SimDevice::delete_event(Event*) {}

void SimDevice::pin(void* host, size_t bytes) {
  impl_->unsafe_call("pin");
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->pinned[host] = bytes;
}

void SimDevice::unpin(void* host) {
  impl_->unsafe_call("unpin");
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->pinned.erase(host);
}

void SimDevice::copy_to_device(void* dst, const void* src, size_t bytes, Stream* s) {
  impl_->maybe_fail(0, "copy_to_device");
  impl_->loader_work("copy_to_device", s);
  Impl* impl = impl_.get();
  s->push([=] {
    // An asynchronous copy reads its source when the stream gets there: by then it must still be
    // page-locked (unpinned memory may be gone: the copy is skipped and reported).
    if (!impl->is_pinned(src, bytes)) {
      impl->report("a copy read host memory that is no longer page-locked (unpinned or freed)");
      return;
    }
    std::memcpy(dst, src, bytes);
  });
}

void SimDevice::launch(const DeviceKernel& k, Stream* s) {
  impl_->maybe_fail(1, "launch");
  impl_->loader_work("launch", s);
  s->push([k] { run_kernel_on_host(k); });
}

images::DecodedLayout SimDevice::decode_jpegs(const JpegDecodeJob& job, Stream* s) {
  impl_->maybe_fail(kHang, "decode_jpegs");
  impl_->maybe_fail(2, "decode_jpegs");
  impl_->maybe_fail(kReject, "decode_jpegs");
  impl_->loader_work("decode_jpegs", s);
  // Decoded now with libjpeg, as a device's decoder parses and checks on the host in the call, and
  // written to the device memory in stream order (the staging it fills may still be read by work queued
  // before). Planes are libjpeg's raw output, as nvJPEG's planar output; RGB its full decode.
  const images::DecodedLayout layout = impl_->jpeg_layout.load();
  auto decoded = std::make_shared<std::vector<std::vector<uint8_t>>>(job.data.size());
  JpegDecoder decoder;
  for (size_t k = 0; k < job.data.size(); ++k) {
    const images::YccPlanes& p = job.planes[k];
    JpegInfo info;
    std::string why;
    if (read_jpeg_info(job.data[k], job.sizes[k], &info, &why) != JpegParse::kOk || info.height != p.height ||
        info.width != p.width)
      throw Error(ErrorKind::kState, "simulated device: decode_jpegs: image " + std::to_string(k) + " is not the JPEG it "
                                     "was described as" + (why.empty() ? "" : ": " + why));
    std::vector<uint8_t>& out = (*decoded)[k];
    try {
      if (layout == images::DecodedLayout::kYccPlanar) {
        out.resize(static_cast<size_t>(images::ycc_planes_bytes(p)));
        decoder.decode_planes(job.data[k], job.sizes[k], p, out.data());
      } else {
        int64_t stride = 0;
        const uint8_t* px = decoder.decode(job.data[k], job.sizes[k], info, 1, images::Region{0, p.height, 0, p.width},
                                           &stride);
        const size_t row = static_cast<size_t>(p.width) * 3;
        out.resize(row * p.height);
        for (int y = 0; y < p.height; ++y) std::memcpy(out.data() + y * row, px + y * stride, row);
      }
    } catch (const std::runtime_error& e) {  // data the decoder refuses, as nvJPEG's BAD_JPEG
      throw Error(ErrorKind::kValue, std::string("simulated device: decode_jpegs: image ") + std::to_string(k) +
                                         " cannot be decoded: " + e.what());
    }
  }
  // A GPU decoder copies the bitstreams to the device in stream order: they are read again there, and a
  // bitstream changed by then (its host slot refilled too early) is a misuse.
  auto fingerprint = [](const uint8_t* p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
  };
  std::vector<uint64_t> prints(job.data.size());
  for (size_t k = 0; k < job.data.size(); ++k) prints[k] = fingerprint(job.data[k], job.sizes[k]);
  s->push([impl = impl_.get(), decoded, job, prints, fingerprint] {
    for (size_t k = 0; k < job.out.size(); ++k) {
      if (fingerprint(job.data[k], job.sizes[k]) != prints[k])
        impl->report("decode_jpegs read a bitstream that changed before its stream decoded it");
      std::memcpy(job.out[k], (*decoded)[k].data(), (*decoded)[k].size());
    }
  });
  return layout;
}

void SimDevice::set_jpeg_layout(images::DecodedLayout layout) { impl_->jpeg_layout = layout; }

std::string SimDevice::jpeg_decoder() const {
  return impl_->jpeg_layout.load() == images::DecodedLayout::kYccPlanar ? "simulated libjpeg (planar YCbCr)"
                                                                        : "simulated libjpeg (interleaved RGB)";
}

void SimDevice::fail(const std::string& what, int count, int after) {
  int kind = 0;
  while (kind < kNumFailKinds && what != kFailKinds[kind]) ++kind;
  if (kind == kNumFailKinds)
    throw Error(ErrorKind::kValue,
                "what must be copy, launch, decode, record, wait, synchronize, free, reject, hang or alloc, got '" + what + "'");
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->failing[kind] = count;
  impl_->pass[kind] = after;
}

void SimDevice::release_hangs() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    ++impl_->released;
  }
  impl_->unhang.notify_all();
}

int SimDevice::hanging() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->hanging;
}

void SimDevice::record(Event* e, Stream* s) {
  impl_->maybe_fail(3, "record");
  if (impl_->capturing(s)) {  // a node of the graph: nothing that runs now completes it
    std::lock_guard<std::mutex> lk(e->mu);
    e->captured = true;
    return;
  }
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lk(e->mu);
    gen = ++e->recorded;
    e->captured = false;
  }
  s->push([e, gen] {
    {
      std::lock_guard<std::mutex> lk(e->mu);
      e->completed = std::max(e->completed, gen);
    }
    e->cv.notify_all();
  });
}

void SimDevice::wait(Stream* s, Event* e) {
  impl_->maybe_fail(4, "wait");
  uint64_t target;
  bool captured;
  {
    std::lock_guard<std::mutex> lk(e->mu);
    target = e->recorded;
    captured = e->captured;
  }
  {
    // A captured stream may wait only for events of its own capture (a dependency inside the graph).
    std::lock_guard<std::mutex> lk(impl_->mu);
    if (Capture* c = impl_->capture_of(s)) {
      if (!captured) impl_->refuse(*c, "a stream being captured waited for an event recorded outside the capture");
      return;
    }
  }
  impl_->refuse_captured_event(e, "a stream");
  s->push([e, target] {
    std::unique_lock<std::mutex> lk(e->mu);
    e->cv.wait(lk, [&] { return e->completed >= target; });
  });
}

void SimDevice::synchronize(Event* e) {
  impl_->maybe_fail(5, "synchronize");
  impl_->unsafe_call("synchronize");
  impl_->refuse_captured_event(e, "the host");
  std::unique_lock<std::mutex> lk(e->mu);
  const uint64_t target = e->recorded;
  e->cv.wait(lk, [&] { return e->completed >= target; });
}

bool SimDevice::query(Event* e) {
  impl_->unsafe_call("query");
  impl_->refuse_captured_event(e, "the host");
  std::lock_guard<std::mutex> lk(e->mu);
  return e->completed >= e->recorded;
}

void SimDevice::enqueue(Stream* s, std::function<void()> fn) { s->push(std::move(fn)); }

bool SimDevice::capturing(Stream* s) { return impl_->capturing(s); }

int SimDevice::exchange_capture_mode(int mode) noexcept {
  const int previous = tl_capture_mode;
  tl_capture_mode = mode;
  return previous;
}

void SimDevice::begin_capture(Stream* s, int mode) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (impl_->capture_of(s)) throw Error(ErrorKind::kValue, "begin_capture: the stream is capturing already");
  impl_->captures.push_back(Capture{s, std::this_thread::get_id(), mode, ""});
}

std::string SimDevice::end_capture(Stream* s) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  for (auto it = impl_->captures.begin(); it != impl_->captures.end(); ++it) {
    if (it->stream != s) continue;
    std::string why = it->invalidated;
    impl_->captures.erase(it);
    return why;
  }
  throw Error(ErrorKind::kValue, "end_capture: the stream is not capturing");
}

void SimDevice::drain() {
  std::vector<Stream*> all;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    for (auto& s : impl_->streams) all.push_back(s.get());
  }
  for (Stream* s : all) s->drain();
}

void SimDevice::set_max_delay_us(int us) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->max_delay_us = us;
  for (auto& s : impl_->streams) s->max_delay_us = us;
}

void run_kernel_on_host(const DeviceKernel& k) {
  switch (k.kind) {
    case DeviceKernel::Kind::kWidenTokens: {
      const WidenTokensKernel& w = k.widen;
      const WidenFn widen = widen_for(w.token_bytes, w.is_signed);
      for (int64_t r = 0; r < w.records; ++r)
        widen(static_cast<const char*>(w.src) + r * w.src_stride, w.block, w.x + r * w.block, w.y + r * w.block);
      return;
    }
    case DeviceKernel::Kind::kCropMirrorNormalize: {
      const CropMirrorNormalizeKernel& c = k.cmn;
      transforms::crop_mirror_normalize_host(c.params, c.images, c.out, c.count, c.index, c.epoch);
      return;
    }
    case DeviceKernel::Kind::kResampleImages: {
      const ResampleImagesKernel& r = k.resample;
      const int64_t total = r.count * images::out_image_elements(r.params);
      for (int64_t i = 0; i < total; ++i)
        images::resample_element(r.params, r.layout, r.descs, r.staging, r.image_stride, r.out, i, r.work,
                                 r.work_stride);
      return;
    }
    case DeviceKernel::Kind::kAugmentImages: {
      const AugmentImagesKernel& a = k.augment;
      for (int64_t n = 0; n < a.count; ++n)
        if (a.descs[n].on == static_cast<int32_t>(images::DecodeOn::kDevice))
          images::augment_image_serial(a.params, a.descs[n], a.work + n * a.work_stride, a.out, n);
      return;
    }
  }
}

}  // namespace fastpipe
