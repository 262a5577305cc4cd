// Standalone stress test of the device pipeline on the simulated device (csrc/core) for
// ThreadSanitizer and AddressSanitizer: random delays on every stream, a consumer stream that reads each
// batch long after the host dropped it, batches held and dropped out of order, an overflow when every
// slot is held, abandoned passes, and close() with work in flight. Exits non-zero on any wrong byte.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <string>
#include <vector>

#include "core/device_pipeline.h"
#include "core/error.h"
#include "core/serial_worker.h"
#include "core/sim_device.h"
#include "stress_file.h"

using namespace fastpipe;

namespace {

using namespace stress;

constexpr int64_t kBatch = 8;

int failures = 0;
int wrong = 0;  // wrong batches seen (failures, except in the canary run)

struct Seen {
  std::vector<uint8_t> bytes;
  int64_t first;  // batch number in the pass
  int64_t records;
};

void run(const std::string& path, int max_delay_us, bool overflow, bool canary = false) {
  auto sim = std::make_shared<SimDevice>(max_delay_us, 7);
  ColumnSpec c;
  c.path = path;
  c.data_offset = kHeader;
  c.record_stride = c.record_bytes = kRecordBytes;
  c.num_records = kRecords;
  ReaderOptions opt;
  opt.batch_size = kBatch;
  opt.num_threads = 2;
  opt.prefetch = 1;
  OverflowFn alloc = nullptr;
  if (overflow) {
    // The loader's model of torch's caching allocator (csrc/ops/loader.cpp): a block is reused once the
    // copy stream is past its batch's death, whatever the consumer stream still has queued.
    alloc = [sim](int64_t bytes, Stream* copy) {
      const size_t n = static_cast<size_t>(bytes);
      char* p = static_cast<char*>(sim->pool_alloc(n));
      std::shared_ptr<void> keep(p, [sim, copy, n](void* q) { sim->enqueue(copy, [sim, q, n] { sim->pool_free(q, n); }); });
      return OverflowBuffer{p, keep};
    };
  }
  DevicePipeline pipe(sim, {c}, opt, alloc);
  pipe.reader().set_poison(true);
  pipe.set_skip_release_fence(canary);
  std::mt19937 rng(11 + max_delay_us);
  std::vector<std::unique_ptr<Seen>> seen;
  for (int pass = 0; pass < (canary ? 1 : 4); ++pass) {
    std::vector<int64_t> idx(kRecords);
    for (int64_t i = 0; i < kRecords; ++i) idx[i] = i;
    std::shuffle(idx.begin(), idx.end(), rng);
    pipe.start(idx, false, pass, 30.0, nullptr);
    std::deque<std::shared_ptr<DeviceBatch>> held;
    int64_t b = 0;
    const int64_t stop_at = pass == 2 ? 20 : -1;  // abandon pass 2 midway
    for (;;) {
      std::shared_ptr<DeviceBatch> batch;
      try {
        batch = pipe.next(30.0, nullptr);
      } catch (const Error& e) {
        if (!overflow && std::strstr(e.what(), "device slots are held")) {  // expected: drop some, retry
          held.clear();
          continue;
        }
        throw;
      }
      if (!batch) break;
      // The consumer stream reads the batch later; the host drops it (or holds it a while) right away.
      auto s = std::make_unique<Seen>();
      s->bytes.resize(static_cast<size_t>(batch->records() * kRecordBytes));
      s->first = b;
      s->records = batch->records();
      if (canary)  // a consumer far behind the copies, so that a slot reused too early certainly shows
        sim->enqueue(sim->consumer_stream(), [] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); });
      sim->enqueue(sim->consumer_stream(), [dst = s->bytes.data(), src = batch->data(0), n = s->bytes.size()] {
        std::memcpy(dst, src, n);
      });
      seen.push_back(std::move(s));
      if (rng() % 3 == 0) held.push_back(batch);
      while (held.size() > (overflow ? 6u : 2u) || (!held.empty() && rng() % 4 == 0)) {
        held.erase(held.begin() + static_cast<long>(rng() % held.size()));
      }
      ++b;
      if (b == stop_at) break;
    }
    sim->drain();
    for (const auto& s : seen)
      for (int64_t i = 0; i < s->records; ++i)
        for (int64_t k = 0; k < kRecordBytes; ++k)
          if (s->bytes[i * kRecordBytes + k] != expected_byte(idx[s->first * kBatch + i], k)) {
            if (!canary) std::fprintf(stderr, "pass %d batch %lld: wrong byte\n", pass, static_cast<long long>(s->first));
            ++wrong;
            i = s->records;
            break;
          }
    seen.clear();
  }
  auto keep = pipe.next(30.0, nullptr);  // the pass is over: none
  if (keep) ++failures;
  pipe.close(30.0, nullptr);
  sim->drain();
}

// The submitter's waits end: a task stuck (in a device call) makes wait_idle time out and stop() leave
// its thread behind, which later finishes safely after the worker is gone (ASan: no use after free);
// work posted after stop() is refused.
void serial_worker_waits_end() {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false, finished = false;
  auto stuck = [&] {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return release; });
    finished = true;
    cv.notify_all();
  };
  auto expect_error = [](ErrorKind kind, const std::function<void()>& fn, const char* what) {
    try {
      fn();
    } catch (const Error& e) {
      if (e.kind() == kind) return;
    }
    std::fprintf(stderr, "serial worker: %s did not fail as it should\n", what);
    ++failures;
  };
  {
    auto worker = std::make_unique<SerialWorker>();
    auto ticket = worker->post(stuck);
    expect_error(ErrorKind::kTimeout, [&] { worker->wait_idle(0.2, nullptr, "idle"); }, "wait_idle on a stuck task");
    expect_error(ErrorKind::kTimeout, [&] { worker->wait(*ticket, 0.2, nullptr, "ticket"); }, "wait on a stuck task");
    int polls = 0;
    expect_error(ErrorKind::kState, [&] {
      worker->wait(*ticket, 0, [&] { if (++polls == 3) throw Error(ErrorKind::kState, "interrupted"); }, "ticket");
    }, "a wait whose poll raises");
    if (worker->stop(0.2, nullptr)) {
      std::fprintf(stderr, "serial worker: stop() joined a thread stuck in its task\n");
      ++failures;
    }
    expect_error(ErrorKind::kState, [&] { worker->post([] {}); }, "post() after stop()");
  }  // the worker is gone; its thread is not
  std::unique_lock<std::mutex> lk(mu);
  release = true;
  cv.notify_all();
  cv.wait(lk, [&] { return finished; });
  auto worker = std::make_unique<SerialWorker>();  // and one that is not stuck stops at once
  int ran = 0;
  for (int k = 0; k < 3; ++k) worker->post([&] { ++ran; });
  if (!worker->stop(0, nullptr) || ran != 3) {
    std::fprintf(stderr, "serial worker: stop() did not run what was posted and join\n");
    ++failures;
  }
}

}  // namespace

// `pipeline_stress canary`: the same without the release fence, which must go wrong (wrong bytes, and a
// data race for ThreadSanitizer): the proof that the checks above can fail.
int main(int argc, char** argv) {
  const std::string path = write_file();
  if (argc > 1 && std::strcmp(argv[1], "canary") == 0) {
    run(path, 200, false, true);
    unlink(path.c_str());
    std::printf("%s\n", wrong ? "CANARY RACED" : "CANARY DID NOT RACE");
    return 0;
  }
  serial_worker_waits_end();
  for (int delay : {0, 200})
    for (bool overflow : {false, true}) run(path, delay, overflow);
  failures += wrong;
  unlink(path.c_str());
  std::printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
