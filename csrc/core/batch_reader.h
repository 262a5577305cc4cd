// The loader's batch reader: one arena of batch slots, a pool of reader threads that fill slots ahead
// of the consumer (each reading chunks of records with gather.h), and leases that return a slot to the
// pool when the consumer lets go of its batch.
//
// Slot life cycle: free -> filling -> ready -> leased -> free. Batches are handed out strictly in the
// order of the index list given to start(); reader threads may fill them (and the records inside them)
// in any order.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/gather.h"
#include "core/reader_config.h"

namespace fastpipe {

// Runs body(begin, end, worker) over [0, n) split among workers, at least `grain` each (torch's intra-op
// threads, from the ops layer; `worker` numbers the thread running it); null: serially on the calling
// thread.
using ParallelFor =
    std::function<void(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)>& body)>;

// The user's settings (reader_config.h), resolved here: num_threads and prefetch 0 become the defaults for
// the columns; and what the layers above add.
struct ReaderOptions : ReaderConfig {
  ParallelFor parallel_for;  // GatherIn::kNext and kAuto
  int num_slots = 0;  // arena slots, > prefetch (0: prefetch + 2)
  // Every column delivered as its records (one output each, no widening or transform): a device
  // pipeline converts them after the copy.
  bool raw_outputs = false;
  // Each slot also holds its batch's sample indices (int64, after the outputs; Lease::indices), for the
  // device pipeline to copy along for the transforms.
  bool index_output = false;
  // When every slot is held by the consumer, next() reads the next batch itself into memory this
  // returns (at least `bytes`, kept alive by the shared_ptr), outside the arena. Null: next() raises at
  // once in that case, since no slot can be filled until the consumer frees one.
  std::function<std::pair<char*, std::shared_ptr<void>>(int64_t bytes)> overflow;
  // Device hooks; the reader itself knows nothing of devices. on_arena_alloc/free: once with the arena
  // after it is allocated and before it is freed (e.g. to page-lock it). on_slot_release: in the thread
  // that drops the last reference to a batch (e.g. to record an event after the copies queued from
  // it). before_slot_fill: in a reader thread before it writes into a slot (e.g. to wait for that event).
  // on_arena_free returns false when copies out of the arena could not be waited for (a failed device):
  // the arena is then left allocated (leaked) rather than freed under them.
  std::function<void(void*, size_t)> on_arena_alloc;
  std::function<bool(void*, size_t)> on_arena_free;
  std::function<void(int)> on_slot_release;
  std::function<void(int)> before_slot_fill;
};

// The reader's counters, each under the name Loader.stats() gives it: the binding copies them by this list.
// X(type, name); an optional is None until it has been measured.
#define FASTPIPE_READER_STATS(X)                                                                                   \
  X(int64_t, batches)                                                                                              \
  X(int64_t, bytes_read)                                                                                           \
  X(double, read_seconds)   /* summed over reader threads */                                                       \
  X(double, wait_seconds)   /* consumer blocked in next() */                                                       \
  X(double, wall_seconds)   /* inside passes: from each start() to its last batch */                               \
  X(int64_t, arena_bytes)                                                                                          \
  X(int, prefetch)                                                                                                 \
  X(int, num_slots)                                                                                                \
  X(int, slots_leased)                                                                                             \
  X(int, num_threads)                                                                                              \
  X(int64_t, waits)            /* next() calls that found no batch ready and waited */                             \
  X(int64_t, overflow_batches) /* read outside the arena because every slot was held */                            \
  X(int64_t, next_batches)     /* read by next() itself (GatherIn::kNext, or kAuto's busy steps) */                \
  X(int64_t, helped_chunks)    /* chunks next() read while it waited for the readers (BatchReader::help_locked) */\
  X(int64_t, stepped_back)     /* times a reader polled instead of reading beside next() on every core */         \
  X(bool, gathering_in_next)   /* where the next batches are read now */                                           \
  X(std::optional<double>, step_cores) /* GatherIn::kAuto: cores the step used in the last window */               \
  /* Where the readers run (reader_placement.h): the core they keep off now, the batches taken while they */       \
  /* kept off the consumer's core, their reading time per second of the last window. */                            \
  X(std::optional<int>, spare_cpu)                                                                                 \
  X(int64_t, spared_batches)                                                                                       \
  X(int, parked_readers)       /* readers waiting while the others keep off the consumer's core */                 \
  X(std::optional<double>, reader_cores)                                                                           \
  X(int64_t, images_replaced)  /* bad images replaced by other records (OnError::kReplace) */                      \
  X(int64_t, images_pillow)    /* decoded by an image column's fallback decoder (the binding's Pillow) */          \
  X(std::vector<std::string>, replaced) /* the first of them: which image, why, and by which record */

