#include "core/engine.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace fastpipe {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// Records smaller than this are read with no read-ahead (in random order it fetches other batches'
// pages); larger ones keep the kernel's read-ahead, which then runs within the record.
constexpr int64_t kSmallRecord = 64 << 10;
// A work item (chunk) carries at most about this many bytes (large enough for sequential records to
// coalesce into big reads), and a batch has at least one chunk per thread where it can, but no chunk
// is smaller than kMinChunkBytes: below that, handing work between threads costs more than it saves.
constexpr int64_t kChunkBytes = 1 << 20;
constexpr int64_t kMinChunkBytes = 256 << 10;
// Reader threads by default: the usable cores (compute-bound gathers), or more for O_DIRECT, whose
// threads mostly wait on the device: random record reads reach a disk's sequential bandwidth only with
// a deep queue (measured: 16 reads in flight on a virtio disk).
constexpr int kMaxDefaultThreads = 8;
constexpr int kDirectDefaultThreads = 16;
// O_DIRECT reads go through a per-thread bounce buffer of at least this size.
constexpr int64_t kBounceBytes = 4 << 20;
constexpr double kSignalCheckSeconds = 0.05;
// A reader with nothing to do checks for work this often, for this long, before it sleeps until woken.
constexpr std::chrono::microseconds kPollInterval(100);
constexpr std::chrono::milliseconds kPollFor(50);

int64_t mem_available_bytes() {
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  return pages > 0 ? static_cast<int64_t>(pages) * sysconf(_SC_PAGE_SIZE) : 0;
}

template <typename T>
void widen_tokens(const char* __restrict__ src, int64_t block, int64_t* __restrict__ x, int64_t* __restrict__ y) {
  const T* __restrict__ t = reinterpret_cast<const T*>(src);
  for (int64_t k = 0; k < block; ++k) x[k] = static_cast<int64_t>(t[k]);
  for (int64_t k = 0; k < block; ++k) y[k] = static_cast<int64_t>(t[k + 1]);
}

using WidenFn = void (*)(const char*, int64_t, int64_t*, int64_t*);

WidenFn widen_for(int bytes, bool is_signed) {
  switch (bytes) {
    case 1: return is_signed ? widen_tokens<int8_t> : widen_tokens<uint8_t>;
    case 2: return is_signed ? widen_tokens<int16_t> : widen_tokens<uint16_t>;
    case 4: return is_signed ? widen_tokens<int32_t> : widen_tokens<uint32_t>;
    case 8: return widen_tokens<int64_t>;
  }
  throw Error(ErrorKind::kValue, "token size must be 1, 2, 4 or 8 bytes, got " + std::to_string(bytes));
}

}  // namespace

const char* mode_name(FileMode m) {
  switch (m) {
    case FileMode::kMmap: return "mmap";
    case FileMode::kDirect: return "direct";
    default: return "pread";
  }
}

FileMode choose_mode(IoMode io, int64_t record_bytes, int64_t total_data_bytes, int64_t mem_available) {
  switch (io) {
    case IoMode::kMmap: return FileMode::kMmap;
    case IoMode::kPread: return FileMode::kBuffered;
    case IoMode::kDirect: return FileMode::kDirect;
    case IoMode::kAuto: break;
  }
  // Large records of data that cannot stay in the page cache are read around it (buffered reads would
  // evict other pages and then miss anyway). Otherwise a mapping: a gather is one memcpy per record,
  // without a system call, and measured faster than pread for page-cached records of every size.
  if (record_bytes >= kSmallRecord && total_data_bytes > mem_available / 2) return FileMode::kDirect;
  return FileMode::kMmap;
}

int default_num_threads(long cores, bool any_direct) {
  const int threads = static_cast<int>(std::clamp<long>(cores, 2, kMaxDefaultThreads));
  return any_direct ? std::max(threads, kDirectDefaultThreads) : threads;
}

enum class SlotState { kFree, kFilling, kReady, kLeased };

struct Slot {
  SlotState state = SlotState::kFree;
  uint64_t gen = 0;     // pass that filled it
  int64_t batch = -1;   // batch number within that pass
  int64_t records = 0;
  int pending = 0;      // chunks not finished yet
  std::exception_ptr error;
};

