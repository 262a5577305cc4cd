// The engine choice's state, shared by the choice (conv_tuner.cpp) and the cache's report and persistence
// (conv_engine_cache.cpp); internal to those two files.
#pragma once

#include <ATen/record_function.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/choice_cache.h"
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

struct TunerState {
  std::mutex mutex;
  std::unordered_map<size_t, DeviceCandidates> devices;  // by slot()
  // The same, indexed without a lock on the hot path: devices register during static initialisation only.
  std::array<const DeviceCandidates*, kSlots> by_slot{};
  ChoiceCache choices;  // locks a mutex of its own, never held together with `mutex`
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
