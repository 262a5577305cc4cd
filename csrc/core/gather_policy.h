// Where a CPU loader gathers its batches when the user did not say (ReaderOptions::gather = kAuto):
// in its reader threads, ahead of the training step, or in next(), on the step's own threads.
//
// Reader threads are free while the step leaves a core idle (a GPU step, a single-threaded one). When
// the step's own threads (torch's intra-op team) keep the cores busy, the readers only take cores from
// them, and each parallel region waits for the thread a reader displaced: +15-35% a step on 2 cores
// (issue 21), where gathering in next() adds what torch.index_select does. So the policy measures the
// CPU the process spends outside the loader's threads, per second of wall time, over a window of
// batches; a step that leaves less than half a core idle has its batches gathered in next(). The
// readers are tried again (a window each) after 64, 128, ... up to 512 batches, since a measurement in
// next() mode would count the spin of torch's threads after the gathers themselves.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "core/batch_window.h"

namespace fastpipe {

// The loader's own threads, left out of the step's CPU: each reader registers itself while it runs.
class LoaderThreadScope {
 public:
  LoaderThreadScope();
  ~LoaderThreadScope();
  LoaderThreadScope(const LoaderThreadScope&) = delete;
  LoaderThreadScope& operator=(const LoaderThreadScope&) = delete;

 private:
  pid_t tid_;
};

// CPU nanoseconds of each thread of this process that is not a loader thread, by thread id (sorted).
using CpuSample = std::vector<std::pair<pid_t, int64_t>>;
CpuSample sample_step_threads();
// CPU nanoseconds the step's threads used between two samples (a thread born between them counts from 0;
// one that ended is left out).
int64_t step_cpu_ns(const CpuSample& before, const CpuSample& after);

class GatherPolicy {
 public:
  using Clock = BatchWindow::Clock;
  // A window (batch_window.h) also spans 200 times what reading the clocks took (one read per thread:
  // a process of many threads samples less often, for <= 0.5% of its time); the CPU clocks are exact,
  // so the window only has to outlast the step's phases.
  static constexpr double kWindowOverSample = 200;
  // A window spans 2 batches from the first one the readers read: each batch interval is one whole step,
  // and the CPU clocks are exact, so 2 steps measure it; every batch more that readers read beside a
  // busy step costs it (ImageNet-like records on 2 cores: +7 points of a 24 ms step over the first
  // pass's 10 batches with the kBatches/kSettleBatches windows).
  static constexpr int kWindowBatches = 2;
  static constexpr double kMinIdleCores = 0.5;
  static constexpr int64_t kFirstRetry = 64, kMaxRetry = 512;

  // `sample` reads the step's CPU (tests pass their own).
  explicit GatherPolicy(long cores, CpuSample (*sample)() = sample_step_threads) : cores_(cores), sample_(sample) {}

  // Whether a step that used `step_cores` cores on average (of `cores`) should have its batches
  // gathered in next().
  static bool step_keeps_cores_busy(double step_cores, long cores) { return cores - step_cores < kMinIdleCores; }

  // Called by next() for each batch, on the consumer's thread: whether to gather in next() from this
  // batch on. `loader_ns`: the CPU the loader has spent so far on the step's threads (chunks next() read
  // while it waited), left out of the step's.
  bool on_batch(Clock::time_point now, int64_t loader_ns = 0);

  // The cores the step used in the last window (< 0: none measured yet).
  double last_step_cores() const { return last_step_cores_; }

 private:
  long cores_;
  CpuSample (*sample_)();
  bool in_next_ = false;
  bool after_retry_ = false;  // the window measures readers tried again
  int64_t in_next_batches_ = 0;  // since next() mode began
  int64_t retry_after_ = kFirstRetry;
  BatchWindow window_{kWindowBatches, /*settle=*/1};
  CpuSample s0_;
  int64_t loader_ns0_ = 0;
  double window_s_ = BatchWindow::kSeconds;
  double last_step_cores_ = -1;

  CpuSample sample_timed();  // sample_(), and the window it sets (kWindowOverSample)
};

}  // namespace fastpipe