struct ReaderStats {
#define FASTPIPE_FIELD(type, name) type name{};
  FASTPIPE_READER_STATS(FASTPIPE_FIELD)
#undef FASTPIPE_FIELD
};

// An output region inside every slot: `record_bytes` per record, records back to back.
struct OutputLayout {
  int64_t offset;
  int64_t record_bytes;
};

// Where the next output of a slot starts after one of `count` records of `bytes` placed at `offset`,
// aligned to `align`: the slot arithmetic of the host arena and of the device pipeline's. An absurd
// batch_size is refused (Error kValue) rather than wrapping around into a small arena.
int64_t place_output(int64_t offset, int64_t bytes, int64_t count, int64_t align);

class BatchReader;
class CorePlacement;
class GatherPolicy;
struct ReaderState;

// A batch handed to the consumer. Destroying the last reference frees the slot.
class Lease {
 public:
  Lease(std::shared_ptr<ReaderState> state, int slot, int64_t records, uint64_t epoch);
  // A batch outside the arena (ReaderOptions::overflow): slot() is -1.
  Lease(std::shared_ptr<ReaderState> state, char* base, std::shared_ptr<void> keep, int64_t records, uint64_t epoch);
  ~Lease();
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  char* data(int output) const;
  int64_t records() const { return records_; }
  int slot() const { return slot_; }
  uint64_t epoch() const { return epoch_; }
  const int64_t* indices() const;  // with ReaderOptions::index_output: the batch's sample indices

 private:
  std::shared_ptr<ReaderState> state_;
  int slot_;
  int64_t records_;
  uint64_t epoch_;
  char* external_ = nullptr;
  std::shared_ptr<void> keep_;
};

class BatchReader {
 public:
  BatchReader(std::vector<ColumnSpec> columns, ReaderOptions options);
  ~BatchReader();
  BatchReader(const BatchReader&) = delete;
  BatchReader& operator=(const BatchReader&) = delete;

  // Starts a new pass over `indices` (record numbers, batched in order) of `epoch` (the transforms'
  // random choices depend on it). A pass in progress is abandoned; its batches already leased stay valid.
  void start(std::vector<int64_t> indices, bool drop_last, uint64_t epoch = 0);

  // The next batch of the pass, or nullptr at its end. Waits at most `timeout_s` (< 0: forever);
  // `poll` is called about every 50 ms while waiting (it may throw, e.g. on KeyboardInterrupt).
  std::shared_ptr<Lease> next(double timeout_s, const std::function<void()>& poll);

  // The next batch if it is ready now (nullptr otherwise; *end says the pass is over). Never waits.
  std::shared_ptr<Lease> try_next(bool* end);

  // Joins the reader threads and closes the files. Leased batches stay valid.
  void close();

  const std::vector<OutputLayout>& outputs() const;
  std::vector<std::string> io_modes() const;  // per column, the mode actually used
  std::vector<std::string> warnings() const;  // e.g. O_DIRECT fallbacks
  ReaderStats stats() const;
  int64_t images_replaced() const;  // stats().images_replaced, without taking the lock

  // Test hooks, reached through the reader object (never through the Loader's signature).
  // Poison: readers fill each slot region with 0xA5 before reading into it, so that a batch whose slot
  // was reused too early shows. Hold reads: reader threads stop before each chunk until released (or
  // closed); held_reads() is how many wait there, so tests synchronise on it instead of sleeping.
  // Force gather in next(): GatherIn::kAuto's choice pinned to next() (1) or the readers (0), or left
  // to its policy (-1), from the next batch on. Force spare core: the readers keep off the consumer's
  // core (1), take every core (0), or follow CorePlacement (-1), from the next batch on.
  void set_poison(bool on);
  void hold_reads(bool on);
  int held_reads() const;
  void force_gather_in_next(int on);
  void force_spare_core(int on);

 private:
  void check_usable() const;
  bool ready_locked() const;
  std::shared_ptr<Lease> take_locked(std::unique_lock<std::mutex>& lk, double waited);
  std::shared_ptr<Lease> read_overflow_locked(std::unique_lock<std::mutex>& lk);
  bool can_fill_in_next_locked() const;
  void fill_in_next_locked(std::unique_lock<std::mutex>& lk);
  bool help_locked(std::unique_lock<std::mutex>& lk, bool any_batch);
  bool gather_in_next_locked();
  void place_readers_locked(double waited);
  std::shared_ptr<ReaderState> state_;
  std::unique_ptr<GatherPolicy> policy_;  // GatherIn::kAuto; used with the state's lock held
  std::unique_ptr<CorePlacement> placement_;  // reader threads on >= 2 cores; with the lock held
  int64_t policy_batch_ = -1;             // the batch (of all handed out) the policy last saw
  std::vector<std::thread> threads_;
  bool open_ = false;  // until close() (a reader that reads in next() has no threads to tell it by)
  pid_t owner_pid_;
};

}  // namespace fastpipe
