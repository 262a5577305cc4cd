// Standalone stress test of the batch reader (csrc/core) for ThreadSanitizer and AddressSanitizer:
// reader threads, a consumer that holds and releases leases out of order from two threads, passes
// abandoned midway, close() with leases outstanding, and (GatherIn::kAuto) the readers paused and
// resumed at random batches while next() reads the rest; and GatherPolicy's decisions on a scripted
// clock. Exits non-zero on any wrong byte or decision.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/batch_reader.h"
#include "core/error.h"
#include "core/gather_policy.h"
#include "stress_file.h"

using namespace fastpipe;

namespace {

using namespace stress;

int failures = 0;

void check(const Lease& lease, const std::vector<int64_t>& idx, int64_t first) {
  for (int64_t i = 0; i < lease.records(); ++i)
    for (int64_t k = 0; k < kRecordBytes; ++k)
      if (static_cast<uint8_t>(lease.data(0)[i * kRecordBytes + k]) != expected_byte(idx[first + i], k)) {
        std::fprintf(stderr, "wrong byte: record %lld byte %lld\n", static_cast<long long>(idx[first + i]),
                     static_cast<long long>(k));
        ++failures;
        return;
      }
}

void run(const std::string& path, IoMode io, int threads, GatherIn gather) {
  ColumnSpec c;
  c.path = path;
  c.data_offset = kHeader;
  c.record_stride = kRecordBytes;
  c.record_bytes = kRecordBytes;
  c.num_records = kRecords;
  ReaderOptions opt;
  opt.batch_size = 10;
  opt.num_threads = threads;
  opt.prefetch = 2;
  opt.num_slots = 5;
  opt.io = io;
  opt.gather = gather;
  // next()'s batches on two threads of its own, as torch's intra-op team would run them.
  opt.parallel_for = [](int64_t n, const std::function<void(int64_t, int64_t, int)>& body) {
    std::thread other([&] { body(n / 2, n, 1); });
    body(0, n / 2, 0);
    other.join();
  };
  BatchReader reader({c}, opt);
  reader.set_poison(true);  // a slot reused too early shows as wrong bytes
  std::mt19937 rng(1234 + threads);
  std::mutex mu;
  std::deque<std::shared_ptr<Lease>> held;
  for (int pass = 0; pass < 12; ++pass) {
    std::vector<int64_t> idx(kRecords);
    for (int64_t i = 0; i < kRecords; ++i) idx[i] = i;
    std::shuffle(idx.begin(), idx.end(), rng);
    reader.start(idx, pass % 2 == 1);
    // A second thread drops held batches at random, as a training loop's other threads might.
    bool done = false;
    std::thread dropper([&] {
      std::mt19937 r2(99 + pass);
      for (;;) {
        {
          std::lock_guard<std::mutex> lk(mu);
          if (!held.empty() && r2() % 2) held.pop_front();
          if (done && held.empty()) return;
        }
        std::this_thread::yield();
      }
    });
    const int64_t stop_at = pass % 3 == 2 ? 37 : -1;  // some passes are abandoned midway
    for (int64_t b = 0;; ++b) {
      if (b == stop_at) break;
      if (gather == GatherIn::kAuto) reader.force_gather_in_next(static_cast<int>(rng() % 3) - 1);
      bool end = false;
      auto lease = rng() % 2 ? reader.try_next(&end) : nullptr;
      if (!lease && !end) lease = reader.next(30.0, nullptr);
      if (!lease) break;
      check(*lease, idx, b * opt.batch_size);
      std::lock_guard<std::mutex> lk(mu);
      held.push_back(lease);
      while (held.size() > 3) held.pop_front();
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      done = true;
    }
    dropper.join();
  }
  // A lease outliving close() and the reader stays readable.
  std::vector<int64_t> idx(kRecords);
  for (int64_t i = 0; i < kRecords; ++i) idx[i] = kRecords - 1 - i;
  reader.start(idx, false);
  auto keep = reader.next(30.0, nullptr);
  reader.close();
  check(*keep, idx, 0);
}

// GatherPolicy on a scripted clock and CPU: a 5 ms step using `cores` of 2 cores per batch.
int64_t fake_cpu_ns = 0;
CpuSample fake_sample() { return {{1, fake_cpu_ns}}; }

void check_policy() {
  GatherPolicy p(2, fake_sample);
  GatherPolicy::Clock::time_point now{};
  auto batch = [&](double cores) {
    now += std::chrono::milliseconds(5);
    fake_cpu_ns += static_cast<int64_t>(cores * 5e6);
    return p.on_batch(now);
  };
  auto fail = [](const char* what) {
    std::fprintf(stderr, "policy: %s\n", what);
    ++failures;
  };
  for (int i = 0; i < 100; ++i)
    if (batch(0.2)) fail("a step that leaves a core idle was read in next()");
  if (p.last_step_cores() < 0.19 || p.last_step_cores() > 0.21) fail("step cores misread");
  // A busy step: next() by the end of the first window all of whose batches are busy; then the readers
  // are tried for one window after 64, 128, 256, 512 and 512 batches.
  int threads_run = 0;
  while (!batch(1.9))
    if (++threads_run > 2 * GatherPolicy::kWindowBatches) return fail("busy step missed");
  for (int64_t want : {64, 128, 256, 512, 512}) {
    int64_t run = 1;
    while (batch(1.9)) ++run;
    if (run != want) fail("in next() for the wrong number of batches before the readers were tried again");
    int window = 1;
    while (!batch(1.9))
      if (++window > GatherPolicy::kSettleBatches + GatherPolicy::kWindowBatches) return fail("retry window too long");
  }
  // The step turns idle: the next retry keeps the readers.
  int64_t run = 1;
  while (batch(0.3)) ++run;
  if (run != 512) fail("retry schedule");
  for (int i = 0; i < 2000; ++i)
    if (batch(0.3)) return fail("an idle step went back to next()");
}

}  // namespace

int main() {
  check_policy();
  const std::string path = write_file();
  for (IoMode io : {IoMode::kMmap, IoMode::kPread, IoMode::kDirect})
    for (int threads : {1, 3})
      for (GatherIn gather : {GatherIn::kThreads, GatherIn::kAuto}) run(path, io, threads, gather);
  run(path, IoMode::kMmap, 2, GatherIn::kNext);
  // Errors cross threads as exceptions: a record range past the end of the file.
  {
    ColumnSpec c;
    c.path = path;
    c.data_offset = kHeader;
    c.record_stride = c.record_bytes = kRecordBytes;
    c.num_records = kRecords + 5;
    bool threw = false;
    try {
      BatchReader e({c}, ReaderOptions{});
    } catch (const Error& e) {
      threw = std::strstr(e.what(), "records need") != nullptr;
    }
    if (!threw) ++failures;
  }
  unlink(path.c_str());
  std::printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
