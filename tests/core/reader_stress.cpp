// Standalone stress test of the batch reader (csrc/core) for ThreadSanitizer and AddressSanitizer:
// reader threads, a consumer that holds and releases leases out of order from two threads, passes
// abandoned midway, close() with leases outstanding, and (GatherIn::kAuto) the readers paused and
// resumed at random batches while next() reads the rest. Exits non-zero on any wrong byte.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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

}  // namespace

int main() {
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
