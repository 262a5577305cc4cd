// The consumer's side of the batch reader: next() and try_next() take the batches in order, and
// read a batch themselves where the readers do not (GatherIn::kNext, kAuto's busy steps, and a batch
// beyond the arena when the consumer holds every slot); each batch taken places the readers.
#include <cstdio>

#include "core/batch_reader.h"
#include "core/error.h"
#include "core/gather_policy.h"
#include "core/reader_placement.h"
#include "core/reader_state.h"
#include "core/trace.h"

namespace fastpipe {
namespace {

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

// How often a waiting next() runs its caller's poll (Python's signal check).
constexpr double kSignalCheckSeconds = 0.05;

}  // namespace

// With the lock held and batch `b` ready (or the engine stopped): leases it to the consumer, who waited
// `waited` seconds for it.
std::shared_ptr<Lease> BatchReader::take_locked(std::unique_lock<std::mutex>& lk, double waited) {
  ReaderState& st = *state_;
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
  auto lease = std::make_shared<Lease>(state_, s, slot.records, st.epoch);
  // The first batches of a pass are waited for whatever the readers do: not for want of a core.
  place_readers_locked(st.consumed <= BatchWindow::kSettleBatches ? 0.0 : waited);
  st.wake_reader(lk);  // the read-ahead window moved by one batch
  return lease;
}

bool BatchReader::ready_locked() const {
  const ReaderState& st = *state_;
  const int s = st.ring[st.consumed % st.opt.prefetch];
  return st.stop || (s >= 0 && st.slots[s].gen == st.gen && st.slots[s].batch == st.consumed &&
                     st.slots[s].state == SlotState::kReady);
}

std::shared_ptr<Lease> BatchReader::read_overflow_locked(std::unique_lock<std::mutex>& lk) {
  ReaderState& st = *state_;
  // No reader has started this batch: dispatching one needs a free slot, and none is.
  const int64_t b = st.consumed;
  const int64_t records = st.batch_records(b);
  const int64_t* idx = st.indices->data() + b * st.opt.batch_size;
  const auto indices = st.indices;  // keeps idx alive whatever start() does meanwhile
  const uint64_t epoch = st.epoch;
  ++st.consumed;
  ++st.batches_out;
  ++st.overflow_batches;
  st.next_batch = std::max(st.next_batch, st.consumed);
  if (st.consumed == st.num_batches) st.end_pass_locked();
  lk.unlock();
  auto [base, keep] = st.opt.overflow(st.slot_bytes);
  ThreadBuffers tb = thread_buffers(st.columns, records);
  const auto t0 = Clock::now();
  int64_t bytes = 0;
  try {
    bytes = fill_records(st, idx, records, base, 0, epoch, tb);
  } catch (...) {
    std::lock_guard<std::mutex> relock(st.mu);
    st.failure = std::current_exception();
    throw;
  }
  st.read_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  st.bytes_read += bytes;
  return std::make_shared<Lease>(state_, base, std::move(keep), records, epoch);
}

void BatchReader::fill_in_next_locked(std::unique_lock<std::mutex>& lk) {
  ReaderState& st = *state_;
  // can_fill_in_next_locked(): no reader has begun the batch asked for, and a slot is free.
  const int64_t b = st.consumed;
  st.claim_slot_locked(b);
  st.next_batch = b + 1;
  st.next_chunk = 0;
  const int s = st.ring[b % st.opt.prefetch];
  const WorkItem batch{st.gen, s, b, 0, 0, st.indices, st.epoch};
  const int64_t records = st.batch_records(b);
  const int64_t piece = st.chunk_records;
  ++st.next_batches;
  lk.unlock();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(records));  // by a piece's first record
  std::atomic<int64_t> bytes{0};
  const auto t0 = Clock::now();
  // Each worker reads an even share of the records (at least share_records), in pieces of at most a chunk (what
  // its buffers hold): shares of whole chunks split 11 chunks of ImageNet-like records 6:5 between two
  // threads, and the step's parallel region waited for the larger. Every failure stays in `errors` (the
  // slot's error, raised by take_locked), none escapes: a slot left filling would never return to the pool.
  auto body = [&](int64_t begin, int64_t end, int worker) {
    ThreadBuffers* tb = nullptr;
    for (int64_t first = begin; first < end; first += piece) {
      WorkItem w = batch;
      w.first = first;
      w.count = std::min(piece, end - first);
      int64_t n = 0;
      try {
        if (!tb) {
          std::lock_guard<std::mutex> g(st.worker_buffers_mu);
          std::unique_ptr<ThreadBuffers>& mine = st.worker_buffers[worker];
          if (!mine) mine = std::make_unique<ThreadBuffers>(thread_buffers(st.columns, st.chunk_records));
          tb = mine.get();
        }
        trace::Range range("fastpipe::loader.read");
        read_chunk(st, w, *tb, &n);
        bytes += n;
      } catch (...) {
        errors[static_cast<size_t>(first)] = std::current_exception();
      }
    }
  };
  if (st.opt.parallel_for) {
    st.opt.parallel_for(records, st.share_records, body);
  } else {
    body(0, records, 0);
  }
  st.read_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  st.bytes_read += bytes.load();
  lk.lock();
  Slot& slot = st.slots[s];
  slot.pending = 0;
  for (const std::exception_ptr& e : errors) {
    if (e) {
      slot.error = e;
      break;
    }
  }
  slot.state = SlotState::kReady;
}

