// The fused convolution's engine choices by call key, without torch: what the tuner
// (csrc/ops/conv_tuner.cpp) keeps between calls, and the rules of when a key is timed. The tuner makes
// the key from a call and times its candidates (the `tune` callback); this file decides whether a call
// needs that, from any number of threads at once (CUDA autograd runs a key's backward on a device thread
// of its own), and is stress-tested on its own under ThreadSanitizer and ASan (tests/core/tuner_stress.cpp).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/function_ref.h"

namespace fastpipe::conv {

// Everything the relative speed of the candidates may depend on (conv_tuner.cpp's make_key).
using Key = std::array<int64_t, 30>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 0;
    for (int64_t v : k) h = h * 1000003u ^ std::hash<int64_t>{}(v);
    return h;
  }
};

// How decisively a timing picked its engine, from the per-round times the tuner measured (NaN: unknown,
// as for a choice read from a format-2 cache file).
struct Margin {
  static constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();
  double vs_runner_up = kUnknown;  // median over rounds of the runner-up's time over the chosen one's
  double vs_eager = kUnknown;      // the same against eager (1 when eager was chosen)
  double spread = kUnknown;        // half the interquartile range of vs_runner_up's rounds, over their median
  int timings = 1;                 // timings (one per process) this evidence was chosen from
};

// A choice is thin when its runner-up is within kThinMargin of it or within twice the spread of its
// rounds (a choice made while the machine was busy can be that far off: issue 21 saw 0.89-0.94x where a
// quiet re-run gave 0.96-1.06x). A thin choice read from the cache file is re-timed at its first call,
// until kMaxTimings timings agree it is thin: its engines are then within noise of each other, and
// re-timing on every start would cost ~150 ms per key for at most kThinMargin.
inline constexpr double kThinMargin = 1.10;
inline constexpr int kMaxTimings = 3;
inline bool is_thin(const Margin& m) {
  return !(m.vs_runner_up >= kThinMargin && m.vs_runner_up - 1 >= 2 * m.spread);  // NaN: thin
}

// Where a cached choice comes from: timed in this process, read from the cache file, or read thin and
// re-timed here (keeping the loaded choice or replacing it: merge_retimed).
enum class Origin { kTimed, kLoaded, kRetimedKept, kRetimedReplaced };

struct Choice {
  size_t index;        // the engine: a candidate's index, 0 for eager
  std::string report;  // the call, the engine and each candidate's times
  bool timed;  // candidates were compared (else eager alone could run: nothing worth keeping across runs)
  Margin margin{};
  Origin origin = Origin::kTimed;
  bool retime = false;  // loaded thin: its first call in this process times it again (then cleared)
};

// The choice a re-timing keeps: the one whose margin over its runner-up is the more decisive in units of
// its own spread (a busy machine's rounds spread wide), the fresh one on a tie or an unknown old margin.
Choice merge_retimed(Choice saved, Choice fresh);

class ChoiceCache {
 public:
  ChoiceCache();
  ChoiceCache(const ChoiceCache&) = delete;
  ChoiceCache& operator=(const ChoiceCache&) = delete;

  // The engine of `key`'s call: its cached choice, else `tune()`'s, which is cached. A thin loaded
  // choice's first call in this process re-times it (merge_retimed decides which is kept). tune() runs
  // without the lock, so that other keys go on meanwhile; a thread calling the key while it runs gets the
  // loaded choice (the re-timed one from its next call on), two threads calling a new key may both time
  // it (the first result is kept). While `capturing()` (a CUDA graph capture: no timing then) the loaded
  // choice, or 0, is returned and the key is timed at a call after the capture. What tune() throws
  // surfaces, and nothing is cached from it.
  size_t select(const Key& key, FunctionRef<Choice()> tune, FunctionRef<bool()> capturing);

  // Adds a choice read from the cache file, unless `key` has one; returns whether it was added. A thin
  // one (fewer than kMaxTimings timings) is re-timed at its first call.
  bool import(const Key& key, size_t index, std::string report, const Margin& margin);
  // Forgets every choice, or those `which` names; returns the forgotten keys. Either way the next call of
  // a forgotten key times it (threads' recent choices are dropped).
  void clear();
  std::vector<Key> forget(FunctionRef<bool(const Key&, const Choice&)> which);
  // A copy of every cached choice (the report; export to the cache file).
  std::vector<std::pair<Key, Choice>> entries() const;

 private:
  // Makes every thread's recent choices of this cache stale; called with mutex_ held.
  void invalidate_recent();

  mutable std::mutex mutex_;
  std::unordered_map<Key, Choice, KeyHash> choices_;
  // Tags threads' recent choices (choice_cache.cpp); changed whenever a cached choice is dropped or replaced.
  std::atomic<uint64_t> generation_;
};

}  // namespace fastpipe::conv
