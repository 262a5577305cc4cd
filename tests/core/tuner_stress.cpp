// Standalone stress test of the conv tuner's choice cache (csrc/core/choice_cache.h) for ThreadSanitizer
// and AddressSanitizer. Forward-like and backward-like threads (CUDA autograd calls a key's backward from
// a device thread of its own) select overlapping keys while other threads clear, forget and import
// choices, export them, and start and end a graph capture. The timing is a fake whose answer is a pure
// function of the key, slow for some keys and throwing at times for others (eager failing: the error
// surfaces). Checks every engine a call gets against what its key may run, that a thin loaded choice is
// re-timed once, that every thread agrees with the cache once the churn stops, and (scripted with gates)
// a call that meets a re-timing, an import or a capture. Exits non-zero on any violation.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/choice_cache.h"

using namespace fastpipe::conv;

namespace {

std::atomic<int> failures{0};

void fail(const std::string& what) {
  if (failures++ < 30) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
}

void expect(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

// Key i: k[2] = i, k[0] plays the device type (forget takes one type's keys).
constexpr int kKeys = 40;
constexpr size_t kCandidates = 4;

Key key_of(int i) {
  Key k{};
  k[0] = i % 2;
  k[2] = i;
  k[29] = 1000 + i;
  return k;
}

std::string name(int i) { return "key " + std::to_string(i); }

// A property of key i (splitmix64 of i and a salt): the fake timing is a pure function of the key.
uint64_t trait(int i, int salt) {
  uint64_t x = static_cast<uint64_t>(i) * 16 + salt + 0x9e3779b97f4a7c15u;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
  return x ^ (x >> 31);
}

bool answer_timed(int i) { return trait(i, 1) % 6 != 0; }  // else eager alone could run: 0, untimed
size_t answer(int i) { return answer_timed(i) ? trait(i, 2) % kCandidates : 0; }
bool slow(int i) { return trait(i, 3) % 3 == 0; }
bool flaky(int i) { return trait(i, 4) % 5 == 0; }  // its timing throws at attempts 0, 3, 6, ...

// merge_retimed weighs a margin's lead over its spread (floored at 0.005): a fresh wide timing 10, a
// fresh thin one 2.
Margin fresh_margin(int i) {
  return trait(i, 5) % 2 ? Margin{1.2, 1.3, 0.02, 1} : Margin{1.02, 1.3, 0.01, 1};
}

Choice fresh_choice(int i) {
  Choice c{answer(i), "timed " + name(i), answer_timed(i)};
  if (c.timed) c.margin = fresh_margin(i);
  return c;
}

// What the cache file says of key i: another engine than its timing picks, by a margin of one of four kinds.
enum class Saved { kThinWeak, kThinStrong, kThinSettled, kWide };
Saved saved_kind(int i) { return static_cast<Saved>(trait(i, 6) % 4); }
size_t loaded(int i) { return (answer(i) + 1) % kCandidates; }

Margin saved_margin(int i) {
  switch (saved_kind(i)) {
    case Saved::kThinWeak: return Margin{1.01, 1.2, 0.05, 1};      // 0.2: any timing replaces it
    case Saved::kThinStrong: return Margin{1.08, 1.2, 0.001, 1};   // 16: kept over any timed one
    case Saved::kThinSettled: return Margin{1.01, 1.2, 0.05, kMaxTimings};  // trusted, never re-timed
    case Saved::kWide: return Margin{1.5, 1.5, 0.01, 1};
  }
  return {};
}

bool retimed_when_loaded(int i) {
  return saved_kind(i) == Saved::kThinWeak || saved_kind(i) == Saved::kThinStrong;
}

bool import_key(ChoiceCache& cache, int i) {
  return cache.import(key_of(i), loaded(i), "loaded " + name(i), saved_margin(i));
}

template <class Pred>
int find_key(Pred pred) {
  for (int i = 0; i < kKeys; ++i)
    if (pred(i)) return i;
  std::fprintf(stderr, "no key has the property the test needs\n");
  std::exit(2);
}

// The fake timing, counting its attempts per key and the calls that met one in flight.
struct Tuner {
  std::array<std::atomic<int>, kKeys> attempts{};
  std::array<std::atomic<int>, kKeys> in_flight{};
  std::atomic<int> overlapped{0};  // timings of a key that began while another one of it ran

  Choice operator()(int i, std::mt19937& rng) {
    const int attempt = attempts[i]++;
    if (in_flight[i]++ > 0) ++overlapped;
    struct Leave {
      std::atomic<int>& n;
      ~Leave() { --n; }
    } leave{in_flight[i]};
    if (slow(i)) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 400));
    if (flaky(i) && attempt % 3 == 0) throw std::runtime_error("eager failed on " + name(i));
    return fresh_choice(i);
  }
};

