#include "core/batch_reader.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "core/error.h"
#include "core/gather_policy.h"
#include "core/process.h"
#include "core/reader_placement.h"
#include "core/reader_state.h"
#include "core/trace.h"

namespace fastpipe {
namespace {

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

}  // namespace

int64_t place_output(int64_t offset, int64_t bytes, int64_t count, int64_t align) {
  int64_t size = 0, end = 0;
  FP_CHECK_VALUE(!__builtin_mul_overflow(bytes, count, &size) && !__builtin_add_overflow(offset, size, &end) &&
                     end <= INT64_MAX - align,
                 "batch_size=" + std::to_string(count) + " is too large: one batch would exceed 2^63 bytes");
  return align_up(end, align);
}

namespace {

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  return pages > 0 ? static_cast<int64_t>(pages) * sysconf(_SC_PAGE_SIZE) : INT64_MAX;
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g GiB", static_cast<double>(bytes) / (1 << 30));
  return buf;
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

Lease::Lease(std::shared_ptr<ReaderState> state, int slot, int64_t records, uint64_t epoch)
    : state_(std::move(state)), slot_(slot), records_(records), epoch_(epoch) {}

Lease::Lease(std::shared_ptr<ReaderState> state, char* base, std::shared_ptr<void> keep, int64_t records,
             uint64_t epoch)
    : state_(std::move(state)), slot_(-1), records_(records), epoch_(epoch), external_(base), keep_(std::move(keep)) {}

Lease::~Lease() {
  if (external_) return;  // its memory goes with keep_
  ReaderState& st = *state_;
  // In a child forked while the parent's readers ran, the lock may be held by a thread that does not
  // exist here; the child never reuses the parent's slots, so leave them alone.
  if (current_pid() != st.owner_pid) return;
  if (st.opt.on_slot_release) st.opt.on_slot_release(slot_);
  std::unique_lock<std::mutex> lk(st.mu);
  --st.leased_slots;
  st.release_slot_locked(slot_);
  st.wake_reader(lk);
}

char* Lease::data(int output) const {
  return (external_ ? external_ : state_->slot_data(slot_)) + state_->outputs[output].offset;
}

const int64_t* Lease::indices() const {
  if (!state_->opt.index_output) return nullptr;
  return reinterpret_cast<const int64_t*>((external_ ? external_ : state_->slot_data(slot_)) + state_->index_offset);
}

BatchReader::BatchReader(std::vector<ColumnSpec> columns, ReaderOptions opt) : owner_pid_(current_pid()) {
  FP_CHECK_VALUE(!columns.empty(), "a loader needs at least one column");
  opt.check();
  auto st = std::make_shared<ReaderState>();
  st->opt = opt;
  st->owner_pid = owner_pid_;

  int64_t total_data = 0;
  int64_t record_bytes_total = 0;  // fixed-size bytes read per record, all columns: sizes the chunks
  bool decodes = false;
  for (const ColumnSpec& c : columns) {
    total_data += c.num_records * c.record_bytes;
    if (c.image) {
      decodes = true;
      if (c.image->source && c.image->source->packed() && !c.image->source->offsets.empty())
        total_data += c.image->source->offsets.back();
    }
  }
  const int64_t n = columns[0].num_records;
  st->num_records = n;
  const int64_t mem = mem_available_bytes();
  int64_t offset = 0;
  for (ColumnSpec& s : columns) {
    FP_CHECK_VALUE(s.num_records == n, "'" + s.path + "' has " + std::to_string(s.num_records) +
                                           " records but '" + columns[0].path + "' has " + std::to_string(n));
    FP_CHECK_VALUE(s.record_bytes >= 0, "'" + s.path + "': negative record size");
    if (s.record_bytes == 0 && !s.token_bytes && !s.image) {  // records of no bytes (shape (n, 0)): nothing to read
      st->outputs.push_back({offset, 0});
      st->column_of_spec.push_back(-1);
      continue;
    }
    st->column_of_spec.push_back(static_cast<int>(st->columns.size()));
    record_bytes_total += s.record_bytes;
    const IoMode mode = choose_mode(opt.io, s.record_bytes, total_data, mem);
    Column c = open_column(std::move(s), mode, opt.raw_outputs);
    if (c.source && !c.source->fallback_reason().empty())
      st->warnings.push_back("'" + c.spec.path + "': io='direct' unavailable, " + c.source->fallback_reason() +
                             "; using buffered reads");
    st->streams |= c.spec.image && c.spec.image->source && c.spec.image->source->stream;
    c.first_output = static_cast<int>(st->outputs.size());
    for (int k = 0; k < c.num_outputs(); ++k) {
      st->outputs.push_back({offset, c.output_record_bytes(k)});
      offset = place_output(offset, c.output_record_bytes(k), opt.batch_size, kDirectAlign);
    }
    st->columns.push_back(std::move(c));
  }
  int64_t batch_bytes = 0;
  for (const OutputLayout& o : st->outputs) batch_bytes += o.record_bytes * opt.batch_size;
  if (opt.index_output) {
    st->index_offset = offset;
    offset = place_output(offset, 8, opt.batch_size, kDirectAlign);
  }
  if (opt.prefetch == 0) opt.prefetch = default_prefetch(batch_bytes);
  if (opt.num_slots == 0) opt.num_slots = opt.prefetch + 2;
  FP_CHECK_VALUE(opt.num_slots > opt.prefetch, "num_slots must exceed prefetch");
  st->slot_bytes = std::max<int64_t>(offset, kDirectAlign);
  int64_t arena_bytes = 0;
  const int64_t memory = physical_memory_bytes();
  FP_CHECK_VALUE(!__builtin_mul_overflow(st->slot_bytes, static_cast<int64_t>(opt.num_slots), &arena_bytes) &&
                     arena_bytes <= memory,
                 "the loader's arena needs " + std::to_string(opt.num_slots) + " slots (prefetch=" +
                     std::to_string(opt.prefetch) + " + 2) of " + std::to_string(st->slot_bytes) +
                     " bytes (batch_size=" + std::to_string(opt.batch_size) + "), more than this machine's " +
                     gib(memory) + " of memory; lower batch_size or prefetch");
  st->warm_page_cache = total_data <= mem / 2;
  if (opt.gather == GatherIn::kNext) {
    opt.num_threads = std::max(opt.num_threads, 1);  // the parallel workers the chunks are sized for
    // No reader threads to warm the page cache: the kernel is asked to read ahead, not waited for, and
    // mapped pages are faulted in by the reads themselves.
    if (st->warm_page_cache)
      for (const Column& c : st->columns)
        if (c.source) warm_source(*c.source, [] { return false; }, /*populate=*/false);
    st->warm_page_cache = false;
  }
  bool any_direct = false;
  for (const Column& c : st->columns) any_direct |= c.source && c.source->mode() == IoMode::kDirect;
  if (opt.num_threads == 0)
    opt.num_threads = default_num_threads(usable_cores(), any_direct, decodes);
  st->copying_readers = !any_direct;
  st->opt = opt;
  st->chunk_records = chunk_records(opt.batch_size, opt.prefetch, opt.num_threads, record_bytes_total, decodes);
  st->share_records = share_records(record_bytes_total, decodes);

  // One allocation for every slot; touched now so that the first batches do not pay page faults.
  st->arena = std::make_unique<AlignedBuffer>(static_cast<size_t>(st->slot_bytes * opt.num_slots));
  std::memset(st->arena->data(), 0, st->arena->size());
  if (opt.on_arena_alloc) opt.on_arena_alloc(st->arena->data(), st->arena->size());
  st->slots.resize(static_cast<size_t>(opt.num_slots));
  st->free_slots = opt.num_slots;
  st->ring.assign(static_cast<size_t>(opt.prefetch), -1);
  state_ = st;
  open_ = true;
  st->cores = static_cast<int>(usable_cores());
  if (opt.gather == GatherIn::kAuto) policy_ = std::make_unique<GatherPolicy>(st->cores);
  if (opt.gather != GatherIn::kNext && st->cores >= 2) placement_ = std::make_unique<CorePlacement>(st->cores);

  BlockAsyncSignals block;
  for (int t = 0; t < (opt.gather == GatherIn::kNext ? 0 : opt.num_threads); ++t) {
    try {
      threads_.emplace_back(reader_loop, st, t);
    } catch (const std::system_error& e) {
      // Out of threads (ulimit -u, memory for stacks): the readers already started are stopped and
      // joined, or their destruction while joinable would abort the process.
      close();
      throw Error(ErrorKind::kIO,
                  "could not start reader thread " + std::to_string(t + 1) + " of num_threads=" +
                      std::to_string(opt.num_threads) + ": " + e.what() + "; lower num_threads",
                  e.code().value());
    }
    const pthread_t h = threads_.back().native_handle();
    pthread_setname_np(h, ("fastpipe-rd" + std::to_string(t)).substr(0, 15).c_str());
    // Readers are throughput work: as SCHED_BATCH they do not preempt the training thread when they
    // wake, which on a machine with few cores otherwise delays the training step by a whole chunk.
    sched_param sp{};
    pthread_setschedparam(h, SCHED_BATCH, &sp);
  }
}

BatchReader::~BatchReader() {
  if (current_pid() != owner_pid_) {
    // Forked child: the reader threads exist only in the parent; joining would block forever and
    // std::thread's destructor would abort. Their handles are abandoned on purpose.
    new std::vector<std::thread>(std::move(threads_));
    return;
  }
  close();
}

void BatchReader::check_usable() const {
  if (current_pid() != owner_pid_)
    throw Error(ErrorKind::kState,
                "this Loader was created in another process (before a fork); create a new Loader in this process");
  if (!state_ || !open_) throw Error(ErrorKind::kState, "the Loader is closed");
}

void BatchReader::close() {
  if (current_pid() != owner_pid_ || !open_) return;
  open_ = false;
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->stop = true;
  }
  state_->work_cv.notify_all();
  state_->ready_cv.notify_all();
  state_->gate_cv.notify_all();
  state_->park_cv.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
  std::lock_guard<std::mutex> lk(state_->mu);
  for (Column& c : state_->columns) c.source.reset();
}

void BatchReader::start(std::vector<int64_t> indices, bool drop_last, uint64_t epoch) {
  check_usable();
  ReaderState& st = *state_;
  auto idx = std::make_shared<const std::vector<int64_t>>(std::move(indices));
  const int64_t bs = st.opt.batch_size;
  const int64_t n = static_cast<int64_t>(idx->size());
  for (const Column& c : st.columns)
    if (c.source && c.source->mode() == IoMode::kMmap) {
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
  st.epoch = epoch;
  st.num_batches = drop_last ? n / bs : (n + bs - 1) / bs;
  st.consumed = st.next_batch = st.next_chunk = 0;
  std::fill(st.ring.begin(), st.ring.end(), -1);
  st.failure = nullptr;
  st.end_pass_locked();
  st.pass_active = true;
  st.pass_t0 = Clock::now();
  if (placement_) placement_->on_pass_start(st.pass_t0);
  st.work_cv.notify_all();
}

const std::vector<OutputLayout>& BatchReader::outputs() const { return state_->outputs; }

std::vector<std::string> BatchReader::io_modes() const {
  std::vector<std::string> out;
  for (int k : state_->column_of_spec) {
    const Column* c = k < 0 ? nullptr : &state_->columns[k];
    out.push_back(!c ? "none" : c->io_name());
  }
  return out;
}

std::vector<std::string> BatchReader::warnings() const { return state_->warnings; }

ReaderStats BatchReader::stats() const {
  const ReaderState& st = *state_;
  ReaderStats s;
  std::lock_guard<std::mutex> lk(state_->mu);
  s.batches = st.batches_out;
  s.bytes_read = st.bytes_read.load();
  s.read_seconds = st.read_ns.load() * 1e-9;
  s.wait_seconds = st.wait_s;
  s.wall_seconds = st.active_s + (st.pass_active ? seconds_since(st.pass_t0) : 0.0);
  s.arena_bytes = static_cast<int64_t>(st.arena->size());
  s.prefetch = st.opt.prefetch;
  s.num_slots = static_cast<int>(st.slots.size());
  s.slots_leased = st.leased_slots;
  s.num_threads = static_cast<int>(threads_.size());
  s.waits = st.waits;
  s.overflow_batches = st.overflow_batches;
  s.next_batches = st.next_batches;
  s.helped_chunks = st.helped_chunks;
  s.stepped_back = st.stepped_back;
  s.gathering_in_next = st.opt.gather == GatherIn::kNext || st.readers_paused;
  if (policy_ && policy_->last_step_cores() >= 0) s.step_cores = policy_->last_step_cores();
  if (st.spare_cpu >= 0) s.spare_cpu = st.spare_cpu;
  s.spared_batches = st.spared_batches;
  s.parked_readers = st.parked_readers;
  if (placement_ && placement_->last_demand() >= 0) s.reader_cores = placement_->last_demand();
  s.images_replaced = st.images_replaced.load();
  for (const Column& c : st.columns)
    if (c.spec.image && c.spec.image->fallback) s.images_pillow += c.spec.image->fallback->decoded();
  s.replaced = st.replace_log;
  return s;
}

int64_t BatchReader::images_replaced() const { return state_->images_replaced.load(); }

void BatchReader::set_poison(bool on) { state_->poison = on; }

void BatchReader::force_gather_in_next(int on) { state_->forced_gather = on; }

void BatchReader::force_spare_core(int on) { state_->forced_spare = on; }

void BatchReader::hold_reads(bool on) {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->hold_reads = on;
  }
  state_->gate_cv.notify_all();
}

int BatchReader::held_reads() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->held_reads;
}

}  // namespace fastpipe
