// Which cores the reader threads run on: every core the process may use, or all but the one the
// consumer (the training thread) takes its batches on.
//
// While the training thread sleeps or waits on the GPU its core is idle, and the kernel runs a reader
// that wakes there (one next() wakes, it prefers to run on next()'s core): 40-65% of the gathers on 2
// cores. The reader's megabytes of records evict the training thread's L1 and L2: after it wakes, its
// own work runs 2-3x slower for tens of microseconds (+7-13% of a 0.4 ms step on 2 cores; issue 21).
// Kept on the other cores the readers cost the same step +1-3%. The readers lose a core by that, so
// they keep off the consumer's core only while the other cores leave them ample time: a window in
// which they were busy at most kMaxDemand of the other cores. Once the consumer waits for them there
// (longer than the cache misses cost it, kLongWait) for a quarter of a window's batches (a stall of
// the readers' core, one batch, does not count), they take every core again, for 64 batches, doubling
// up to 512 while the tries keep failing, before the next try. Time between passes (the consumer took
// no batch) is left out of the windows.
#pragma once

#include <sched.h>

#include <cstdint>

#include "core/batch_window.h"

namespace fastpipe {

class CorePlacement {
 public:
  using Clock = BatchWindow::Clock;
  static constexpr double kMaxDemand = 0.75;  // of the cores but one, busy gathering
  static constexpr double kLongWait = 20e-6;  // seconds the consumer waited for a batch
  static constexpr int kMinWaitedBatches = 2;  // in a window, and more than a quarter of its batches
  static constexpr int64_t kFirstRetry = 64, kMaxRetry = 512;

  explicit CorePlacement(long cores) : cores_(cores) {}

  // Called for each batch the consumer takes while the readers read: on core `cpu`, with the readers'
  // gather time so far (read_ns) and the seconds the consumer waited for this batch (the caller passes
  // 0 for the first batches of a pass, waited for whatever the readers do). Returns the core the
  // readers keep off from now on (-1: none).
  int on_batch(Clock::time_point now, int64_t read_ns, double waited, int cpu);
  // The readers pause (next() reads): windows start afresh after they resume (BatchWindow::restart).
  void restart();
  // A pass starts: the time since the last batch was taken is left out of the window.
  void on_pass_start(Clock::time_point now);

  // The readers' reading time per second of the last window, summed over them (< 0: none measured
  // yet): the cores they kept busy, or more while they shared cores.
  double last_demand() const { return last_demand_; }

 private:
  long cores_;
  bool spare_ = false;
  int cpu_ = -1;
  int64_t hold_ = 0;     // batches before the readers may keep off the consumer's core again
  int64_t retry_ = kFirstRetry;
  int64_t spared_for_ = 0;  // batches since the readers last began to keep off it
  BatchWindow window_;
  Clock::time_point last_;  // when the last batch was taken
  int64_t read0_ = 0;       // read_ns when the window opened
  int64_t waited_ = 0;  // batches of the window waited for longer than kLongWait
  double last_demand_ = -1;

  void decide(int64_t read_ns);  // at a window's close: keep off the consumer's core or not
};

// A reader thread's side: it keeps off one core of those it was allowed when it started.
class CoreAvoider {
 public:
  CoreAvoider();  // on the reader thread
  // Keeps the calling thread off core `cpu` (-1: on every allowed core); a system call only on a change.
  void keep_off(int cpu);

 private:
  cpu_set_t allowed_;
  int count_ = 0;  // allowed cores (0: unknown, nothing is changed)
  int applied_ = -1;
};

}  // namespace fastpipe