// With the lock held, while next() waits for its batch: reads the next chunk no reader has taken, as
// a reader would, instead of sleeping. On a VM a sleeping consumer wakes tens of microseconds after its
// batch is ready (longer than a small batch takes to read), and its core idles meanwhile; reading, it
// comes back to its batch without a wake-up (issue 41). `any_batch`: a chunk of a later batch too, not
// only of the one it waits for. Returns false, with nothing done, when no such chunk is free to take
// (the readers have taken them), the readers are held or paused, a read may wait for a remote shard, or
// a slot is fenced before it is filled (a device or pinned loader: that host wait, on the thread that
// launches the training step's device work, would break a CUDA graph it captures).
bool BatchReader::help_locked(std::unique_lock<std::mutex>& lk, bool any_batch) {
  ReaderState& st = *state_;
  if (st.opt.gather == GatherIn::kNext || st.readers_paused || st.streams || st.opt.before_slot_fill ||
      st.hold_reads.load(std::memory_order_relaxed) || !st.has_work() || (!any_batch && st.next_batch != st.consumed))
    return false;
  const WorkItem w = take_chunk_locked(st, -1);
  std::unique_ptr<ThreadBuffers> tb = std::move(st.consumer_buffers);
  ++st.consumers_reading;
  lk.unlock();
  std::exception_ptr err;
  try {
    if (!tb) tb = std::make_unique<ThreadBuffers>(thread_buffers(st.columns, st.chunk_records));
  } catch (...) {
    err = std::current_exception();
  }
  const int64_t cpu0 = thread_cpu_ns();
  if (!err) err = read_chunk_counted(st, w, *tb);
  st.helped_cpu_ns += thread_cpu_ns() - cpu0;
  lk.lock();
  --st.consumers_reading;
  st.consumer_buffers = std::move(tb);
  ++st.helped_chunks;
  if (finish_chunk_locked(st, w, err)) st.ready_cv.notify_all();  // another thread may be in next() too
  return true;
}

std::shared_ptr<Lease> BatchReader::try_next(bool* end) {
  check_usable();
  ReaderState& st = *state_;
  std::unique_lock<std::mutex> lk(st.mu);
  if (st.failure) std::rethrow_exception(st.failure);
  *end = !st.indices || st.consumed >= st.num_batches;
  if (*end) {
    st.end_pass_locked();
    return nullptr;
  }
  gather_in_next_locked();  // pauses or resumes the readers; next() reads a batch none has begun
  if (!ready_locked()) return nullptr;
  return take_locked(lk, 0.0);
}

// With the lock held: whether next() reads the batch about to be taken itself. GatherIn::kAuto's policy
// sees each batch once (try_next() and then next() may both ask) and pauses or resumes the readers.
bool BatchReader::gather_in_next_locked() {
  ReaderState& st = *state_;
  if (st.opt.gather != GatherIn::kAuto) return st.opt.gather == GatherIn::kNext;
  if (st.batches_out == policy_batch_) return st.readers_paused;
  policy_batch_ = st.batches_out;
  const int forced = st.forced_gather.load(std::memory_order_relaxed);
  const bool in_next = forced >= 0 ? forced != 0 : policy_->on_batch(Clock::now(), st.helped_cpu_ns.load());
  if (in_next != st.readers_paused) {
    st.readers_paused = in_next;
    st.set_spare_cpu_locked(-1);  // paused, they read nothing; the next batch taken places them again
    if (placement_) placement_->restart();
    if (!in_next) st.work_cv.notify_all();
  }
  return in_next;
}