struct Column {
  ColumnSpec spec;
  std::unique_ptr<File> file;
  int first_output = 0;  // index into EngineState::outputs
  WidenFn widen = nullptr;
};

// Everything the reader threads and the leases share. Leases keep it (and so the arena) alive after
// the Engine is gone.
struct EngineState {
  EngineOptions opt;
  std::vector<Column> columns;  // the files read: every column whose records have bytes
  std::vector<int> column_of_spec;  // per ColumnSpec given: its index in columns, -1 when not read
  std::vector<OutputLayout> outputs;
  int64_t num_records = 0;
  std::vector<std::string> warnings;
  bool warm_page_cache = false;  // the data fits in memory: readers first queue it all for reading
  int64_t slot_bytes = 0;
  int64_t record_bytes_total = 0;  // payload bytes read per record, all columns
  int64_t chunk_records = 1;
  int64_t scratch_bytes = 0;       // per thread: token windows of one chunk
  std::unique_ptr<AlignedBuffer> arena;
  pid_t owner_pid = 0;

  std::mutex mu;
  std::condition_variable work_cv;   // reader threads: work or stop
  std::condition_variable ready_cv;  // consumer: a batch finished
  // Test hooks (Engine::set_poison, Engine::hold_reads).
  std::atomic<bool> poison{false};
  std::atomic<bool> hold_reads{false};
  int held_reads = 0;
  std::condition_variable gate_cv;   // readers held before a chunk: released or stopped
  bool stop = false;

  // Current pass.
  uint64_t gen = 0;
  std::shared_ptr<const std::vector<int64_t>> indices;
  int64_t num_batches = 0;
  int64_t consumed = 0;       // batches handed to the consumer
  int64_t next_batch = 0;     // next batch to dispatch
  int64_t next_chunk = 0;     // next chunk of next_batch
  std::vector<int> ring;      // batch b of the pass is in slot ring[b % prefetch] (-1: not assigned)
  std::exception_ptr failure; // sticky: the pass failed
  std::vector<Slot> slots;
  int free_slots = 0;
  int leased_slots = 0;

  // Statistics.
  std::atomic<int64_t> bytes_read{0};
  std::atomic<int64_t> read_ns{0};
  int64_t batches_out = 0;
  int64_t waits = 0;
  double wait_s = 0;
  double active_s = 0;  // time inside passes: from start() to the last batch taken
  bool pass_active = false;
  Clock::time_point pass_t0;

  void end_pass_locked() {
    if (pass_active) active_s += seconds_since(pass_t0);
    pass_active = false;
  }

  ~EngineState() {
    if (arena && opt.on_arena_free) opt.on_arena_free(arena->data(), arena->size());
  }

  char* slot_data(int slot) const { return arena->data() + static_cast<int64_t>(slot) * slot_bytes; }
  int64_t batch_records(int64_t b) const {
    const int64_t bs = opt.batch_size;
    return std::min<int64_t>(bs, static_cast<int64_t>(indices->size()) - b * bs);
  }
  int64_t batch_chunks(int64_t b) const { return (batch_records(b) + chunk_records - 1) / chunk_records; }

  bool has_work() const {
    if (!indices || next_batch >= num_batches || next_batch >= consumed + opt.prefetch) return false;
    return next_chunk > 0 || free_slots > 0;
  }

  void release_slot_locked(int s) {
    Slot& slot = slots[s];
    slot.state = SlotState::kFree;
    slot.error = nullptr;
    ++free_slots;
  }

  // Waking a sleeping thread costs its waker tens of microseconds on a virtual machine (an
  // inter-processor interrupt), far more than the rest of next(). So the training thread does not wake
  // readers while one of them is polling: that reader finds the freed slot within kPollInterval and
  // wakes the others itself, in a chain. Only when every reader sleeps (the loader sat idle for
  // kPollFor) does a release or next() wake one. Called with the lock held; returns with it released.
  int pollers = 0;

  void wake_reader(std::unique_lock<std::mutex>& lk) {
    const bool wake = pollers == 0 && has_work();
    lk.unlock();
    if (wake) work_cv.notify_one();
  }

