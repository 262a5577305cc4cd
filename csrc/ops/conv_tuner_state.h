// The engine choice's state, shared by the choice (conv_tuner.cpp) and the cache's report and persistence
// (conv_engine_cache.cpp); internal to those two files.
#pragma once

#include <ATen/record_function.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ops/conv_tuner.h"

namespace fastpipe::conv {

// The candidates of one device type for forward calls, or for backward ones.
struct DeviceCandidates {
  DeviceHooks hooks{};
  std::vector<Candidate> candidates;  // [0] is eager
  bool any_validated = false;        // a candidate besides eager that timing may pick
  // Per candidate, the profiler's name: "fastpipe::conv_engine.<name>", or "fastpipe::conv_engine_backward.<name>".
  std::vector<std::string> labels;

  // Runs candidate i under a profiler label, so that a trace (and the tests) show which engine ran.
  EngineOut run(size_t i, const ConvArgs& a) const {
    RECORD_FUNCTION(labels[i].c_str(), std::vector<c10::IValue>());
    const Candidate& c = candidates[i];
    return c.run ? EngineOut{c.run(a), {}, {}} : c.run_backward(a);
  }
};

// Where a device type's forward or backward candidates are kept.
inline size_t slot(c10::DeviceType type, bool backward) {
  return static_cast<size_t>(type) * 2 + backward;
}
inline constexpr size_t kSlots = static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES) * 2;

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
  size_t index;
  std::string report;  // the call, the engine and each candidate's times
  bool timed;  // candidates were compared (else eager alone could run: nothing worth keeping across runs)
  Margin margin{};
  Origin origin = Origin::kTimed;
  bool retime = false;  // loaded thin: its first call in this process times it again (then cleared)
};

// The choice a re-timing keeps: the one whose margin over its runner-up is the more decisive in units of
// its own spread (a busy machine's rounds spread wide), the fresh one on a tie or an unknown old margin.
Choice merge_retimed(Choice saved, Choice fresh);

struct TunerState {
  std::mutex mutex;
  std::unordered_map<size_t, DeviceCandidates> devices;  // by slot()
  // The same, indexed without a lock on the hot path: devices register during static initialisation only.
  std::array<const DeviceCandidates*, kSlots> by_slot{};
  std::unordered_map<Key, Choice, KeyHash> cache;
  // Bumped whenever a cached choice may become wrong (clear, override): threads' lookup caches check it.
  std::atomic<uint64_t> generation{1};
  // The engine FASTPIPE_CONV_ENGINE names (read once at load; _conv_engine_force changes it), guarded
  // by `mutex`; `forcing` lets calls skip it without the lock when it is "auto".
  std::string forced;
  std::atomic<bool> forcing{false};
  // Candidates that threw on a key or disagreed with eager there (bit i: candidate i), never timed on it
  // again; `any_failed` lets the timing skip building the key while nothing ever failed.
  std::unordered_map<Key, uint64_t, KeyHash> failed;
  std::atomic<bool> any_failed{false};
  std::unordered_set<std::string> warned;  // warnings already given (each is given once)
  // Test hook (engine_time_unvalidated): unvalidated candidates are timed too.
  std::atomic<bool> time_unvalidated{false};
  // Device types whose choices fastpipe/nn/_engines.py saves at exit (the report says so), by mutex.
  std::unordered_set<int64_t> persisted;
};

// The process's one state (never destroyed: engines may run during interpreter shutdown).
TunerState& tuner_state();

}  // namespace fastpipe::conv
