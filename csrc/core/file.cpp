#include "core/file.h"

#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "core/fault.h"

namespace fastpipe {
namespace {

// Small records in random order: each copy starts cold, and one core keeps too few cache misses in
// flight to reach the memory's bandwidth. Asking for the lines of the records about kPrefetchAhead
// bytes ahead (into L2) while one is copied took a 2-thread gather of shuffled records from the page
// cache (benchmarks/gather_ceiling.cpp, Intel VM) from 4.2-4.4 to 4.8-4.9 M records/s at 3 KB, 6.3 to
// 7.0 M at 2 KB (one record ahead), 10.3 to 11.6 M at 1 KB (two), 19.5 to 35 M at 256 B (eight). At
// 8 KB and more the hardware's own prefetch does as well and the requests only compete with the copy's
// (issue 41). GCC drops the prefetches of a function that only prefetches: they are written out inline.
constexpr int64_t kPrefetchLargest = 4 << 10;
constexpr int64_t kPrefetchAhead = 2 << 10;
constexpr int64_t kPrefetchMostRecords = 16;
constexpr int64_t kCacheLine = 64;

// How many records ahead of the copy to prefetch (0: none).
int64_t prefetch_distance(int64_t len) {
  if (len <= 0 || len > kPrefetchLargest) return 0;
  return std::clamp<int64_t>(kPrefetchAhead / len, 1, kPrefetchMostRecords);
}

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// SIGBUS guard. Reading a mapped page past the end of a file that shrank raises SIGBUS. A reader
// thread arms a jump buffer around its copies; the handler jumps back to it. A fault that is not ours
// goes once to the handler installed before ours (e.g. faulthandler, which prints the traceback) and
// then to the default action, which ends the process: never a loop of faults.
// volatile: the stores around a memcpy must not be optimised away (nothing in the copy reads them).
thread_local sigjmp_buf* volatile tl_guard = nullptr;
struct sigaction g_previous;
std::atomic<bool> g_chained{false};
std::mutex g_install_mu;

void sigbus_handler(int sig, siginfo_t* info, void* ctx) {
  if (sigjmp_buf* env = tl_guard) {
    tl_guard = nullptr;
    siglongjmp(*env, 1);
  }
  if (!g_chained.exchange(true)) {
    if (g_previous.sa_flags & SA_SIGINFO) {
      if (g_previous.sa_sigaction) g_previous.sa_sigaction(sig, info, ctx);
    } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
      g_previous.sa_handler(sig);
    }
  }
  // Returning re-executes the faulting access, which now terminates the process.
  signal(SIGBUS, SIG_DFL);
}

}  // namespace

void ensure_sigbus_handler() {
  std::lock_guard<std::mutex> lk(g_install_mu);
  struct sigaction cur;
  FP_SYSCALL(sigaction(SIGBUS, nullptr, &cur), std::string("reading the SIGBUS handler"));
  if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == sigbus_handler) return;
  // First use, or someone (faulthandler.enable(), say) replaced ours since: install ours on top.
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = sigbus_handler;
  // SA_NODEFER: the jump leaves the handler without restoring the signal mask, so the signal must not
  // be blocked while the handler runs or the next fault in this thread would kill the process.
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  FP_SYSCALL(sigaction(SIGBUS, &sa, &g_previous), std::string("installing the SIGBUS handler"));
}

File::File(const std::string& path, IoMode mode, bool random_access) : path_(path), mode_(mode) {
  int flags = O_RDONLY | O_CLOEXEC;
  if (mode == IoMode::kDirect) {
    fd_ = ::open(path.c_str(), flags | O_DIRECT);
    if (fd_ < 0 && errno == EINVAL) {
      fallback_reason_ = "the filesystem refuses O_DIRECT (open: EINVAL)";
    } else if (fd_ >= 0) {
      // Some filesystems accept the flag at open and refuse the first aligned read.
      AlignedBuffer probe(kDirectAlign);
      ssize_t n;
      do {
        n = ::pread(fd_, probe.data(), kDirectAlign, 0);
      } while (n < 0 && errno == EINTR);
      if (n < 0 && errno == EINVAL) {
        fallback_reason_ = "the filesystem refuses O_DIRECT reads (EINVAL)";
        ::close(fd_);
        fd_ = -1;
      }
    }
    if (!fallback_reason_.empty()) mode_ = IoMode::kPread;
  }
  if (fd_ < 0) fd_ = ::open(path.c_str(), flags);
  FP_SYSCALL(fd_, "cannot open '" + path + "'");
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    int err = errno;
    ::close(fd_);
    throw_syscall("cannot stat '" + path + "'", err, __FILE__, __LINE__);
  }
  size_at_open_ = st.st_size;
  mtime_ns_at_open_ = mtime_ns(st);
  if (mode_ == IoMode::kMmap && size_at_open_ > 0) {
    ensure_sigbus_handler();
    map_len_ = static_cast<size_t>(size_at_open_);
    void* p = ::mmap(nullptr, map_len_, PROT_READ, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd_);
      throw_syscall("cannot map '" + path + "'", err, __FILE__, __LINE__);
    }
    if (random_access) ::madvise(p, map_len_, MADV_RANDOM);
    map_ = static_cast<const char*>(p);
  }
}

