#include "core/gather_policy.h"

#include <dirent.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

namespace fastpipe {
namespace {

std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
std::vector<pid_t>& registry() {
  static std::vector<pid_t> tids;
  return tids;
}

// The CPU clock of thread `tid` of this process (glibc's pthread_getcpuclockid, from a thread id):
// the kernel reads it exactly, also while the thread runs on another core.
clockid_t thread_cpu_clock(pid_t tid) { return static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6); }

}  // namespace

LoaderThreadScope::LoaderThreadScope() : tid_(static_cast<pid_t>(syscall(SYS_gettid))) {
  std::lock_guard<std::mutex> lk(registry_mu());
  registry().push_back(tid_);
}

LoaderThreadScope::~LoaderThreadScope() {
  std::lock_guard<std::mutex> lk(registry_mu());
  auto& r = registry();
  r.erase(std::find(r.begin(), r.end(), tid_));
}

CpuSample sample_step_threads() {
  std::vector<pid_t> loader;
  {
    std::lock_guard<std::mutex> lk(registry_mu());
    loader = registry();
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
  window_s_ = std::max(kWindowSeconds, kWindowOverSample * std::chrono::duration<double>(Clock::now() - t0).count());
  return s;
}

bool GatherPolicy::on_batch(Clock::time_point now) {
  ++batches_;
  if (in_next_) {
    if (batches_ >= retry_after_) {  // try the readers again
      in_next_ = false;
      measuring_ = false;
      after_retry_ = true;
      batches_ = 0;
    }
    return in_next_;
  }
  if (!measuring_) {
    if (batches_ < kSettleBatches) return false;
    measuring_ = true;
    batches_ = 0;
    t0_ = now;
    s0_ = sample_timed();
    return false;
  }
  const double wall = std::chrono::duration<double>(now - t0_).count();
  if (batches_ < kWindowBatches || wall < window_s_) return false;
  CpuSample s1 = sample_timed();
  last_step_cores_ = static_cast<double>(step_cpu_ns(s0_, s1)) * 1e-9 / wall;
  batches_ = 0;
  if (step_keeps_cores_busy(last_step_cores_, cores_)) {
    in_next_ = true;
    measuring_ = false;
    retry_after_ = after_retry_ ? std::min(2 * retry_after_, kMaxRetry) : kFirstRetry;
    return true;
  }
  after_retry_ = false;
  t0_ = now;
  s0_ = std::move(s1);
  return false;
}

}  // namespace fastpipe
