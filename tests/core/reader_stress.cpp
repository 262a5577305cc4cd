// Standalone stress test of the batch reader (csrc/core) for ThreadSanitizer and AddressSanitizer:
// reader threads, a consumer that holds and releases leases out of order from two threads, passes
// abandoned midway, close() with leases outstanding, and (GatherIn::kAuto) the readers paused and
// resumed at random batches while next() reads the rest, and kept off the consumer's core or not at
// random; GatherPolicy's and CorePlacement's decisions on a scripted clock; CoreAvoider's affinity.
// Exits non-zero on any wrong byte or decision.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
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
#include "core/reader_placement.h"
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
  opt.parallel_for = [](int64_t n, int64_t, const std::function<void(int64_t, int64_t, int)>& body) {
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
      if (rng() % 4 == 0) reader.force_spare_core(static_cast<int>(rng() % 3) - 1);
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
  // are tried for one window after 64, 128, 256, 512 and 512 batches. A window of 5 ms steps: 2 batches,
  // and 20 ms.
  const int window_batches = std::max<int>(GatherPolicy::kWindowBatches, BatchWindow::kSeconds / 0.005 + 0.5);
  int threads_run = 0;
  while (!batch(1.9))
    if (++threads_run > 2 * window_batches) return fail("busy step missed");
  for (int64_t want : {64, 128, 256, 512, 512}) {
    int64_t run = 1;
    while (batch(1.9)) ++run;
    if (run != want) fail("in next() for the wrong number of batches before the readers were tried again");
    int window = 1;
    while (!batch(1.9)) ++window;
    if (window != window_batches + 1) fail("retry window of the wrong length");
  }
  // The step turns idle: the next retry keeps the readers.
  int64_t run = 1;
  while (batch(0.3)) ++run;
  if (run != 512) fail("retry schedule");
  for (int i = 0; i < 2000; ++i)
    if (batch(0.3)) return fail("an idle step went back to next()");
}

// CorePlacement on a scripted clock: a consumer on core 3 of 2 cores' worth (the readers busy `demand`
// cores) taking a batch every 1 ms after waiting `wait` seconds for it.
void check_placement() {
  auto fail = [](const char* what) {
    std::fprintf(stderr, "placement: %s\n", what);
    ++failures;
  };
  CorePlacement p(2);
  CorePlacement::Clock::time_point now{};
  int64_t read_ns = 0;
  auto batch = [&](double demand, double wait, int cpu = 3) {
    now += std::chrono::milliseconds(1);
    read_ns += static_cast<int64_t>(demand * 1e6);
    return p.on_batch(now, read_ns, wait, cpu);
  };
  // Readers busy 0.9 of the other core: too close to keep up without the consumer's, also when passes
  // of 30 batches are a second apart (no batch is taken between them).
  for (int i = 0; i < 200; ++i) {
    if (i % 30 == 0) p.on_pass_start(now += std::chrono::seconds(1));
    if (batch(0.9, 0) != -1) return fail("kept off with too little time to spare");
  }
  // Busy 0.3: off the consumer's core within a settle and a window, and it follows the consumer.
  int n = 1;
  while (batch(0.3, 0) != 3)
    if (++n > 2 * (BatchWindow::kSettleBatches + 20)) return fail("never kept off the consumer's core");
  if (batch(0.3, 0, 1) != 1) fail("did not follow the consumer to core 1");
  // One stall in a window does not count; waits in every batch do: every core again, for 64 batches,
  // then 128 and up to 512 while the tries keep failing.
  if (batch(0.3, 5e-3) != 3) fail("a stall moved the readers");
  for (int i = 0; i < 40; ++i)
    if (batch(0.3, 0) != 3) return fail("one stall in a window moved the readers");
  for (int64_t hold : {64, 128, 256, 512, 512}) {
    n = 0;
    while (batch(0.3, 100e-6) != -1)
      if (++n > 45) return fail("waits never moved the readers back");
    int64_t back = 1;  // the batch that moved them
    while (batch(0.3, 0) == -1)
      if (++back > hold + 25) return fail("hold too long");
    if (back < hold) fail("tried again before the hold ended");
  }
  // Kept up for 512 batches: the next stall holds them back only 64 batches.
  for (int i = 0; i < 600; ++i) batch(0.3, 0);
  n = 0;
  while (batch(0.3, 100e-6) != -1)
    if (++n > 45) return fail("waits never moved the readers back");
  int64_t back = 0;
  while (batch(0.3, 0) == -1) ++back;
  if (back > 64 + 25) fail("a passing stall after a long run held the readers back too long");
  // One core: nothing to keep off.
  CorePlacement one(1);
  for (int i = 0; i < 100; ++i)
    if (one.on_batch(now += std::chrono::milliseconds(1), 0, 0, 0) != -1) return fail("kept off the only core");
}

// CoreAvoider on a thread of its own: off one allowed core, then back on all of them.
void check_avoider() {
  std::thread t([] {
    cpu_set_t all;
    if (sched_getaffinity(0, sizeof(all), &all) != 0 || CPU_COUNT(&all) < 2) return;
    int first = 0;
    while (!CPU_ISSET(first, &all)) ++first;
    CoreAvoider a;
    a.keep_off(first);
    cpu_set_t now;
    sched_getaffinity(0, sizeof(now), &now);
    if (CPU_ISSET(first, &now) || CPU_COUNT(&now) != CPU_COUNT(&all) - 1) {
      std::fprintf(stderr, "avoider: still on core %d\n", first);
      ++failures;
    }
    a.keep_off(-1);
    sched_getaffinity(0, sizeof(now), &now);
    if (!CPU_EQUAL(&now, &all)) {
      std::fprintf(stderr, "avoider: not back on every core\n");
      ++failures;
    }
  });
  t.join();
}

}  // namespace

int main() {
  check_policy();
  check_placement();
  check_avoider();
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
