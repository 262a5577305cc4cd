// The batch reader's internals, shared by the consumer side (batch_reader.cpp: slots, passes, leases)
// and the reader threads (reader_thread.cpp: what a thread does with a chunk). Not part of the API.
#pragma once

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/batch_reader.h"

namespace fastpipe {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU time of the calling thread.
inline int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// A reader with nothing to do checks for work this often, for this long, before it sleeps until woken.
constexpr std::chrono::microseconds kPollInterval(100);
constexpr std::chrono::milliseconds kPollFor(50);
// Replacements kept for stats(), and substitutes drawn for one bad image before the read fails.
constexpr size_t kReplaceLogSize = 64;
constexpr int kMaxSubstitutes = 16;

enum class SlotState { kFree, kFilling, kReady, kLeased };

struct Slot {
  SlotState state = SlotState::kFree;
  uint64_t gen = 0;     // pass that filled it
  int64_t batch = -1;   // batch number within that pass
  int64_t records = 0;
  int pending = 0;      // chunks not finished yet
  int filler = -1;      // the reader thread that claimed it last (-1: next())
  std::exception_ptr error;
};

// Everything the reader threads and the leases share. Leases keep it (and so the arena) alive after
// the BatchReader is gone.
struct ReaderState {
  ReaderOptions opt;
  std::vector<Column> columns;  // the files read: every column whose records have bytes
  std::vector<int> column_of_spec;  // per ColumnSpec given: its index in columns, -1 when not read
  std::vector<OutputLayout> outputs;
  int64_t num_records = 0;
  std::vector<std::string> warnings;
  bool warm_page_cache = false;  // the data fits in memory: readers first queue it all for reading
  // A column streams remote shards: a read may wait for one to arrive, which only a reader thread (its
  // SourceWaitCancel) can end; next() then never reads a chunk itself while it waits.
  bool streams = false;
  int64_t slot_bytes = 0;
  int64_t index_offset = 0;  // of the sample indices in a slot (ReaderOptions::index_output)
  int64_t chunk_records = 1;
  int64_t share_records = 1;  // next()'s smallest share of a batch it reads itself, per torch thread
  std::unique_ptr<AlignedBuffer> arena;
  pid_t owner_pid = 0;
  // GatherIn::kNext and kAuto: each parallel worker's buffers, made at its first chunk.
  std::mutex worker_buffers_mu;
  std::map<int, std::unique_ptr<ThreadBuffers>> worker_buffers;
  // The consumer's buffers for the chunks it reads while waiting (taken out, under the lock, while used).
  std::unique_ptr<ThreadBuffers> consumer_buffers;

  std::mutex mu;
  std::condition_variable work_cv;   // reader threads: work or stop
  std::condition_variable ready_cv;  // consumer: a batch finished
  // Test hooks (BatchReader::set_poison, BatchReader::hold_reads).
  std::atomic<bool> poison{false};
  std::atomic<bool> hold_reads{false};
  std::atomic<int> forced_gather{-1};
  std::atomic<int> forced_spare{-1};
  int held_reads = 0;
  std::condition_variable gate_cv;   // readers held before a chunk: released or stopped
  bool stop = false;