// What a call did, besides the engine it got.
struct Outcome {
  size_t index = 0;
  bool captured = false;  // capturing() said yes
  bool tuned = false;
  bool threw = false;
};

// One call of key i as conv_tuner.cpp makes it, checked: the engine of its timing or of the cache file
// (thin loaded choices are merged with timings), or 0 (eager) during a capture; no timing during one.
Outcome call(ChoiceCache& cache, Tuner& tuner, int i, const std::atomic<bool>& capture, std::mt19937& rng) {
  Outcome o;
  try {
    o.index = cache.select(
        key_of(i),
        [&] {
          expect(!o.captured, name(i) + " timed during a capture");
          o.tuned = true;
          return tuner(i, rng);
        },
        [&] { return o.captured = capture.load(); });
  } catch (const std::runtime_error& e) {
    expect(flaky(i) && o.tuned, name(i) + " threw without a failing timing: " + e.what());
    o.threw = true;
    return o;
  }
  expect(o.index == answer(i) || o.index == loaded(i) || (o.captured && o.index == 0),
         name(i) + " got engine " + std::to_string(o.index) + ", its timing picks " + std::to_string(answer(i)) +
             " and the cache file " + std::to_string(loaded(i)));
  return o;
}

// The same until the timing did not throw.
size_t call_until_done(ChoiceCache& cache, Tuner& tuner, int i, std::mt19937& rng, Outcome* last = nullptr) {
  const std::atomic<bool> no_capture{false};
  Outcome o;
  for (int attempt = 0; attempt < 10; ++attempt) {
    o = call(cache, tuner, i, no_capture, rng);
    if (!o.threw) break;
  }
  expect(!o.threw, name(i) + " kept throwing");
  if (last) *last = o;
  return o.index;
}

std::map<int, Choice> by_key(const ChoiceCache& cache) {
  std::map<int, Choice> m;
  for (auto& [key, choice] : cache.entries()) {
    const int i = static_cast<int>(key[2]);
    expect(i >= 0 && i < kKeys && key == key_of(i), "the cache holds a key no call made");
    expect(m.emplace(i, std::move(choice)).second, name(i) + " is cached twice");
  }
  return m;
}

// What any cached choice of key i must be, whatever ran meanwhile (exported while the threads run).
void check_choice(int i, const Choice& c) {
  switch (c.origin) {
    case Origin::kTimed:
      expect(c.index == answer(i) && c.timed == answer_timed(i) && !c.retime, name(i) + ": a wrong timed choice");
      break;
    case Origin::kLoaded:
      expect(c.index == loaded(i) && c.timed && c.margin.timings == saved_margin(i).timings &&
                 (!c.retime || retimed_when_loaded(i)),
             name(i) + ": a wrong loaded choice");
      break;
    default:  // re-timed: merged with the loaded choice, or with one timed after a clear meanwhile
      expect(retimed_when_loaded(i) && (c.index == answer(i) || c.index == loaded(i)) && !c.retime &&
                 c.margin.timings >= 2,
             name(i) + ": a wrong re-timed choice");
  }
}

std::vector<int> shuffled_keys(std::mt19937& rng) {
  std::vector<int> keys(kKeys);
  std::iota(keys.begin(), keys.end(), 0);
  std::shuffle(keys.begin(), keys.end(), rng);
  return keys;
}

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t round = round_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int n_, arrived_ = 0;
  uint64_t round_ = 0;
};

// A flag that threads wait for.
class Gate {
 public:
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

void pause(std::mt19937& rng, int max_us) {
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % max_us));
}