  // Reader side: blocks until there is work or the engine stops. At most one reader polls.
  void wait_for_work(std::unique_lock<std::mutex>& lk) {
    if (stop || has_work()) return;
    if (pollers == 0) {
      ++pollers;
      const auto until = Clock::now() + kPollFor;
      while (!stop && !has_work() && Clock::now() < until) work_cv.wait_for(lk, kPollInterval);
      --pollers;
    }
    work_cv.wait(lk, [&] { return stop || has_work(); });
  }
};

struct WorkItem {
  uint64_t gen;
  int slot;
  int64_t batch;
  int64_t first;  // first record of the chunk within the batch
  int64_t count;
  std::shared_ptr<const std::vector<int64_t>> indices;
};

namespace {

std::string record_context(const Column& c, int64_t record) {
  return "'" + c.spec.path + "': record " + std::to_string(record) + " (offset " +
         std::to_string(c.spec.data_offset + record * c.spec.record_stride) + ", " +
         std::to_string(c.spec.record_bytes) + " bytes)";
}

[[noreturn]] void throw_shrunk(const Column& c, int64_t record) {
  int64_t now = -1;
  try {
    now = c.file->current_size();
  } catch (const Error&) {
  }
  throw Error(ErrorKind::kIO, "cannot read " + record_context(c, record) + ": the file is now " +
                                  std::to_string(now) + " bytes, it was " + std::to_string(c.file->size_at_open()) +
                                  " when the loader opened it (it was truncated or replaced while being read)");
}

// Per-thread buffers, allocated once per thread.
struct ThreadBuffers {
  std::unique_ptr<AlignedBuffer> bounce;   // O_DIRECT
  std::unique_ptr<AlignedBuffer> scratch;  // token windows read with pread, before widening
  std::vector<int64_t> offsets;
  std::vector<int64_t> order;
};

// Where record k of a chunk lands in the slot: raw columns copy its bytes to dst + k * stride; token
// columns widen them into x at dst + k * stride and y at y_delta further.
struct Sink {
  const Column* col;
  char* dst;
  int64_t stride;
  int64_t y_delta;
  void put(int64_t k, const char* src) const {
    char* out = dst + k * stride;
    if (col->widen)
      col->widen(src, stride / 8, reinterpret_cast<int64_t*>(out), reinterpret_cast<int64_t*>(out + y_delta));
    else
      std::memcpy(out, src, static_cast<size_t>(stride));
  }
};

// Reads records idx[0..count) of column c into `sink`.
void read_records(const Column& c, const int64_t* idx, int64_t count, const Sink& sink, ThreadBuffers& tb) {
  const ColumnSpec& s = c.spec;
  const int64_t len = s.record_bytes;
  tb.offsets.resize(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) tb.offsets[k] = s.data_offset + idx[k] * s.record_stride;
  const int64_t* off = tb.offsets.data();

  if (c.file->mode() == FileMode::kMmap) {
    int64_t done = 0;
    auto visit = [](void* ctx, int64_t k, const char* src) { static_cast<const Sink*>(ctx)->put(k, src); };
    if (!c.file->visit_mapped(off, count, len, visit, const_cast<Sink*>(&sink), &done)) throw_shrunk(c, idx[done]);
  } else {
    // Sorted by file offset: sequential runs become one request, and the disk sees ascending offsets.
    tb.order.resize(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) tb.order[k] = k;
    std::sort(tb.order.begin(), tb.order.end(), [&](int64_t a, int64_t b) { return off[a] < off[b]; });
    const int64_t* ord = tb.order.data();
    const bool direct = c.file->mode() == FileMode::kDirect;
    int64_t i = 0;
    while (i < count) {
      int64_t j = i + 1;
      if (direct) {
        // Records whose aligned extents touch share one aligned read through the bounce buffer.
        const int64_t start = off[ord[i]] / kDirectAlign * kDirectAlign;
        int64_t end = align_up(off[ord[i]] + len, kDirectAlign);
        while (j < count) {
          const int64_t e = align_up(off[ord[j]] + len, kDirectAlign);
          if (off[ord[j]] / kDirectAlign * kDirectAlign > end || e - start > static_cast<int64_t>(tb.bounce->size()))
            break;
          end = std::max(end, e);
          ++j;
        }
        const int64_t got = c.file->read_at_most(tb.bounce->data(), end - start, start);
        for (int64_t k = i; k < j; ++k) {
          if (off[ord[k]] + len - start > got) throw_shrunk(c, idx[ord[k]]);
          sink.put(ord[k], tb.bounce->data() + (off[ord[k]] - start));
        }
      } else {
        // Adjacent in the file and in the batch (sequential order): one pread for the run, straight
        // into the slot for raw columns.
        while (j < count && off[ord[j]] == off[ord[i]] + (j - i) * len && ord[j] == ord[i] + (j - i)) ++j;
        const int64_t want = (j - i) * len;
        char* buf = c.widen ? tb.scratch->data() : sink.dst + ord[i] * sink.stride;
        const int64_t got = c.file->read_at_most(buf, want, off[ord[i]]);
        if (got < want) throw_shrunk(c, idx[ord[i + got / len]]);
        if (c.widen)
          for (int64_t k = i; k < j; ++k) sink.put(ord[k], buf + (k - i) * len);
      }
      i = j;
    }
  }
  // A mapping of a file that shrank reads zeros in the last page instead of faulting, and a pread
  // can race with truncation: confirm the file still covers every record read.
  int64_t max_k = 0;
  for (int64_t k = 1; k < count; ++k)
    if (off[k] > off[max_k]) max_k = k;
  if (count && c.file->current_size() < off[max_k] + len) throw_shrunk(c, idx[max_k]);
}

void read_chunk(EngineState& st, const WorkItem& w, ThreadBuffers& tb) {
  const int64_t* idx = w.indices->data() + w.batch * st.opt.batch_size + w.first;
  const int64_t n = st.num_records;
  for (int64_t k = 0; k < w.count; ++k) {
    if (idx[k] < 0 || idx[k] >= n)
      throw Error(ErrorKind::kValue, "record index " + std::to_string(idx[k]) + " is out of range for a dataset of " +
                                         std::to_string(n) + " records");
  }
  char* base = st.slot_data(w.slot);
  if (st.opt.before_slot_fill) st.opt.before_slot_fill(w.slot);
  if (st.poison.load(std::memory_order_relaxed))
    for (const OutputLayout& out : st.outputs)
      std::memset(base + out.offset + w.first * out.record_bytes, 0xA5, static_cast<size_t>(w.count * out.record_bytes));
  for (const Column& c : st.columns) {
    const OutputLayout& out = st.outputs[c.first_output];
    const int64_t y_delta = c.widen ? st.outputs[c.first_output + 1].offset - out.offset : 0;
    read_records(c, idx, w.count, Sink{&c, base + out.offset + w.first * out.record_bytes, out.record_bytes, y_delta}, tb);
  }
}

// Queues a whole file for reading into the page cache, one read-ahead window per call, so that the
// first pass over data that was not cached reads sequentially instead of one page per random record;
// then maps every page of a mapped file, so that no record pays a page fault on first touch (small
// records are mapped without fault-around). Thread t takes the files t, t + threads, ...; it stops
// early when the engine closes.
constexpr int64_t kWarmStep = 8 << 20;

void warm_files(EngineState& st, int thread_index) {
  auto stopped = [&] {
    std::lock_guard<std::mutex> lk(st.mu);
    return st.stop;
  };
  for (size_t k = thread_index; k < st.columns.size(); k += st.opt.num_threads) {
    const File& f = *st.columns[k].file;
    for (int64_t off = 0; off < f.size_at_open(); off += kWarmStep) {
      if (stopped()) return;
      f.will_need(off, kWarmStep);
    }
    for (int64_t off = 0; f.mode() == FileMode::kMmap && off < f.size_at_open(); off += kWarmStep) {
      if (stopped()) return;
      f.populate(off, kWarmStep);
    }
  }
}

void reader_loop(std::shared_ptr<EngineState> sp, int thread_index) {
  EngineState& st = *sp;
  ThreadBuffers tb;
  // The bounce buffer holds at least one whole aligned record of any O_DIRECT column.
  int64_t bounce = 0;
  for (const Column& c : st.columns)
    if (c.file->mode() == FileMode::kDirect)
      bounce = std::max({bounce, kBounceBytes, align_up(c.spec.record_bytes, kDirectAlign) + 2 * kDirectAlign});
  if (bounce) tb.bounce = std::make_unique<AlignedBuffer>(static_cast<size_t>(bounce));
  if (st.scratch_bytes) tb.scratch = std::make_unique<AlignedBuffer>(static_cast<size_t>(st.scratch_bytes));
  if (st.warm_page_cache) warm_files(st, thread_index);

  std::unique_lock<std::mutex> lk(st.mu);
  for (;;) {
    st.wait_for_work(lk);
    if (st.stop) return;
    WorkItem w;
    w.gen = st.gen;
    w.batch = st.next_batch;
    w.indices = st.indices;
    const int64_t nchunks = st.batch_chunks(w.batch);
    int& ring_slot = st.ring[w.batch % st.opt.prefetch];
    if (st.next_chunk == 0) {
      int s = 0;
      while (st.slots[s].state != SlotState::kFree) ++s;
      Slot& slot = st.slots[s];
      slot.state = SlotState::kFilling;
      slot.gen = st.gen;
      slot.batch = w.batch;
      slot.records = st.batch_records(w.batch);
      slot.pending = static_cast<int>(nchunks);
      slot.error = nullptr;
      --st.free_slots;
      ring_slot = s;
    }
    w.slot = ring_slot;
    w.first = st.next_chunk * st.chunk_records;
    w.count = std::min(st.chunk_records, st.batch_records(w.batch) - w.first);
    if (++st.next_chunk == nchunks) {
      st.next_chunk = 0;
      ++st.next_batch;
    }
    const bool more = st.has_work();  // hand the rest to a sleeping reader, whoever is polling
    if (st.hold_reads.load(std::memory_order_relaxed)) {  // test hook: a stalled read, until released
      ++st.held_reads;
      st.gate_cv.wait(lk, [&] { return st.stop || !st.hold_reads; });
      --st.held_reads;
      if (st.stop) return;
    }
    lk.unlock();
    if (more) st.work_cv.notify_one();

    std::exception_ptr err;
    const auto t0 = Clock::now();
    try {
      read_chunk(st, w, tb);
    } catch (...) {
      err = std::current_exception();
    }
    st.read_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    if (!err) st.bytes_read += w.count * st.record_bytes_total;

    lk.lock();
    Slot& slot = st.slots[w.slot];
    if (err && !slot.error) slot.error = err;
    if (--slot.pending == 0) {
      if (slot.gen != st.gen) {
        st.release_slot_locked(w.slot);  // the pass it belonged to was abandoned
      } else {
        slot.state = SlotState::kReady;
        lk.unlock();
        st.ready_cv.notify_one();
        lk.lock();
      }
    }
  }
}

// Worker threads must not take process signals such as SIGINT (Python handles those in the main
// thread); synchronous faults (SIGBUS, SIGSEGV) are still delivered to the thread that caused them.
class BlockAsyncSignals {
 public:
  BlockAsyncSignals() {
    sigset_t all;
    sigfillset(&all);
    for (int s : {SIGBUS, SIGSEGV, SIGFPE, SIGILL}) sigdelset(&all, s);
    pthread_sigmask(SIG_BLOCK, &all, &old_);
  }
  ~BlockAsyncSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

}  // namespace

Lease::Lease(std::shared_ptr<EngineState> state, int slot, int64_t records)
    : state_(std::move(state)), slot_(slot), records_(records) {}

Lease::~Lease() {
  EngineState& st = *state_;
  // In a child forked while the parent's readers ran, the lock may be held by a thread that does not
  // exist here; the child never reuses the parent's slots, so leave them alone.
  if (getpid() != st.owner_pid) return;
  if (st.opt.on_slot_release) st.opt.on_slot_release(slot_);
  std::unique_lock<std::mutex> lk(st.mu);
  --st.leased_slots;
  st.release_slot_locked(slot_);
  st.wake_reader(lk);
}

char* Lease::data(int output) const { return state_->slot_data(slot_) + state_->outputs[output].offset; }

Engine::Engine(std::vector<ColumnSpec> columns, EngineOptions opt) : owner_pid_(getpid()) {
  FP_CHECK_VALUE(!columns.empty(), "a loader needs at least one column");
  FP_CHECK_VALUE(opt.batch_size >= 1, "batch_size must be at least 1, got " + std::to_string(opt.batch_size));
  FP_CHECK_VALUE(opt.num_threads >= 0, "num_threads must be at least 1 (0: automatic), got " +
                                          std::to_string(opt.num_threads));
  FP_CHECK_VALUE(opt.prefetch >= 1, "prefetch must be at least 1, got " + std::to_string(opt.prefetch));
  FP_CHECK_VALUE(opt.num_slots > opt.prefetch, "num_slots must exceed prefetch");
  auto st = std::make_shared<EngineState>();
  st->opt = opt;
  st->owner_pid = owner_pid_;

  int64_t total_data = 0;
  for (const ColumnSpec& s : columns) total_data += s.num_records * s.record_bytes;
  const int64_t n = columns[0].num_records;
  st->num_records = n;
  int64_t offset = 0;
  for (ColumnSpec& s : columns) {
    FP_CHECK_VALUE(s.num_records == n, "'" + s.path + "' has " + std::to_string(s.num_records) +
                                           " records but '" + columns[0].path + "' has " + std::to_string(n));
    FP_CHECK_VALUE(s.record_bytes >= 0, "'" + s.path + "': negative record size");
    if (s.record_bytes == 0 && !s.token_bytes) {  // records of no bytes (shape (n, 0)): nothing to read
      st->outputs.push_back({offset, 0});
      st->column_of_spec.push_back(-1);
      continue;
    }
    st->column_of_spec.push_back(static_cast<int>(st->columns.size()));
    Column c;
    c.first_output = static_cast<int>(st->outputs.size());
    if (s.token_bytes) {
      c.widen = widen_for(s.token_bytes, s.token_signed);
      FP_CHECK_VALUE(s.record_bytes % s.token_bytes == 0 && s.record_bytes / s.token_bytes >= 2,
                     "'" + s.path + "': a token window needs at least 2 whole tokens");
      const int64_t block = s.record_bytes / s.token_bytes - 1;
      for (int k = 0; k < 2; ++k) {
        st->outputs.push_back({offset, block * 8});
        offset = align_up(offset + block * 8 * opt.batch_size, kDirectAlign);
      }
    } else {
      st->outputs.push_back({offset, s.record_bytes});
      offset = align_up(offset + s.record_bytes * opt.batch_size, kDirectAlign);
    }
    st->record_bytes_total += s.record_bytes;
    c.file = std::make_unique<File>(s.path, choose_mode(opt.io, s.record_bytes, total_data, mem_available_bytes()),
                                    s.record_bytes < kSmallRecord);
    if (!c.file->fallback_reason().empty())
      st->warnings.push_back("'" + s.path + "': io='direct' unavailable, " + c.file->fallback_reason() +
                             "; using buffered reads");
    const int64_t need = s.data_offset + (n - 1) * s.record_stride + s.record_bytes;
    FP_CHECK_VALUE(c.file->size_at_open() >= need, "'" + s.path + "' is " + std::to_string(c.file->size_at_open()) +
                                                        " bytes but its " + std::to_string(n) + " records need " +
                                                        std::to_string(need));
    c.spec = std::move(s);
    st->columns.push_back(std::move(c));
  }
  st->slot_bytes = std::max<int64_t>(offset, kDirectAlign);
  st->warm_page_cache = total_data <= mem_available_bytes() / 2;
  if (opt.num_threads == 0) {
    cpu_set_t set;
    const long cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
    bool any_direct = false;
    for (const Column& c : st->columns) any_direct |= c.file->mode() == FileMode::kDirect;
    opt.num_threads = default_num_threads(cores, any_direct);
    st->opt.num_threads = opt.num_threads;
  }
  {
    const int64_t per_thread = (opt.batch_size + opt.num_threads - 1) / opt.num_threads;
    const int64_t record_bytes = std::max<int64_t>(1, st->record_bytes_total);
    const int64_t at_least = std::max<int64_t>(1, kMinChunkBytes / record_bytes);
    const int64_t at_most = std::max<int64_t>(1, kChunkBytes / record_bytes);
    st->chunk_records = std::min(at_most, std::max(at_least, per_thread));
  }
  for (const Column& c : st->columns)
    if (c.widen && c.file->mode() == FileMode::kBuffered)  // pread lands token windows here before widening
      st->scratch_bytes = std::max(st->scratch_bytes, st->chunk_records * c.spec.record_bytes);

  // One allocation for every slot; touched now so that the first batches do not pay page faults.
  st->arena = std::make_unique<AlignedBuffer>(static_cast<size_t>(st->slot_bytes * opt.num_slots));
  std::memset(st->arena->data(), 0, st->arena->size());
  if (opt.on_arena_alloc) opt.on_arena_alloc(st->arena->data(), st->arena->size());
  st->slots.resize(static_cast<size_t>(opt.num_slots));
  st->free_slots = opt.num_slots;
  st->ring.assign(static_cast<size_t>(opt.prefetch), -1);
  state_ = st;

  BlockAsyncSignals block;
  for (int t = 0; t < opt.num_threads; ++t) {
    threads_.emplace_back(reader_loop, st, t);
    const pthread_t h = threads_.back().native_handle();
    pthread_setname_np(h, ("fastpipe-rd" + std::to_string(t)).substr(0, 15).c_str());
    // Readers are throughput work: as SCHED_BATCH they do not preempt the training thread when they
    // wake, which on a machine with few cores otherwise delays the training step by a whole chunk.
    sched_param sp{};
    pthread_setschedparam(h, SCHED_BATCH, &sp);
  }
}

Engine::~Engine() {
  if (getpid() != owner_pid_) {
    // Forked child: the reader threads exist only in the parent; joining would block forever and
    // std::thread's destructor would abort. Their handles are abandoned on purpose.
    new std::vector<std::thread>(std::move(threads_));
    return;
  }
  close();
}

void Engine::check_usable() const {
  if (getpid() != owner_pid_)
    throw Error(ErrorKind::kState,
                "this Loader was created in another process (before a fork); create a new Loader in this process");
  if (!state_ || threads_.empty()) throw Error(ErrorKind::kState, "the Loader is closed");
}

void Engine::close() {
  if (getpid() != owner_pid_ || threads_.empty()) return;
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->stop = true;
  }
  state_->work_cv.notify_all();
  state_->ready_cv.notify_all();
  state_->gate_cv.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
  std::lock_guard<std::mutex> lk(state_->mu);
  for (Column& c : state_->columns) c.file.reset();
}

