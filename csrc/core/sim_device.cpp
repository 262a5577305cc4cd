#include "core/sim_device.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/gather.h"
#include "core/jpeg_decode.h"
#include "core/jpeg_header.h"
#include "core/sim_device_state.h"

namespace fastpipe {

using namespace sim;

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