  // Current pass.
  uint64_t gen = 0;
  std::shared_ptr<const std::vector<int64_t>> indices;
  uint64_t epoch = 0;  // of the pass: the transforms' random choices depend on it
  int64_t num_batches = 0;
  int64_t consumed = 0;       // batches handed to the consumer
  int64_t next_batch = 0;     // next batch to dispatch
  int64_t next_chunk = 0;     // next chunk of next_batch
  std::vector<int> ring;      // batch b of the pass is in slot ring[b % prefetch] (-1: not assigned)
  std::exception_ptr failure; // sticky: the pass failed
  std::vector<Slot> slots;
  int free_slots = 0;
  int leased_slots = 0;
  // GatherIn::kAuto: next() reads the batches, the readers take no new one (they finish the batch
  // they are dispatching, so that next() never waits on a batch nobody reads).
  bool readers_paused = false;
  // The core the readers keep off: the consumer's, while they keep up without it (reader_placement.h;
  // -1: none, also while the consumer waits in next()). Each reader applies it to itself when it takes
  // its next chunk.
  int spare_cpu = -1;
  // While the readers keep off the consumer's core, those beyond the cores left to them wait on park_cv
  // (parked): readers that take turns on one core only add switches and wake-ups between them, which
  // cost the training step beside them (a token batch's 78 us step: +0.6-1.6 points with two readers on
  // 2 cores against one). Not where a column is read with O_DIRECT (copying_readers: those threads wait on
  // the device). A change of spare_cpu wakes the readers it parks (where the last one may) or lets read;
  // it comes with a placement's decision or a wait of the consumer, not with each batch.
  std::condition_variable park_cv;
  int parked_readers = 0;
  bool parked(int reader) const { return copying_readers && spare_cpu >= 0 && reader >= cores - 1; }
  void set_spare_cpu_locked(int cpu) {
    const bool was_spared = spare_cpu >= 0;
    spare_cpu = cpu;
    if (!was_spared && parked(opt.num_threads - 1)) work_cv.notify_all();
    if (was_spared && cpu < 0 && parked_readers > 0) park_cv.notify_all();
  }
  // Threads reading chunks now: readers, and next() (help_locked). A reader that would make them more
  // than the cores steps back to polling while next() reads (reader_loop): three threads copying on two
  // cores lose 4-10% to switching between them, and next() is the reader that must not wait. Only where
  // the readers copy (copying_readers: no column read with O_DIRECT; those threads wait on the device,
  // whose random reads need many in flight: stepping back, 16 readers kept about 2 reads in flight, 63%
  // of dd's sequential rate), as parking.
  int cores = 1;
  bool copying_readers = true;
  int readers_reading = 0;
  int consumers_reading = 0;  // threads in next() reading a chunk (more than one may call next())

  // Statistics.
  std::atomic<int64_t> bytes_read{0};
  std::atomic<int64_t> images_replaced{0};  // bad images replaced by others (OnError::kReplace)
  std::vector<std::string> replace_log;  // the first kReplaceLogSize of them: which, why, by what
  std::atomic<int64_t> read_ns{0};
  int64_t batches_out = 0;
  int64_t waits = 0;
  int64_t overflow_batches = 0;
  int64_t next_batches = 0;
  int64_t helped_chunks = 0;  // read by next() while it waited (BatchReader::help_locked)
  int64_t stepped_back = 0;  // polls of a reader that left the chunk to next() (reader_loop)
  std::atomic<int64_t> helped_cpu_ns{0};  // their CPU time, on the consumer's thread: not the step's
  int64_t spared_batches = 0;  // taken while the readers kept off the consumer's core
  double wait_s = 0;
  double active_s = 0;  // time inside passes: from start() to the last batch taken
  bool pass_active = false;
  Clock::time_point pass_t0;

  void end_pass_locked() {
    if (pass_active) active_s += seconds_since(pass_t0);
    pass_active = false;
  }

  ~ReaderState() {
    if (arena && opt.on_arena_free && !opt.on_arena_free(arena->data(), arena->size()))
      static_cast<void>(arena.release());  // it may still be read: leaked
  }

  char* slot_data(int slot) const { return arena->data() + static_cast<int64_t>(slot) * slot_bytes; }
  int64_t batch_records(int64_t b) const { return records_of(*indices, b); }
  // Records of batch b of the pass over `idx` (a work item's own list: no lock needed).
  int64_t records_of(const std::vector<int64_t>& idx, int64_t b) const {
    const int64_t bs = opt.batch_size;
    return std::min<int64_t>(bs, static_cast<int64_t>(idx.size()) - b * bs);
  }
  int64_t batch_chunks(int64_t b) const { return (batch_records(b) + chunk_records - 1) / chunk_records; }

