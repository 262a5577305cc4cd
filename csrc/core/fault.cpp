#include "core/fault.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>

namespace fastpipe::fault {
namespace {

std::atomic<bool> is_armed{false};
std::mutex mu;  // guards the plan and the counters: only taken while armed (tests)
Plan plan;
int64_t matching = 0;
int64_t faults = 0;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: the random mode's per-read draw
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Whether this read of `path` faults with `kinds` (a bit per Kind), counting it.
bool take(const std::string& path, unsigned kinds, Kind* kind) {
  std::lock_guard<std::mutex> lock(mu);
  if (!(kinds >> static_cast<int>(plan.kind) & 1u)) return false;
  if (!plan.path.empty() && path.find(plan.path) == std::string::npos) return false;
  const int64_t n = matching++;
  if (n < plan.after || (plan.limit >= 0 && faults >= plan.limit)) return false;
  const bool hit = plan.seed ? mix(plan.seed ^ static_cast<uint64_t>(n)) % static_cast<uint64_t>(plan.every) == 0
                             : (n - plan.after) % plan.every == 0;
  if (hit) {
    ++faults;
    *kind = plan.kind;
  }
  return hit;
}

}  // namespace

void arm(const Plan& p) {
  std::lock_guard<std::mutex> lock(mu);
  plan = p;
  if (plan.every < 1) plan.every = 1;
  matching = faults = 0;
  is_armed.store(true, std::memory_order_release);
}

void disarm() { is_armed.store(false, std::memory_order_release); }

bool armed() { return is_armed.load(std::memory_order_relaxed); }

int64_t injected() {
  std::lock_guard<std::mutex> lock(mu);
  return faults;
}

ssize_t pread(int fd, const std::string& path, void* buf, size_t count, off_t offset, size_t align) {
  Kind kind;
  constexpr unsigned kPreadKinds = 1u << static_cast<int>(Kind::kEintr) | 1u << static_cast<int>(Kind::kEagain) |
                                   1u << static_cast<int>(Kind::kShort) | 1u << static_cast<int>(Kind::kEio) |
                                   1u << static_cast<int>(Kind::kSlow);
  if (!armed() || !take(path, kPreadKinds, &kind)) return ::pread(fd, buf, count, offset);
  switch (kind) {
    case Kind::kEintr: errno = EINTR; return -1;
    case Kind::kEagain: errno = EAGAIN; return -1;
    case Kind::kEio: errno = EIO; return -1;
    case Kind::kSlow: ::usleep(kSlowReadMicroseconds); break;
    case Kind::kShort: {
      const size_t half = count / 2 / align * align;
      return ::pread(fd, buf, half ? half : count, offset);
    }
  }
  return ::pread(fd, buf, count, offset);
}

bool mapped_read_fails(const std::string& path) {
  Kind kind;
  return armed() && take(path, 1u << static_cast<int>(Kind::kEio), &kind);
}

}  // namespace fastpipe::fault
