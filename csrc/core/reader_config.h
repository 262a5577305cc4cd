// The reader's settings that a user chooses: the Loader's arguments of the same names. Each is declared
// once, in FASTPIPE_READER_CONFIG, with its default and its bounds; the binding (csrc/ops/reader_config.cpp)
// makes fastpipe._C.ReaderConfig from that list, and check() enforces it for every C++ caller too.
#pragma once

#include <climits>
#include <cstdint>
#include <string>

#include "core/choices.h"
#include "core/io_mode.h"

namespace fastpipe {

// More reader threads than this never help (they contend for the disk and the cores); refused up front.
constexpr int kMaxReaderThreads = 1024;

// Who gathers the batches. kThreads: reader threads, ahead of the consumer. kNext: no reader threads;
// next() reads each batch itself when it is asked for, its chunks spread over ReaderOptions::parallel_for
// (num_threads then sizes the chunks: the workers it has); for a training step that keeps every core
// busy with its own parallel work, where reader threads would only compete with it. kAuto: reader
// threads, paused (and next() reading) while the step keeps the cores busy (gather_policy.h).
enum class GatherIn { kThreads, kNext, kAuto };
template <>
struct Choices<GatherIn> {
  static constexpr Named<GatherIn> names[] = {
      {GatherIn::kThreads, "threads"}, {GatherIn::kNext, "next"}, {GatherIn::kAuto, "auto"}};
};

// When the consumer holds every slot: read the next batch into memory outside the arena, or raise.
enum class WhenFull { kAllocate, kError };
template <>
struct Choices<WhenFull> {
  static constexpr Named<WhenFull> names[] = {{WhenFull::kAllocate, "allocate"}, {WhenFull::kError, "error"}};
};

// A bad image fails its batch, or is replaced by another record drawn from (seed, epoch, sample) and counted.
enum class OnError { kRaise, kReplace };
template <>
struct Choices<OnError> {
  static constexpr Named<OnError> names[] = {{OnError::kRaise, "raise"}, {OnError::kReplace, "replace"}};
};

// INT(type, name, default, low, high, why): an integer in [low, high], `why` explaining high; a default
// outside [low, high] is the automatic choice (Python's None). CHOICE(type, name, default): one of
// Choices<type>'s names.
#define FASTPIPE_READER_CONFIG(INT, CHOICE)                                                                      \
  INT(int64_t, batch_size, 1, 1, INT64_MAX, "")                                                                  \
  INT(int, num_threads, 0, 0, kMaxReaderThreads,                                                                 \
      " (each reader thread has a stack and chunk buffers, and more readers than that only contend for the disk " \
      "and the cores; 0: automatic)")                                                                            \
  INT(int, prefetch, 0, 1, INT_MAX - 2, " (its slots, prefetch + 2, are counted in a C int)")                   \
  CHOICE(IoMode, io, IoMode::kAuto)                                                                              \
  CHOICE(GatherIn, gather, GatherIn::kThreads)                                                                   \
  CHOICE(WhenFull, when_full, WhenFull::kAllocate)                                                               \
  CHOICE(OnError, on_error, OnError::kRaise)                                                                     \
  INT(uint64_t, seed, 0, 0, UINT64_MAX, "")

// Whether an INT setting has an automatic value: a default outside its bounds.
template <typename T>
constexpr bool has_automatic(T init, T low, T high) {
  return init < low || init > high;
}

struct ReaderConfig {
#define FASTPIPE_FIELD(type, name, init, ...) type name = init;
  FASTPIPE_READER_CONFIG(FASTPIPE_FIELD, FASTPIPE_FIELD)
#undef FASTPIPE_FIELD

  // Each integer within its bounds (or automatic); throws Error(kValue) naming the argument.
  void check() const;
};

// "<name> must be at least <low>, got <value>" (below) or "... at most <high><why>, got <value>".
std::string out_of_range_message(const char* name, bool below, const std::string& bound, const char* why,
                                 const std::string& value);

}  // namespace fastpipe