  // A free slot becomes batch b's, filling, with all its chunks pending (the caller knows one is free:
  // has_work() for the reader threads, not every slot leased for next()).
  void claim_slot_locked(int64_t b, int filler = -1) {
    int s = -1;
    for (int k = 0; k < static_cast<int>(slots.size()); ++k) {
      if (slots[k].state != SlotState::kFree) continue;
      if (s < 0) s = k;
      if (slots[k].filler == filler) {
        s = k;
        break;
      }
    }
    Slot& slot = slots[s];
    slot.filler = filler;
    slot.state = SlotState::kFilling;
    slot.gen = gen;
    slot.batch = b;
    slot.records = batch_records(b);
    slot.pending = static_cast<int>(batch_chunks(b));
    slot.error = nullptr;
    --free_slots;
    ring[b % opt.prefetch] = s;
  }
  bool has_work() const {
    if (!indices || next_batch >= num_batches || next_batch >= consumed + opt.prefetch) return false;
    if (readers_paused && next_chunk == 0) return false;
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

  // Reader side: blocks until there is work, the reader is parked or the engine stops. At most one
  // reader polls.
  void wait_for_work(std::unique_lock<std::mutex>& lk, int reader) {
    const auto go = [&] { return stop || has_work() || parked(reader); };
    if (go()) return;
    if (pollers == 0) {
      ++pollers;
      const auto until = Clock::now() + kPollFor;
      while (!go() && Clock::now() < until) work_cv.wait_for(lk, kPollInterval);
      --pollers;
    }
    work_cv.wait(lk, go);
  }
  // Reader side: waits while parked (the work there is, the readers that read on take).
  void park(std::unique_lock<std::mutex>& lk, int reader) {
    if (has_work()) work_cv.notify_one();  // one of them may be asleep
    ++parked_readers;
    park_cv.wait(lk, [&] { return stop || !parked(reader); });
    --parked_readers;
  }
};

struct WorkItem {
  uint64_t gen;
  int slot;
  int64_t batch;
  int64_t first;  // first record of the chunk within the batch
  int64_t count;
  std::shared_ptr<const std::vector<int64_t>> indices;
  uint64_t epoch;
};

// Batch work item w narrowed to its chunk c (readers and next() split a batch alike). Reads only what
// does not change after construction and w's own index list: callable without the lock.
inline WorkItem chunk_of(const ReaderState& st, WorkItem w, int64_t c) {
  w.first = c * st.chunk_records;
  w.count = std::min(st.chunk_records, st.records_of(*w.indices, w.batch) - w.first);
  return w;
}

// With the lock held and has_work(): the next chunk to read, by reader thread `filler` (-1: the consumer,
// reading while it waits in next()); the first chunk of a batch claims its slot.
WorkItem take_chunk_locked(ReaderState& st, int filler);
// Without the lock: reads chunk w (read_chunk), its time and bytes counted in the statistics; returns its
// failure, for finish_chunk_locked (a chunk taken must be finished, whatever happens).
std::exception_ptr read_chunk_counted(ReaderState& st, const WorkItem& w, ThreadBuffers& tb);
// With the lock held: chunk w was read (err: its failure). Its batch is ready after its last chunk (its
// slot free instead if the pass was abandoned meanwhile); returns whether that happened, for the caller
// to notify ready_cv once it has released the lock.
bool finish_chunk_locked(ReaderState& st, const WorkItem& w, std::exception_ptr err);

// The body of reader thread `thread_index`: fills slots until the reader stops.
void reader_loop(std::shared_ptr<ReaderState> sp, int thread_index);

// Reads work item w's records into its slot (ReaderOptions::before_slot_fill first); *bytes: bytes read.
void read_chunk(ReaderState& st, const WorkItem& w, ThreadBuffers& tb, int64_t* bytes);

// Reads records idx[0, count) into records [first, first + count) of the slot at `base`: image columns
// first (a bad image replaced by another record when the options say so; every column of that record
// then comes from the substitute), then the other columns, then the sample indices. Returns the bytes
// read. Throws the first error (naming the file and record).
int64_t fill_records(ReaderState& st, const int64_t* idx, int64_t count, char* base, int64_t first, uint64_t epoch,
                     ThreadBuffers& tb);

}  // namespace fastpipe
