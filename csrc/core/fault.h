// Test-only faults in the file layer's reads, for the reliability tests: armed through a private
// binding (fastpipe._C._fault_arm), never by the environment, so no user can trip them. Disarmed, a
// read pays one relaxed atomic load.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace fastpipe::fault {

enum class Kind {
  kEintr,   // pread fails with EINTR (a signal arrived): retried
  kEagain,  // pread fails with EAGAIN (non-blocking or network filesystems): retried
  kShort,   // pread returns fewer bytes than asked, not at end of file: the rest is read next
  kEio,     // pread fails with EIO, a mapped page cannot be read: the batch fails
  kSlow,    // pread waits kSlowReadMicroseconds first: a device's latency, which readers wait out off the cores
};

constexpr int64_t kSlowReadMicroseconds = 1000;

struct Plan {
  Kind kind = Kind::kEintr;
  std::string path;    // only reads of files whose path contains this ("": every file)
  int64_t every = 1;   // one matching read in `every` faults (with a seed: each with probability 1/every)
  int64_t after = 0;   // the first `after` matching reads never fault
  int64_t limit = -1;  // at most this many faults (-1: no limit)
  uint64_t seed = 0;   // nonzero: random faults from this seed instead of every `every`-th read
};

void arm(const Plan& plan);
void disarm();
bool armed();
int64_t injected();  // faults injected since the last arm()

// File::read_at_most's pread under the plan: -1 with errno set, a read of fewer bytes (at most half of
// `count`, rounded down to `align`, which O_DIRECT needs), the plain pread after a wait, or the plain pread.
ssize_t pread(int fd, const std::string& path, void* buf, size_t count, off_t offset, size_t align);

// Whether a read of `path` through its mapping faults now (kEio on an mmap file: the SIGBUS of a page
// that cannot be read).
bool mapped_read_fails(const std::string& path);

}  // namespace fastpipe::fault
