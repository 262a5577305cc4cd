#include "ops/conv_tuner.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "ops/activations.h"
#include "core/conv_statistics.h"
#include "ops/conv_tuner_state.h"
#include "ops/conv_validation.h"

namespace fastpipe::conv {

TunerState& tuner_state() {
  static TunerState* state = [] {
    auto* s = new TunerState;
    const char* env = std::getenv("FASTPIPE_CONV_ENGINE");
    s->forced = env ? env : "";
    s->forcing = !s->forced.empty() && s->forced != "auto";
    return s;
  }();
  return *state;
}

namespace {

const char* always(const ConvArgs&) { return nullptr; }

// ATen's convolution (bias included), the residual added and the activation applied in place.
at::Tensor run_eager(const ConvArgs& a) {
  at::Tensor y =
      at::convolution(a.input, a.weight, a.bias, a.stride, a.padding, a.dilation, false, {0, 0}, a.groups);
  if (a.residual) y.add_(*a.residual);
  return apply_activation(y, a.act, /*inplace=*/true);
}

// ATen's convolution backward (the bias gradient summed there where asked).
EngineOut run_eager_backward(const ConvArgs& a) {
  const std::vector<int64_t> bias_sizes{a.weight.size(0)};
  auto [grad_input, grad_weight, grad_bias] = at::convolution_backward(
      a.grad, a.input, a.weight, a.need[2] ? std::optional<at::IntArrayRef>(bias_sizes) : std::nullopt, a.stride,
      a.padding, a.dilation, false, {0, 0}, a.groups, a.need);
  return {grad_input, grad_weight, grad_bias};
}

int64_t bits_of(double v) {
  int64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

bool is_channels_last(const at::Tensor& t) {
  return t.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
}

// Everything the relative speed of the candidates may depend on.
Key make_key(const ConvArgs& a) {
  Key k{};
  size_t i = 0;
  auto put = [&](int64_t v) { k[i++] = v; };
  put(static_cast<int64_t>(a.input.device().type()));
  put(a.backward);
  put(a.backward ? a.need[0] + 2 * a.need[1] + 4 * a.need[2] + 8 * is_channels_last(a.grad) : 0);
  put(a.input.device().index());
  put(static_cast<int64_t>(a.input.scalar_type()));
  for (int64_t s : a.input.sizes()) put(s);
  put(is_channels_last(a.input));
  put(a.input.is_contiguous(a.input.suggest_memory_format()));
  for (int64_t s : a.weight.sizes()) put(s);
  put(is_channels_last(a.weight));
  for (auto* arr : {&a.stride, &a.padding, &a.dilation}) {
    put((*arr)[0]);
    put((*arr)[1]);
  }
  put(a.groups);
  put(static_cast<int64_t>(a.act.act));
  put(bits_of(a.act.alpha));
  put(bits_of(a.act.beta));
  put(a.bias.has_value());
  put(a.residual ? 1 + is_channels_last(*a.residual) : 0);
  put(at::get_num_threads());
  // TF32 changes the fp32 conv's speed. Asked for convolutions: without an operation torch throws when
  // the conv and RNN settings differ (as after torch.backends.cudnn.conv.fp32_precision = "ieee").
  put(a.input.is_cuda() && at::globalContext().allowTF32CuDNN(at::Float32Op::CONV));
  TORCH_INTERNAL_ASSERT(i == k.size(), "engine key has ", i, " fields, expected ", k.size());
  return k;
}

std::string describe(const ConvArgs& a) {
  std::ostringstream s;
  s << a.input.device().type() << " " << a.input.scalar_type() << " input" << a.input.sizes()
    << (a.format == at::MemoryFormat::ChannelsLast ? " channels_last" : "") << " weight" << a.weight.sizes()
    << " stride" << at::IntArrayRef(a.stride) << " padding" << at::IntArrayRef(a.padding) << " dilation"
    << at::IntArrayRef(a.dilation) << " groups=" << a.groups;
  if (a.backward) {
    s << " backward:";
    const char* names[] = {" input", " weight", " bias"};
    for (int i = 0; i < 3; ++i) s << (a.need[i] ? names[i] : "");
  } else {
    s << " " << act_info(a.act.act).name << (a.bias ? " +bias" : "") << (a.residual ? " +residual" : "");
  }
  return s.str();
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::atomic<void (*)(const std::string&)> warning_sink{nullptr};

// engine_perturb_check's setting, read only by tune().
std::mutex perturb_mutex;
std::string perturb_name;
double perturb_amount = 0;

double perturbation_of(const char* name) {
  std::lock_guard<std::mutex> lock(perturb_mutex);
  return perturb_name == name ? perturb_amount : 0.0;
}

void warn_once(TunerState& st, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    if (!st.warned.insert(message).second) return;
  }
  if (auto sink = warning_sink.load()) {
    sink(message);
  } else {
    TORCH_WARN(message);
  }
}

// Remembers that candidate `index` threw on `a`'s key, and says so once.
void remember_failed(TunerState& st, size_t index, const ConvArgs& a) {
  const Key key = make_key(a);
  std::lock_guard<std::mutex> lock(st.mutex);
  st.failed[key] |= uint64_t{1} << index;
  st.any_failed = true;
}

void note_failure(TunerState& st, const DeviceCandidates& dev, size_t index, const ConvArgs& a, const char* error) {
  remember_failed(st, index, a);
  std::string first_line(error);
  first_line = first_line.substr(0, first_line.find('\n'));
  warn_once(st, c10::str("fastpipe: conv engine '", dev.candidates[index].name, "' failed on ", describe(a),
                         " and is not used for it (eager runs instead): ", first_line));
}

// Remembers that candidate `index` computed `a` wrongly, and says so once.
void note_wrong(TunerState& st, const DeviceCandidates& dev, size_t index, const ConvArgs& a, const std::string& why) {
  remember_failed(st, index, a);
  warn_once(st, c10::str("fastpipe: conv engine '", dev.candidates[index].name, "' disagrees with eager on ",
                         describe(a), " and is not used for it (eager runs instead): ", why));
}

bool failed_before(TunerState& st, size_t index, const ConvArgs& a) {
  if (!st.any_failed) return false;
  const Key key = make_key(a);
  std::lock_guard<std::mutex> lock(st.mutex);
  auto it = st.failed.find(key);
  return it != st.failed.end() && (it->second >> index & 1);
}

// Times every candidate that can run `a` on `a` itself (like cudnn.benchmark) and picks one.
Choice tune(TunerState& st, const ConvArgs& a, const DeviceCandidates& dev) {
  const auto& cands = dev.candidates;
  const c10::DeviceIndex index = a.input.device().index();
  auto sync = [&] {
    if (dev.hooks.synchronize) dev.hooks.synchronize(index);
  };
  auto timed_run = [&](size_t i) {
    if (dev.hooks.elapsed_ms) return dev.hooks.elapsed_ms(index, [&] { dev.run(i, a); });
    sync();
    const double t0 = now_ms();
    dev.run(i, a);
    sync();
    return now_ms() - t0;
  };
  // Warm-up: a first call builds plans and primitives. A candidate that throws for this call is left
  // out (and remembered); eager throwing is the caller's error and surfaces.
  // A candidate's first output is checked against eager's: one that disagrees is remembered as failed.
  std::vector<size_t> eligible{0};
  for (size_t i = 1; i < cands.size(); ++i) {
    const bool timeable = cands[i].validated || st.time_unvalidated.load();
    if (timeable && cands[i].why_not(a) == nullptr && !failed_before(st, i, a)) eligible.push_back(i);
  }
  std::vector<size_t> live;
  std::string failures;
  EngineOut reference;
  for (size_t i : eligible.size() > 1 ? eligible : std::vector<size_t>{}) {  // eager alone: nothing to time
    try {
      EngineOut out = dev.run(i, a);
      if (i == 0) {
        reference = out;
      } else {
        if (const double bump = perturbation_of(cands[i].name)) {
          for (at::Tensor& t : out)
            if (t.defined()) t = t.add(bump);
        }
        if (auto why = disagreement(out, reference, a)) {
          note_wrong(st, dev, i, a, *why);
          failures += std::string(" ") + cands[i].name + "=wrong";
          continue;
        }
      }
      live.push_back(i);
    } catch (const c10::Error& e) {
      if (i == 0) throw;
      note_failure(st, dev, i, a, e.what_without_backtrace());
      failures += std::string(" ") + cands[i].name + "=failed";
    }
  }
  std::vector<double> times(cands.size(), std::numeric_limits<double>::infinity());
  std::vector<double> ratio(cands.size(), std::numeric_limits<double>::infinity());
  std::vector<std::vector<double>> ratios(cands.size());  // per candidate, per round: its time over eager's
  if (live.size() > 1) {
    // The rounds are sized from a call after the warm-up, which paid for plans, autotuning and lazy
    // loading: sized from the warm-up itself, a GPU key would get the fewest rounds.
    double slowest = 0;
    for (size_t i : live) slowest = std::max(slowest, timed_run(i));
    // Interleaved rounds, each candidate keeping its fastest (load only ever adds time) and its time
    // relative to eager's in the same round. About 150 ms of rounds, 5 to 31: fast calls are the
    // noisiest and cheapest to repeat.
    const int rounds = static_cast<int>(std::clamp(150.0 / std::max(slowest, 1e-3), 5.0, 31.0));
    for (int r = 0; r < rounds; ++r) {
      std::vector<double> t(cands.size());
      for (size_t i : live) {
        t[i] = timed_run(i);
        times[i] = std::min(times[i], t[i]);
      }
      for (size_t i : live) ratios[i].push_back(t[i] / std::max(t[0], 1e-9));
    }
    for (size_t i : live) ratio[i] = quantile(ratios[i], 0.5);
  } else {
    times[0] = 0;  // eager alone
  }
  ratio[0] = 1.0;
  Choice choice{pick_engine(times, ratio), describe(a) + " -> ", live.size() > 1};
  choice.report += cands[choice.index].name;
  if (choice.timed) choice.margin = margin_of(choice.index, live, ratios, ratio);
  if (live.size() > 1 || !failures.empty()) {
    std::ostringstream s;
    s.precision(4);
    s << " (ms:";
    for (size_t i : live) s << " " << cands[i].name << "=" << times[i] << (i ? " x" + std::to_string(ratio[i]) : "");
    s << failures << ")";
    choice.report += s.str();
  }
  return choice;
}

// The engine for a call: the forced one (FASTPIPE_CONV_ENGINE) where it can run the call, else the
// cached or newly timed choice of the call's key.
struct Selection {
  const DeviceCandidates* dev;
  size_t index;
  bool forced;
};

Selection select_engine(const ConvArgs& a) {
  TunerState& st = tuner_state();
  const DeviceCandidates* dev = st.by_slot[slot(a.input.device().type(), a.backward)];
  TORCH_CHECK(dev, "fastpipe has no convolution ", a.backward ? "backward " : "", "engines for device type ",
              a.input.device().type());
  const Selection eager{dev, 0, false};
  if (st.forcing.load(std::memory_order_relaxed)) {
    std::string forced_name;
    {
      std::lock_guard<std::mutex> lock(st.mutex);
      forced_name = st.forced;
    }
    const char* forced = forced_name.c_str();
    for (size_t i = 0; i < dev->candidates.size(); ++i) {
      const Candidate& c = dev->candidates[i];
      if (std::strcmp(c.name, forced) != 0) continue;
      if (const char* why = c.why_not(a)) {
        warn_once(st, c10::str("fastpipe: FASTPIPE_CONV_ENGINE=", forced, " cannot run ",
                               a.backward ? "the backward of " : "", a.input.scalar_type(), " on ",
                               a.input.device().type(), " (", why, "): eager runs instead"));
        return eager;
      }
      return Selection{dev, i, true};  // even one the timing dropped for this key: forcing runs what it names
    }
    std::set<std::string> names;  // besides eager, which every device has
    {
      std::lock_guard<std::mutex> lock(st.mutex);
      for (const auto& [where, d] : st.devices) {
        for (const auto& c : d.candidates) {
          if (std::strcmp(c.name, forced) == 0) return eager;  // an engine of another device type or pass
          if (std::strcmp(c.name, "eager") != 0) names.insert(c.name);
        }
      }
    }
    std::string known;
    for (const std::string& name : names) known += ", " + name;
    TORCH_CHECK(false, "FASTPIPE_CONV_ENGINE=", forced, " names no engine; use auto, eager", known);
  }
  // Nothing that timing could pick (a device type whose engines have not passed their tests on its
  // hardware yet): eager, with no key kept. This is also the forced path's code, which ran every CUDA
  // engine on an H200; the keyed path crashed there, cause not yet found (issue 20's GPU run). Its
  // choice logic (core/choice_cache.h) runs under ThreadSanitizer and ASan in tests/core/tuner_stress.cpp.
  if (!dev->any_validated && !st.time_unvalidated.load(std::memory_order_relaxed)) return eager;
  const size_t index = st.choices.select(
      make_key(a), [&] { return tune(st, a, *dev); },
      [&] { return dev->hooks.capturing && dev->hooks.capturing(); });
  return Selection{dev, index, false};
}

// Runs the selected engine. A forced engine that throws fails the call, its error (and type: an
// out-of-memory error stays one) completed with the engine's name and the call: eager's result in its
// place would hide the failure from whoever forced it. (Timing already dropped candidates that throw.)
EngineOut run_selected(const ConvArgs& a) {
  const Selection s = select_engine(a);
  if (!s.forced || s.index == 0) return s.dev->run(s.index, a);
  try {
    return s.dev->run(s.index, a);
  } catch (c10::Error& e) {
    e.add_context(c10::str("fastpipe: conv engine '", s.dev->candidates[s.index].name,
                           "', forced by FASTPIPE_CONV_ENGINE, failed on ", describe(a),
                           "; FASTPIPE_CONV_ENGINE=auto or eager runs the call without it"));
    throw;
  }
}

}  // namespace

at::Tensor run_engine(const ConvArgs& a) {
  TORCH_INTERNAL_ASSERT(!a.backward, "run_engine takes forward calls");
  return std::move(run_selected(a)[0]);
}

EngineOut run_backward_engine(const ConvArgs& a) {
  TORCH_INTERNAL_ASSERT(a.backward, "run_backward_engine takes backward calls");
  return run_selected(a);
}

std::vector<std::string> engine_names(c10::string_view device, bool backward) {
  const c10::Device d{std::string(device)};
  TunerState& st = tuner_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  std::vector<std::string> names;
  auto it = st.devices.find(slot(d.type(), backward));
  if (it != st.devices.end()) {
    for (const auto& c : it->second.candidates) names.emplace_back(c.name);
  }
  return names;
}

void engine_clear() {
  TunerState& st = tuner_state();
  st.choices.clear();
  std::lock_guard<std::mutex> lock(st.mutex);
  st.failed.clear();
  st.any_failed = false;
  st.warned.clear();
}

std::string engine_force(c10::string_view name) {
  TunerState& st = tuner_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  std::string old = st.forced.empty() ? "auto" : st.forced;
  st.forced = std::string(name);
  st.forcing = !st.forced.empty() && st.forced != "auto";
  return old;
}

bool engine_time_unvalidated(bool on) {
  TunerState& st = tuner_state();
  engine_clear();  // choices made under the other setting
  return st.time_unvalidated.exchange(on);
}

int64_t pick_engine_op(at::ArrayRef<double> fastest, at::ArrayRef<double> ratio) {
  TORCH_CHECK(!fastest.empty(), "fastest must hold eager's time first, got an empty list");
  TORCH_CHECK(ratio.size() == fastest.size(), "ratio needs one value per candidate");
  return static_cast<int64_t>(pick_engine(std::vector<double>(fastest.begin(), fastest.end()),
                                           std::vector<double>(ratio.begin(), ratio.end())));
}

void engine_perturb_check(c10::string_view name, double amount) {
  std::lock_guard<std::mutex> lock(perturb_mutex);
  perturb_name = std::string(name);
  perturb_amount = amount;
}

bool register_engines(c10::DeviceType type, DeviceHooks hooks, std::vector<Candidate> candidates, bool backward) {
  TunerState& st = tuner_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  auto install = [&](bool pass, std::vector<Candidate> cands) {
    DeviceCandidates& dev = st.devices[slot(type, pass)];
    dev.hooks = hooks;
    dev.candidates = {pass ? Candidate{"eager", always, nullptr, true, run_eager_backward}
                           : Candidate{"eager", always, run_eager, true}};
    dev.any_validated = false;
    for (const Candidate& c : cands) {
      const bool forward = c.run != nullptr, backward_engine = c.run_backward != nullptr;
      TORCH_INTERNAL_ASSERT(forward != backward_engine && backward_engine == pass, "conv engine ", c.name,
                            " registered as a ", pass ? "backward" : "forward", " engine without being one");
      dev.candidates.push_back(c);
      dev.any_validated = dev.any_validated || c.validated;
    }
    TORCH_INTERNAL_ASSERT(dev.candidates.size() <= 64, "TunerState::failed keeps one bit per candidate");
    dev.labels.clear();
    const std::string prefix = pass ? "fastpipe::conv_engine_backward." : "fastpipe::conv_engine.";
    for (const auto& c : dev.candidates) dev.labels.push_back(prefix + c.name);
    st.by_slot[slot(type, pass)] = &dev;  // unordered_map nodes are stable
  };
  install(backward, std::move(candidates));
  // A device type with forward engines has at least eager for its backward calls.
  if (!st.by_slot[slot(type, true)]) install(true, {});
  return true;
}

void set_warning_sink(void (*sink)(const std::string&)) {
  warning_sink = sink;
}

}  // namespace fastpipe::conv