void Engine::start(std::vector<int64_t> indices, bool drop_last) {
  check_usable();
  EngineState& st = *state_;
  auto idx = std::make_shared<const std::vector<int64_t>>(std::move(indices));
  const int64_t bs = st.opt.batch_size;
  const int64_t n = static_cast<int64_t>(idx->size());
  for (const Column& c : st.columns)
    if (c.file->mode() == FileMode::kMmap) {
      ensure_sigbus_handler();
      break;
    }
  std::lock_guard<std::mutex> lk(st.mu);
  ++st.gen;
  // Finished batches of an abandoned pass go back to the pool; slots still filling are freed by the
  // reader that finishes them (it sees the pass number changed). Leased slots stay with the consumer.
  for (int s = 0; s < static_cast<int>(st.slots.size()); ++s)
    if (st.slots[s].state == SlotState::kReady) st.release_slot_locked(s);
  st.indices = idx;
  st.num_batches = drop_last ? n / bs : (n + bs - 1) / bs;
  st.consumed = st.next_batch = st.next_chunk = 0;
  std::fill(st.ring.begin(), st.ring.end(), -1);
  st.failure = nullptr;
  st.end_pass_locked();
  st.pass_active = true;
  st.pass_t0 = Clock::now();
  st.work_cv.notify_all();
}