// Forward threads call random keys and hand each to the backward threads, which call it at once (as
// autograd's device thread does), while the cache is cleared, forgotten, imported and exported and
// captures begin and end. Then, with the churn stopped, every thread calls every key three times: every
// key is cached and settled after the first round; the second gets the cache's choices without timing
// (threads' recent choices agree with the cache); after thin choices are forgotten the third times them
// anew, and again every thread agrees with the cache.
void churn(int forward, int backward, int operations) {
  ChoiceCache cache;
  Tuner tuner;
  std::atomic<bool> capture{false}, stop{false};
  std::atomic<int> calls{0}, captured{0}, threw{0}, met_timing{0}, clears{0}, forgets{0}, imports{0}, exports{0};
  std::mutex handoff_mutex;
  std::deque<int> handoff;
  const int threads = forward + backward;
  Barrier barrier(threads + 1);
  std::map<int, Choice> settled;  // written by the main thread between barriers
  std::vector<std::array<size_t, kKeys>> last(threads);

  auto selector = [&](int t) {
    std::mt19937 rng(100 + t);
    while (!stop) {
      ++calls;
      int i = static_cast<int>(rng() % kKeys);
      if (t < forward) {
        std::lock_guard<std::mutex> lock(handoff_mutex);
        handoff.push_back(i);
        if (handoff.size() > 16) handoff.pop_front();
      } else {
        std::lock_guard<std::mutex> lock(handoff_mutex);
        if (!handoff.empty()) {
          i = handoff.back();
          handoff.pop_back();
        }
      }
      const Outcome o = call(cache, tuner, i, capture, rng);
      captured += o.captured;
      threw += o.threw;
      met_timing += !o.tuned && tuner.in_flight[i] > 0;
    }
    barrier.wait();  // the churn has stopped; the main thread ends the captures
    barrier.wait();
    for (int i : shuffled_keys(rng)) call_until_done(cache, tuner, i, rng);
    barrier.wait();  // the main thread reads the settled cache
    barrier.wait();
    for (int i : shuffled_keys(rng)) {
      Outcome o;
      const size_t index = call_until_done(cache, tuner, i, rng, &o);
      expect(!o.tuned && settled.count(i) && index == settled.at(i).index,
             name(i) + ": a thread's call disagrees with the settled cache");
    }
    barrier.wait();  // the main thread forgets the thin choices
    barrier.wait();
    for (int i : shuffled_keys(rng)) last[t][i] = call_until_done(cache, tuner, i, rng);
    barrier.wait();
  };

  // The churn runs its operations, then on until the selectors' counters show every race it is for was
  // met (a capture during a call, a throw, a call meeting its key's timing): random interleavings reach
  // them at different times on a loaded machine. A minute without them is a failure, not a wait.
  auto churner = [&] {
    std::mt19937 rng(7);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    auto reached = [&] { return captured > 0 && threw > 0 && met_timing > 0; };
    for (int n = 0; n < operations || (!reached() && std::chrono::steady_clock::now() < deadline); ++n) {
      const int op = static_cast<int>(rng() % 16);
      const int64_t type = rng() % 2;
      if (op == 0) {
        cache.clear();
        ++clears;
      } else if (op < 3) {
        const bool thin_only = op == 2;
        cache.forget([&](const Key& k, const Choice& c) {
          return k[0] == type && (!thin_only || (c.timed && is_thin(c.margin)));
        });
        ++forgets;
      } else if (op < 10) {
        import_key(cache, static_cast<int>(rng() % kKeys));
        ++imports;
      } else {
        for (const auto& [i, c] : by_key(cache)) check_choice(i, c);
        ++exports;
      }
      pause(rng, 200);
    }
    stop = true;
  };

  auto capturer = [&] {
    std::mt19937 rng(9);
    while (!stop) {
      capture = rng() % 5 == 0;
      pause(rng, 300);
    }
  };

  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(selector, t);
  std::thread churn_thread(churner), capture_thread(capturer);
  barrier.wait();
  churn_thread.join();
  capture_thread.join();
  capture = false;
  barrier.wait();
  barrier.wait();  // every thread called every key
  settled = by_key(cache);
  expect(settled.size() == kKeys, std::to_string(kKeys - settled.size()) + " keys lost after the churn");
  for (const auto& [i, c] : settled) {
    check_choice(i, c);
    expect(!c.retime, name(i) + " is still to be re-timed after every thread called it");
  }
  barrier.wait();
  barrier.wait();  // every thread called every key again
  for (const auto& [i, c] : by_key(cache))
    expect(settled.count(i) && c.index == settled.at(i).index, name(i) + " changed without a timing");
  const std::vector<Key> gone = cache.forget([](const Key&, const Choice& c) { return c.timed && is_thin(c.margin); });
  for (const auto& [i, c] : by_key(cache)) expect(!c.timed || !is_thin(c.margin), name(i) + ": a thin choice is left");
  expect(gone.size() + by_key(cache).size() == kKeys, "forgetting thin choices lost others");
  barrier.wait();
  barrier.wait();  // every thread called every key after the forgetting
  const std::map<int, Choice> final_choices = by_key(cache);
  expect(final_choices.size() == kKeys, "keys lost after forgetting the thin ones");
  for (int t = 0; t < threads; ++t)
    for (const auto& [i, c] : final_choices)
      expect(last[t][i] == c.index, name(i) + ": thread " + std::to_string(t) + " got engine " +
                                        std::to_string(last[t][i]) + ", the cache has " + std::to_string(c.index));
  for (auto& th : pool) th.join();
  std::printf("churn: %d calls, %d captured, %d threw, %d met their key's timing, %d timings overlapped; "
              "%d clears, %d forgets, %d imports, %d exports\n",
              calls.load(), captured.load(), threw.load(), met_timing.load(), tuner.overlapped.load(),
              clears.load(), forgets.load(), imports.load(), exports.load());
  // The stress must reach the races it is for.
  expect(captured > 0 && threw > 0 && met_timing > 0 && clears > 0 && forgets > 0 && imports > 0 && exports > 0,
         "the churn did not reach every case");
}

