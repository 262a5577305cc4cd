// The memory ceiling of a small-record gather on this machine, with nothing else running: k threads
// copying shuffled fixed-size records from a page-cached .npy file into batch-sized slots of 256
// records, one memcpy each, as fastpipe's readers and torch.index_select do; issue 41 compares both
// against it.
//
//   g++ -O2 -pthread -o /tmp/gather_ceiling benchmarks/gather_ceiling.cpp
//   /tmp/gather_ceiling FILE.npy RECORD_BYTES THREADS [SLOTS] [huge] [ahead=N]
//
// SLOTS (default 10) batches rotate, as a loader's read-ahead does: a slot is written again only after
// the others, so its lines are no longer in cache. SLOTS equal to THREADS gives each thread one slot it
// writes again and again, kept in its cache: what index_select gets from an allocator that hands back
// the buffer just freed. "huge" copies from an anonymous copy of the file on 2 MiB pages instead of the
// mapping: the same rate shows that the source's 4 KiB page walks are not what bounds the copy.
// "ahead=N" prefetches the lines of the record N places ahead into L2 before each copy, as fastpipe's
// gather does for records up to 4 KiB (csrc/core/file.cpp): one core's own misses in flight are what
// bound a copy of small shuffled records.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s FILE.npy RECORD_BYTES THREADS [SLOTS] [huge]\n", argv[0]);
    return 2;
  }
  const long rec = std::atol(argv[2]), batch = 256, header = 128;
  const int threads = std::atoi(argv[3]);
  bool huge = false;
  long slots = 10, ahead = 0;
  for (int a = 4; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "huge") huge = true;
    else if (arg.rfind("ahead=", 0) == 0) ahead = std::atol(arg.c_str() + 6);
    else slots = std::atol(arg.c_str());
  }
  const int fd = ::open(argv[1], O_RDONLY);
  if (fd < 0 || rec <= 0 || threads <= 0 || slots <= 0 || ahead < 0) {
    std::perror(argv[1]);
    return 2;
  }
  const off_t size = ::lseek(fd, 0, SEEK_END);
  const char* src = static_cast<const char*>(::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0));
  if (huge) {
    const size_t page = 2 << 20;
    char* p = static_cast<char*>(::mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1));
    ::madvise(p, size, MADV_HUGEPAGE);
    std::memcpy(p, src, size);
    src = p;
  }
  const long n = (size - header) / rec;
  std::vector<long> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(1));
  std::vector<char> arena(slots * batch * rec, 1);
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (long b = t; b * batch < n; b += threads) {
          char* dst = arena.data() + (b % slots) * batch * rec;
          const long k = std::min(batch, n - b * batch);
          for (long i = 0; i < k; ++i) {
            if (ahead && i + ahead < k)
              for (long o = 0; o < rec; o += 64) __builtin_prefetch(src + header + order[b * batch + i + ahead] * rec + o, 0, 2);
            std::memcpy(dst + i * rec, src + header + order[b * batch + i] * rec, rec);
          }
        }
      });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%d thread(s), %ld slots%s, prefetch %ld ahead: %.3f M records/s\n", threads, slots,
                huge ? ", 2 MiB source pages" : "", ahead, n / s / 1e6);
  }
  return 0;
}