// With the lock held and batch `b` ready (or the engine stopped): leases it to the consumer.
std::shared_ptr<Lease> Engine::take_locked(std::unique_lock<std::mutex>& lk) {
  EngineState& st = *state_;
  if (st.stop) throw Error(ErrorKind::kState, "the Loader is closed");
  const int s = st.ring[st.consumed % st.opt.prefetch];
  Slot& slot = st.slots[s];
  if (slot.error) {
    st.failure = slot.error;
    st.release_slot_locked(s);
    st.wake_reader(lk);
    std::rethrow_exception(st.failure);
  }
  slot.state = SlotState::kLeased;
  ++st.leased_slots;
  ++st.consumed;
  ++st.batches_out;
  if (st.consumed == st.num_batches) st.end_pass_locked();
  auto lease = std::make_shared<Lease>(state_, s, slot.records);
  st.wake_reader(lk);  // the read-ahead window moved by one batch
  return lease;
}

bool Engine::ready_locked() const {
  const EngineState& st = *state_;
  const int s = st.ring[st.consumed % st.opt.prefetch];
  return st.stop || (s >= 0 && st.slots[s].gen == st.gen && st.slots[s].batch == st.consumed &&
                     st.slots[s].state == SlotState::kReady);
}

std::shared_ptr<Lease> Engine::try_next(bool* end) {
  check_usable();
  EngineState& st = *state_;
  std::unique_lock<std::mutex> lk(st.mu);
  if (st.failure) std::rethrow_exception(st.failure);
  *end = !st.indices || st.consumed >= st.num_batches;
  if (*end) st.end_pass_locked();
  if (*end || !ready_locked()) return nullptr;
  return take_locked(lk);
}

