#include "core/choice_cache.h"

#include <algorithm>
#include <optional>

namespace fastpipe::conv {

namespace {

// A thread's recent choices, so that a call whose key was seen finds its engine without the lock. An
// entry counts while its cache's generation is the one it was made under. Generations come from one
// counter for all caches, so that an entry never matches another cache (even one built where a
// destroyed one was).
struct Recent {
  uint64_t generation = 0;  // never a cache's
  Key key{};
  size_t index = 0;
};
constexpr size_t kRecent = 8;
thread_local std::array<Recent, kRecent> recent;
thread_local size_t recent_next = 0;
std::atomic<uint64_t> next_generation{1};

}  // namespace

Choice merge_retimed(Choice saved, Choice fresh) {
  auto strength = [](const Margin& m) { return (m.vs_runner_up - 1) / std::max(m.spread, 0.005); };
  const int timings = saved.margin.timings + fresh.margin.timings;
  // A fresh key with eager alone (a candidate failing here now) runs what this process can run.
  const bool keep_saved = fresh.timed && strength(saved.margin) > strength(fresh.margin);  // NaN: false
  Choice kept = keep_saved ? std::move(saved) : std::move(fresh);
  kept.margin.timings = timings;
  kept.origin = keep_saved ? Origin::kRetimedKept : Origin::kRetimedReplaced;
  kept.retime = false;
  return kept;
}

ChoiceCache::ChoiceCache() : generation_(next_generation++) {}

void ChoiceCache::invalidate_recent() {
  generation_ = next_generation++;
}

size_t ChoiceCache::select(const Key& key, FunctionRef<Choice()> tune, FunctionRef<bool()> capturing) {
  const uint64_t generation = generation_.load(std::memory_order_acquire);
  for (const Recent& r : recent)
    if (r.generation == generation && r.key == key) return r.index;
  auto remember = [&](size_t index) {
    recent[recent_next++ % kRecent] = Recent{generation, key, index};
    return index;
  };
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = choices_.find(key);
  if (it != choices_.end() && !it->second.retime) {
    const size_t index = it->second.index;
    lock.unlock();
    return remember(index);
  }
  // A new key, or a thin loaded choice's first call: timed now, unless that would break a graph capture
  // (then the loaded choice, or eager, runs and the key stays out of `recent` to be timed after it).
  const std::optional<size_t> loaded = it == choices_.end() ? std::nullopt : std::optional(it->second.index);
  lock.unlock();
  if (capturing()) return loaded.value_or(0);
  lock.lock();
  it = choices_.find(key);
  const bool retime = it != choices_.end() && it->second.retime;
  if (it != choices_.end() && !retime) return it->second.index;  // another thread timed it
  if (retime) it->second.retime = false;  // once per process, whatever this timing finds
  lock.unlock();
  Choice fresh = tune();
  lock.lock();
  it = choices_.find(key);
  if (it == choices_.end()) {
    it = choices_.emplace(key, std::move(fresh)).first;
  } else if (retime) {
    const size_t loaded_index = it->second.index;
    it->second = merge_retimed(std::move(it->second), std::move(fresh));
    // Threads that called the key while it was re-timed remember the loaded engine.
    if (it->second.index != loaded_index) invalidate_recent();
  }
  const size_t index = it->second.index;
  // A thin choice imported while this call timed its key (new then) is re-timed at the next call.
  const bool settled = !it->second.retime;
  lock.unlock();
  return settled ? remember(index) : index;
}

bool ChoiceCache::import(const Key& key, size_t index, std::string report, const Margin& margin) {
  Choice choice{index, std::move(report), true, margin, Origin::kLoaded,
                is_thin(margin) && margin.timings < kMaxTimings};
  std::lock_guard<std::mutex> lock(mutex_);
  return choices_.emplace(key, std::move(choice)).second;
}

void ChoiceCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  choices_.clear();
  invalidate_recent();
}

std::vector<Key> ChoiceCache::forget(FunctionRef<bool(const Key&, const Choice&)> which) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Key> keys;
  for (auto it = choices_.begin(); it != choices_.end();) {
    if (which(it->first, it->second)) {
      keys.push_back(it->first);
      it = choices_.erase(it);
    } else {
      ++it;
    }
  }
  invalidate_recent();
  return keys;
}

std::vector<std::pair<Key, Choice>> ChoiceCache::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {choices_.begin(), choices_.end()};
}

}  // namespace fastpipe::conv