File::~File() {
  if (map_) ::munmap(const_cast<char*>(map_), map_len_);
  if (fd_ >= 0) ::close(fd_);
}

void File::will_need(int64_t offset, int64_t len) const {
  // Advice only: a kernel that ignores it costs nothing but the first pass's speed.
  if (mode_ != IoMode::kDirect) ::posix_fadvise(fd_, offset, len, POSIX_FADV_WILLNEED);
}

void File::populate(int64_t offset, int64_t len) const {
#ifdef MADV_POPULATE_READ
  if (!map_ || offset >= static_cast<int64_t>(map_len_)) return;
  len = std::min<int64_t>(len, static_cast<int64_t>(map_len_) - offset);
  // Advice only; fails harmlessly (EINVAL) on kernels before 5.14, or EFAULT if the file shrank.
  ::madvise(const_cast<char*>(map_) + offset, static_cast<size_t>(len), MADV_POPULATE_READ);
#else
  (void)offset;
  (void)len;
#endif
}

int64_t File::current_size() const {
  struct stat st;
  FP_SYSCALL(::fstat(fd_, &st), "cannot stat '" + path_ + "'");
  return st.st_size;
}

int64_t File::read_at_most(void* dst, int64_t len, int64_t offset) const {
  char* out = static_cast<char*>(dst);
  int64_t got = 0;
  while (got < len) {
    const size_t want = static_cast<size_t>(len - got);
    ssize_t n = fault::armed() ? fault::pread(fd_, path_, out + got, want, offset + got,
                                              mode_ == IoMode::kDirect ? kDirectAlign : 1)
                               : ::pread(fd_, out + got, want, offset + got);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {  // a non-blocking or network filesystem: not an error, try again shortly
        sched_yield();
        continue;
      }
      int err = errno;
      throw_syscall("read of '" + path_ + "' failed at offset " + std::to_string(offset + got) + " (" +
                        std::to_string(len) + " bytes requested at " + std::to_string(offset) + ")",
                    err, __FILE__, __LINE__);
    }
    if (n == 0) break;
    got += n;
  }
  return got;
}

bool File::visit_mapped(const int64_t* offsets, int64_t count, int64_t len, MappedVisitor fn, void* ctx,
                        int64_t* done) const {
  // volatile: read after the jump back from the signal handler.
  volatile int64_t progress = 0;
  sigjmp_buf env;
  if (sigsetjmp(env, 0) != 0) {
    *done = progress;
    return false;
  }
  tl_guard = &env;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  // The prefetches are written out here: GCC inlines nothing into a function that calls sigsetjmp.
  const int64_t ahead = prefetch_distance(len);
  int64_t fetched = 0;  // records prefetched (or copied) so far
  for (int64_t k = 0; k < count; ++k) {
    progress = k;
    // A range past the mapped length would fault whatever the file holds now.
    if (offsets[k] + len > static_cast<int64_t>(map_len_) || fault::mapped_read_fails(path_)) {
      tl_guard = nullptr;
      *done = k;
      return false;
    }
    for (fetched = std::max(fetched, k + 1); ahead && fetched < count && fetched <= k + ahead; ++fetched) {
      const int64_t at = offsets[fetched];
      if (at < 0 || at + len > static_cast<int64_t>(map_len_)) continue;  // a hint stays within the mapping
      for (int64_t o = 0; o < len; o += kCacheLine) __builtin_prefetch(map_ + at + o, 0, 2);
      __builtin_prefetch(map_ + at + len - 1, 0, 2);  // a record not aligned to lines ends in one more
    }
    fn(ctx, k, map_ + offsets[k]);
  }
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tl_guard = nullptr;
  *done = count;
  return true;
}

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(bytes) {
  const size_t n = bytes ? bytes : 1;
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    throw_syscall("cannot allocate " + std::to_string(bytes) + " bytes", err, __FILE__, __LINE__);
  }
  data_ = static_cast<char*>(p);
}

AlignedBuffer::~AlignedBuffer() { ::munmap(data_, size_ ? size_ : 1); }

bool stat_path(const std::string& path, int64_t* bytes, int64_t* mtime) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  *bytes = st.st_size;
  *mtime = mtime_ns(st);
  return true;
}

}  // namespace fastpipe
