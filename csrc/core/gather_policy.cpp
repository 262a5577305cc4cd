#include "core/gather_policy.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

namespace fastpipe {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<pid_t> tids;
};

Registry& registry() {
  static Registry* r = [] {
    // A fork() while a reader (un)registers would leave the child's copy of the lock held: the lock is
    // taken around every fork, and the child, which has none of the parent's threads, starts empty.
    pthread_atfork([] { registry().mu.lock(); }, [] { registry().mu.unlock(); },
                   [] {
                     registry().tids.clear();
                     registry().mu.unlock();
                   });
    return new Registry;  // never destroyed: readers may unregister during static destruction
  }();
  return *r;
}

// The CPU clock of thread `tid` of this process (glibc's pthread_getcpuclockid, from a thread id):
// the kernel reads it exactly, also while the thread runs on another core.
clockid_t thread_cpu_clock(pid_t tid) { return static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6); }

}  // namespace

LoaderThreadScope::LoaderThreadScope() : tid_(static_cast<pid_t>(syscall(SYS_gettid))) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.tids.push_back(tid_);
}

LoaderThreadScope::~LoaderThreadScope() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  const auto it = std::find(r.tids.begin(), r.tids.end(), tid_);
  if (it != r.tids.end()) r.tids.erase(it);
}

CpuSample sample_step_threads() {
  std::vector<pid_t> loader;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    loader = r.tids;
  }
  CpuSample out;
  DIR* d = opendir("/proc/self/task");
  if (!d) return out;
  while (const dirent* e = readdir(d)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
    if (tid <= 0 || std::find(loader.begin(), loader.end(), tid) != loader.end()) continue;
    timespec ts{};
    if (clock_gettime(thread_cpu_clock(tid), &ts) != 0) continue;  // it ended meanwhile
    out.emplace_back(tid, static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

int64_t step_cpu_ns(const CpuSample& before, const CpuSample& after) {
  int64_t total = 0;
  auto b = before.begin();
  for (const auto& [tid, ns] : after) {
    while (b != before.end() && b->first < tid) ++b;
    total += ns - (b != before.end() && b->first == tid ? b->second : 0);
  }
  return total;
}

CpuSample GatherPolicy::sample_timed() {
  const auto t0 = Clock::now();
  CpuSample s = sample_();
  window_s_ = std::max(BatchWindow::kSeconds,
                       kWindowOverSample * std::chrono::duration<double>(Clock::now() - t0).count());
  return s;
}

bool GatherPolicy::on_batch(Clock::time_point now, int64_t loader_ns) {
  if (in_next_) {
    if (++in_next_batches_ >= retry_after_) {  // try the readers again
      in_next_ = false;
      after_retry_ = true;
      window_.restart();
    }
    return in_next_;
  }
  const BatchWindow::Step step = window_.on_batch(now, window_s_);
  if (step == BatchWindow::Step::kOpened) {
    s0_ = sample_timed();
    loader_ns0_ = loader_ns;
  }
  if (step != BatchWindow::Step::kClosed) return false;
  CpuSample s1 = sample_timed();
  const int64_t step_ns = std::max<int64_t>(0, step_cpu_ns(s0_, s1) - (loader_ns - loader_ns0_));
  last_step_cores_ = static_cast<double>(step_ns) * 1e-9 / window_.seconds();
  if (step_keeps_cores_busy(last_step_cores_, cores_)) {
    in_next_ = true;
    in_next_batches_ = 0;
    retry_after_ = after_retry_ ? std::min(2 * retry_after_, kMaxRetry) : kFirstRetry;
    return true;
  }
  after_retry_ = false;
  s0_ = std::move(s1);
  loader_ns0_ = loader_ns;
  return false;
}

}  // namespace fastpipe
