// The windows of batches the loader's policies measure over (gather_policy.h: the step's CPU;
// reader_placement.h: the readers' time and the consumer's waits). A window opens at the `settle`-th
// batch after restart() (kSettleBatches: the first batch after the readers start is waited for
// whatever they do), and closes once it spans `batches` batches (kBatches) and a minimum time; the
// next one opens there.
#pragma once

#include <chrono>
#include <cstdint>

namespace fastpipe {

class BatchWindow {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kBatches = 8;
  static constexpr double kSeconds = 0.02;  // the minimum time, unless the caller asks for more
  static constexpr int kSettleBatches = 2;
  enum class Step { kSettling, kOpened, kInside, kClosed };

  explicit BatchWindow(int batches = kBatches, int settle = kSettleBatches) : min_batches_(batches), settle_(settle) {}

  // Counts a batch taken at `now`: kOpened, a window starts at it; kClosed, the window ends at it
  // (batches() and seconds() describe it) and the next one starts.
  Step on_batch(Clock::time_point now, double min_seconds = kSeconds) {
    ++batches_;
    if (!open_) {
      if (batches_ < settle_) return Step::kSettling;
      open_ = true;
      batches_ = 0;
      t0_ = now;
      return Step::kOpened;
    }
    seconds_ = std::chrono::duration<double>(now - t0_).count();
    if (batches_ < min_batches_ || seconds_ < min_seconds) return Step::kInside;
    closed_batches_ = batches_;
    batches_ = 0;
    t0_ = now;
    return Step::kClosed;
  }
  // The next window opens at the `settle`-th batch from now.
  void restart() {
    open_ = false;
    batches_ = 0;
  }
  // `gap` (no batch was taken) does not count in the open window's time.
  void leave_out(Clock::duration gap) {
    if (open_) t0_ += gap;
  }
  int64_t batches() const { return closed_batches_; }
  double seconds() const { return seconds_; }

 private:
  int min_batches_, settle_;
  bool open_ = false;
  int64_t batches_ = 0;  // since the window opened, or since restart()
  int64_t closed_batches_ = 0;
  double seconds_ = 0;
  Clock::time_point t0_;
};

}  // namespace fastpipe