// Every key loaded from the cache file, called from several threads while captures begin and end: each
// thin one is timed exactly once (a capture defers it), the others never; what each keeps follows the
// margins, and every thread then agrees with the cache.
void retime_once(int threads, int rounds) {
  ChoiceCache cache;
  Tuner tuner;
  for (int i = 0; i < kKeys; ++i) expect(import_key(cache, i), name(i) + " was not imported");
  std::atomic<bool> capture{false}, stop{false};
  Barrier barrier(threads + 1);
  std::map<int, Choice> settled;
  auto selector = [&](int t) {
    std::mt19937 rng(200 + t);
    for (int r = 0; r < rounds; ++r)
      for (int i : shuffled_keys(rng)) call(cache, tuner, i, capture, rng);
    barrier.wait();  // the captures end
    barrier.wait();
    for (int i : shuffled_keys(rng)) call_until_done(cache, tuner, i, rng);
    barrier.wait();  // the main thread reads the cache
    barrier.wait();
    for (int i : shuffled_keys(rng))
      expect(call_until_done(cache, tuner, i, rng) == settled.at(i).index,
             name(i) + ": a thread's call disagrees with the re-timed cache");
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(selector, t);
  std::thread capturer([&] {
    std::mt19937 rng(3);
    while (!stop) {
      capture = rng() % 3 == 0;
      pause(rng, 200);
    }
  });
  barrier.wait();
  stop = true;
  capturer.join();
  capture = false;
  barrier.wait();
  barrier.wait();
  settled = by_key(cache);
  expect(settled.size() == kKeys, "keys lost");
  for (const auto& [i, c] : settled) {
    const int timings = tuner.attempts[i];
    expect(timings == (retimed_when_loaded(i) ? 1 : 0),
           name(i) + " was timed " + std::to_string(timings) + " times");
    if (!retimed_when_loaded(i) || flaky(i)) {  // a failed re-timing keeps the loaded choice
      expect(c.origin == Origin::kLoaded && c.index == loaded(i) && !c.retime, name(i) + ": the loaded choice changed");
      continue;
    }
    const bool kept = answer_timed(i) && saved_kind(i) == Saved::kThinStrong;
    expect(c.origin == (kept ? Origin::kRetimedKept : Origin::kRetimedReplaced) &&
               c.index == (kept ? loaded(i) : answer(i)) && c.margin.timings == 2 && !c.retime,
           name(i) + ": re-timed wrongly");
  }
  barrier.wait();
  for (auto& th : pool) th.join();
}

const auto never = [] { return false; };

// A thread that calls a key while another re-times it gets the loaded choice; once the re-timing
// replaced that choice, its next call gets the new one.
void call_during_retime() {
  const int i = find_key([](int k) { return saved_kind(k) == Saved::kThinWeak; });
  ChoiceCache cache;
  import_key(cache, i);
  Gate started, release;
  size_t retimed = 0;
  std::thread timing([&] {
    retimed = cache.select(
        key_of(i),
        [&] {
          started.open();
          release.wait();
          return fresh_choice(i);
        },
        never);
  });
  started.wait();
  auto no_timing = [&] {
    fail(name(i) + " timed twice");
    return fresh_choice(i);
  };
  expect(cache.select(key_of(i), no_timing, never) == loaded(i),
         "a call during the re-timing did not get the loaded choice");
  release.open();
  timing.join();
  expect(retimed == answer(i), "the re-timing kept a weak loaded choice");
  expect(cache.select(key_of(i), no_timing, never) == answer(i),
         "a thread that called during the re-timing still gets the replaced choice");
}

// A thin choice imported while a thread timed its key (new then) wins, and that thread's next call
// re-times it as its first call would have.
void import_during_timing() {
  const int i = find_key([](int k) { return saved_kind(k) == Saved::kThinWeak; });
  ChoiceCache cache;
  Gate started, release;
  int timings = 0;
  size_t first = 0, second = 0;
  std::thread caller([&] {
    first = cache.select(
        key_of(i),
        [&] {
          ++timings;
          started.open();
          release.wait();
          return fresh_choice(i);
        },
        never);
    second = cache.select(
        key_of(i),
        [&] {
          ++timings;
          return fresh_choice(i);
        },
        never);
  });
  started.wait();
  expect(import_key(cache, i), "the import did not add the key being timed");
  release.open();
  caller.join();
  expect(first == loaded(i), "the first call did not get the imported choice");
  expect(timings == 2 && second == answer(i),
         "a thin choice imported during a timing was not re-timed at the next call");
}

// During a capture nothing is timed: a new key runs eager, a thin loaded one its loaded choice; after
// it, both are timed at their next call (the capture did not cache them in the thread).
void capture_defers() {
  const int thin = find_key([](int k) { return saved_kind(k) == Saved::kThinWeak; });
  const int fresh = find_key([&](int k) { return answer(k) != 0 && k != thin; });
  ChoiceCache cache;
  import_key(cache, thin);
  bool capture = true;
  int timings = 0;
  auto select = [&](int i) {
    return cache.select(
        key_of(i),
        [&] {
          ++timings;
          return fresh_choice(i);
        },
        [&] { return capture; });
  };
  expect(select(fresh) == 0 && select(thin) == loaded(thin) && timings == 0, "a call during a capture was timed");
  capture = false;
  expect(select(fresh) == answer(fresh) && select(thin) == answer(thin) && timings == 2,
         "a key called during a capture was not timed after it");
}

// A thread's recent choices of one cache are not another's.
void caches_apart() {
  const int i = find_key([](int k) { return saved_kind(k) == Saved::kWide; });
  ChoiceCache timed, loaded_from_file;
  expect(timed.select(key_of(i), [&] { return fresh_choice(i); }, never) == answer(i), "timing failed");
  import_key(loaded_from_file, i);
  auto no_timing = [&] {
    fail(name(i) + ": a wide loaded choice was timed");
    return fresh_choice(i);
  };
  expect(loaded_from_file.select(key_of(i), no_timing, never) == loaded(i),
         "one cache's choice was taken for another's");
}

}  // namespace

int main() {
  capture_defers();
  caches_apart();
  call_during_retime();
  import_during_timing();
  retime_once(4, 6);
  churn(3, 2, 2000);
  std::printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
