#include "core/reader_placement.h"

#include <algorithm>

namespace fastpipe {

void CorePlacement::restart() { window_.restart(); }

void CorePlacement::on_pass_start(Clock::time_point now) {
  if (now > last_) window_.leave_out(now - last_);  // an open window began at a batch: at or before last_
}

int CorePlacement::on_batch(Clock::time_point now, int64_t read_ns, double waited, int cpu) {
  if (cores_ < 2) return -1;
  last_ = now;
  if (cpu >= 0) cpu_ = cpu;  // the readers follow the consumer when it moves
  if (hold_ > 0) --hold_;
  if (spare_) ++spared_for_;
  const BatchWindow::Step step = window_.on_batch(now);
  if (step == BatchWindow::Step::kOpened) {
    read0_ = read_ns;
    waited_ = 0;
  } else if (step != BatchWindow::Step::kSettling && waited > kLongWait) {
    ++waited_;
  }
  if (step == BatchWindow::Step::kClosed) decide(read_ns);
  return spare_ ? cpu_ : -1;
}

void CorePlacement::decide(int64_t read_ns) {
  last_demand_ = static_cast<double>(read_ns - read0_) * 1e-9 / window_.seconds();
  const bool waited_often = waited_ >= kMinWaitedBatches && 4 * waited_ > window_.batches();
  read0_ = read_ns;
  waited_ = 0;
  if (spare_) {
    if (waited_often) {
      if (spared_for_ >= kMaxRetry) retry_ = kFirstRetry;  // they kept up a long time: a passing stall
      spare_ = false;
      hold_ = retry_;
      retry_ = std::min(2 * retry_, kMaxRetry);
    }
  } else if (hold_ == 0 && !waited_often && last_demand_ <= kMaxDemand * static_cast<double>(cores_ - 1)) {
    spare_ = true;
    spared_for_ = 0;
  }
}

CoreAvoider::CoreAvoider() {
  CPU_ZERO(&allowed_);
  if (sched_getaffinity(0, sizeof(allowed_), &allowed_) == 0) count_ = CPU_COUNT(&allowed_);
}

void CoreAvoider::keep_off(int cpu) {
  if (cpu == applied_ || count_ == 0) return;
  applied_ = cpu;
  cpu_set_t set = allowed_;
  if (cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &set) && count_ > 1) CPU_CLR(cpu, &set);
  // A failure (the cores were taken from the process meanwhile) leaves the thread where the kernel allows.
  static_cast<void>(sched_setaffinity(0, sizeof(set), &set));
}

}  // namespace fastpipe