std::shared_ptr<Lease> Engine::next(double timeout_s, const std::function<void()>& poll) {
  check_usable();
  EngineState& st = *state_;
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lk(st.mu);
  if (st.failure) std::rethrow_exception(st.failure);
  if (!st.indices || st.consumed >= st.num_batches) {
    st.end_pass_locked();
    return nullptr;
  }
  if (!ready_locked()) ++st.waits;
  while (!ready_locked()) {
    const double waited = seconds_since(t0);
    if (timeout_s >= 0 && waited >= timeout_s) {
      st.wait_s += waited;
      if (st.leased_slots == static_cast<int>(st.slots.size()))
        throw Error(ErrorKind::kTimeout,
                    "no batch for " + fmt_seconds(timeout_s) + ": all " + std::to_string(st.slots.size()) +
                        " arena slots are held by batches you still reference (" + std::to_string(st.leased_slots) +
                        " held). A slot is reused only after every tensor, view or numpy array of its batch is "
                        "freed: drop references to earlier batches, copy the ones you keep (batch.clone()), or "
                        "create the Loader with a larger prefetch (slots = prefetch + 2).");
      throw Error(ErrorKind::kTimeout, "no batch for " + fmt_seconds(timeout_s) + ": batch " +
                                           std::to_string(st.consumed) + " of this epoch is still being read (" +
                                           std::to_string(st.leased_slots) + " of " +
                                           std::to_string(st.slots.size()) +
                                           " slots held by the consumer); the storage may be stalled");
    }
    double slice = kSignalCheckSeconds;
    if (timeout_s >= 0) slice = std::min(slice, timeout_s - waited);
    st.ready_cv.wait_for(lk, std::chrono::duration<double>(slice));
    if (!ready_locked() && poll) {
      lk.unlock();
      try {
        poll();
      } catch (...) {
        lk.lock();
        st.wait_s += seconds_since(t0);
        throw;
      }
      lk.lock();
    }
  }
  st.wait_s += seconds_since(t0);
  return take_locked(lk);
}