// With the lock held, for each batch taken: the core the readers keep off (reader_placement.h).
void BatchReader::place_readers_locked(double waited) {
  ReaderState& st = *state_;
  if (!placement_ || st.readers_paused) return;
  const int cpu = sched_getcpu();
  const int forced = st.forced_spare.load(std::memory_order_relaxed);
  st.set_spare_cpu_locked(forced >= 0 ? (forced ? cpu : -1)
                                      : placement_->on_batch(Clock::now(), st.read_ns.load(), waited, cpu));
  if (st.spare_cpu >= 0) ++st.spared_batches;
}

// Batch `consumed` is not ready, no reader has begun it (none is dispatched past it: batches go out in
// order), and a slot is free for it (a reader may still be filling one for an abandoned pass).
bool BatchReader::can_fill_in_next_locked() const {
  const ReaderState& st = *state_;
  return !ready_locked() && st.next_batch == st.consumed && st.next_chunk == 0 && st.free_slots > 0;
}

std::shared_ptr<Lease> BatchReader::next(double timeout_s, const std::function<void()>& poll) {
  check_usable();
  ReaderState& st = *state_;
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lk(st.mu);
  if (st.failure) std::rethrow_exception(st.failure);
  if (!st.indices || st.consumed >= st.num_batches) {
    st.end_pass_locked();
    return nullptr;
  }
  const bool in_next = gather_in_next_locked();
  if (!ready_locked() && st.leased_slots == static_cast<int>(st.slots.size())) {
    // Every slot is held by the consumer and none is being filled: nothing can progress until the
    // consumer frees one, so waiting is pointless.
    if (st.opt.overflow) return read_overflow_locked(lk);
    throw Error(ErrorKind::kTimeout,
                "all " + std::to_string(st.slots.size()) +
                    " arena slots are held by batches you still reference, so the next batch has nowhere to go "
                    "(when_full='error'). A slot is reused only after every tensor, view or numpy array of its "
                    "batch is freed: drop references to earlier batches, copy the ones you keep (batch.clone()), "
                    "create the Loader with a larger prefetch (slots = prefetch + 2), or use when_full='allocate'.");
  }
  if (in_next && can_fill_in_next_locked()) fill_in_next_locked(lk);
  // Readers that keep off the consumer's core keep up without it: a wait is one batch's stall, and a
  // chunk of a later batch read here would only delay the step. Readers that take every core are
  // behind, and next() reads whichever chunk comes next (help_locked).
  bool help_any = true;
  if (!ready_locked()) {
    ++st.waits;
    help_any = st.spare_cpu < 0;
    // While the consumer waits its core is free: the chunks readers take meanwhile may run there (the
    // first batches of a pass, a slow one). Taking the batch places them again.
    if (st.forced_spare.load(std::memory_order_relaxed) < 0) st.set_spare_cpu_locked(-1);
  }
  // The caller's poll (a pending Ctrl-C), with the lock released; what it throws ends the wait.
  auto last_poll = t0;
  auto run_poll = [&] {
    last_poll = Clock::now();
    lk.unlock();
    try {
      poll();
    } catch (...) {
      lk.lock();
      st.wait_s += seconds_since(t0);
      throw;
    }
    lk.lock();
  };
  while (!ready_locked()) {
    if (in_next && can_fill_in_next_locked()) {  // a slot of an abandoned pass was freed meanwhile
      fill_in_next_locked(lk);
      continue;
    }
    if (help_locked(lk, help_any)) {
      // Chunks of images can take a while: a Ctrl-C is still seen within kSignalCheckSeconds or so.
      if (poll && seconds_since(last_poll) >= kSignalCheckSeconds) run_poll();
      continue;
    }
    const double waited = seconds_since(t0);
    if (timeout_s >= 0 && waited >= timeout_s) {
      st.wait_s += waited;
      throw Error(ErrorKind::kTimeout, "no batch for " + fmt_seconds(timeout_s) + ": batch " +
                                           std::to_string(st.consumed) + " of this epoch is still being read (" +
                                           std::to_string(st.leased_slots) + " of " +
                                           std::to_string(st.slots.size()) +
                                           " slots held by the consumer); the storage may be stalled");
    }
    double slice = kSignalCheckSeconds;
    if (timeout_s >= 0) slice = std::min(slice, timeout_s - waited);
    st.ready_cv.wait_for(lk, std::chrono::duration<double>(slice));
    if (!ready_locked() && poll) run_poll();
  }
  const double waited = seconds_since(t0);
  st.wait_s += waited;
  return take_locked(lk, waited);
}

}  // namespace fastpipe