const std::vector<OutputLayout>& Engine::outputs() const { return state_->outputs; }

std::vector<std::string> Engine::io_modes() const {
  std::vector<std::string> out;
  for (int k : state_->column_of_spec) {
    const Column* c = k < 0 ? nullptr : &state_->columns[k];
    out.push_back(!c ? "none" : c->file ? mode_name(c->file->mode()) : "closed");
  }
  return out;
}

std::vector<std::string> Engine::warnings() const { return state_->warnings; }

int64_t Engine::num_batches() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->num_batches;
}

EngineStats Engine::stats() const {
  const EngineState& st = *state_;
  EngineStats s;
  std::lock_guard<std::mutex> lk(state_->mu);
  s.batches = st.batches_out;
  s.bytes_read = st.bytes_read.load();
  s.read_seconds = st.read_ns.load() * 1e-9;
  s.wait_seconds = st.wait_s;
  s.wall_seconds = st.active_s + (st.pass_active ? seconds_since(st.pass_t0) : 0.0);
  s.arena_bytes = static_cast<int64_t>(st.arena->size());
  s.num_slots = static_cast<int>(st.slots.size());
  s.slots_leased = st.leased_slots;
  s.num_threads = static_cast<int>(threads_.size());
  s.waits = st.waits;
  return s;
}

void Engine::set_poison(bool on) { state_->poison = on; }

void Engine::hold_reads(bool on) {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->hold_reads = on;
  }
  state_->gate_cv.notify_all();
}

int Engine::held_reads() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->held_reads;
}

}  // namespace fastpipe
