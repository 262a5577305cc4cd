// fastpipe's op schemas (all of them live here), and the fused convolution + bias + activation ops:
// argument checks, the per-key engine choice shared by every device, the CPU engines and kernels,
// autograd and autocast.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "ops/conv.h"

namespace fastpipe::conv {
namespace {

// ---- activations --------------------------------------------------------------------------------
struct ActEntry {
  const char* name;
  Act act;
  size_t nargs;
};
constexpr ActEntry kActs[] = {
    {"identity", Act::Identity, 0}, {"relu", Act::Relu, 0},       {"hardtanh", Act::Hardtanh, 2},
    {"leaky_relu", Act::LeakyRelu, 1}, {"silu", Act::Silu, 0},     {"gelu", Act::Gelu, 0},
    {"gelu_tanh", Act::GeluTanh, 0}, {"sigmoid", Act::Sigmoid, 0}, {"tanh", Act::Tanh, 0},
    {"hardswish", Act::Hardswish, 0},
};

const ActEntry& act_entry(Act a) {
  for (const auto& e : kActs) {
    if (e.act == a) return e;
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled activation ", static_cast<int>(a));
}

ActSpec parse_activation(c10::string_view name, at::ArrayRef<double> args) {
  for (const auto& e : kActs) {
    if (name != e.name) continue;
    TORCH_CHECK(args.size() == e.nargs, "act_args: activation '", e.name, "' takes ", e.nargs, " value(s), got ",
                args.size());
    const ActSpec s{e.act, e.nargs > 0 ? args[0] : 0.0, e.nargs > 1 ? args[1] : 0.0};
    TORCH_CHECK(s.act != Act::Hardtanh || s.alpha < s.beta, "act_args: hardtanh needs min < max, got min=",
                s.alpha, " max=", s.beta);
    return s;
  }
  std::string names;
  for (const auto& e : kActs) names += std::string(names.empty() ? "" : ", ") + e.name;
  C10_THROW_ERROR(ValueError, c10::str("activation must be one of ", names, "; got '", name, "'"));
}

at::Tensor apply_activation(const at::Tensor& t, const ActSpec& s, bool inplace) {
  at::Tensor x = t;
  switch (s.act) {
    case Act::Identity: return inplace ? x : x.clone();
    case Act::Relu: return inplace ? at::relu_(x) : at::relu(x);
    case Act::Hardtanh: return inplace ? at::hardtanh_(x, s.alpha, s.beta) : at::hardtanh(x, s.alpha, s.beta);
    case Act::LeakyRelu: return inplace ? at::leaky_relu_(x, s.alpha) : at::leaky_relu(x, s.alpha);
    case Act::Silu: return inplace ? at::silu_(x) : at::silu(x);
    case Act::Gelu: return inplace ? at::gelu_(x) : at::gelu(x);
    case Act::GeluTanh: return inplace ? at::gelu_(x, "tanh") : at::gelu(x, "tanh");
    case Act::Sigmoid: return inplace ? at::sigmoid_(x) : at::sigmoid(x);
    case Act::Tanh: return inplace ? at::tanh_(x) : at::tanh(x);
    case Act::Hardswish: return inplace ? at::hardswish_(x) : at::hardswish(x);
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled activation");
}

// ---- argument checks ----------------------------------------------------------------------------
std::array<int64_t, 2> pair_arg(at::IntArrayRef v, const char* name, int64_t min) {
  TORCH_CHECK(v.size() == 1 || v.size() == 2, name, " must have 2 values (height, width), got ", v.size());
  const std::array<int64_t, 2> r{v.front(), v.back()};
  TORCH_CHECK(r[0] >= min && r[1] >= min, name, " values must be >= ", min, ", got ", v);
  return r;
}

void check_like_input(const at::Tensor& t, const char* name, const at::Tensor& input) {
  TORCH_CHECK(t.device() == input.device(), name, " is on ", t.device(), " but input is on ", input.device());
  TORCH_CHECK(t.scalar_type() == input.scalar_type(), name, " has dtype ", t.scalar_type(), " but input has ",
              input.scalar_type(), " (cast it, or run under autocast)");
}

ConvArgs make_args(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                   at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                   c10::string_view activation, at::ArrayRef<double> act_args,
                   const std::optional<at::Tensor>& residual) {
  TORCH_CHECK(input.dim() == 4, "input must be 4-D (N, C, H, W), got ", input.dim(), "-D");
  TORCH_CHECK(at::isFloatingType(input.scalar_type()), "input must have a floating dtype, got ",
              input.scalar_type());
  TORCH_CHECK(weight.dim() == 4, "weight must be 4-D (out_channels, in_channels / groups, kH, kW), got ",
              weight.dim(), "-D");
  check_like_input(weight, "weight", input);
  TORCH_CHECK(groups >= 1, "groups must be >= 1, got ", groups);
  const int64_t out_channels = weight.size(0);
  TORCH_CHECK(out_channels % groups == 0, "weight.size(0) (out_channels = ", out_channels,
              ") must be divisible by groups = ", groups);
  TORCH_CHECK(input.size(1) == weight.size(1) * groups, "input has ", input.size(1),
              " channels but weight expects ", weight.size(1) * groups, " (weight.size(1) = ", weight.size(1),
              " per group, groups = ", groups, ")");
  ConvArgs a;
  a.input = input;
  a.weight = weight;
  a.stride = pair_arg(stride, "stride", 1);
  a.padding = pair_arg(padding, "padding", 0);
  a.dilation = pair_arg(dilation, "dilation", 1);
  a.groups = groups;
  a.out_sizes[0] = input.size(0);
  a.out_sizes[1] = out_channels;
  for (int d = 0; d < 2; ++d) {
    const int64_t extent = a.dilation[d] * (weight.size(2 + d) - 1) + 1;
    const int64_t padded = input.size(2 + d) + 2 * a.padding[d];
    TORCH_CHECK(padded >= extent, "input ", d == 0 ? "height" : "width", " ", input.size(2 + d), " plus padding ",
                2 * a.padding[d], " is smaller than the dilated kernel (", extent, ")");
    a.out_sizes[2 + d] = (padded - extent) / a.stride[d] + 1;
  }
  if (bias) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == out_channels, "bias must be 1-D of size out_channels = ",
                out_channels, ", got shape ", bias->sizes());
    check_like_input(*bias, "bias", input);
    a.bias = bias;
  }
  if (residual) {
    TORCH_CHECK(residual->sizes() == at::IntArrayRef(a.out_sizes), "residual must have the output's shape ",
                at::IntArrayRef(a.out_sizes), ", got ", residual->sizes());
    check_like_input(*residual, "residual", input);
    a.residual = residual;
  }
  a.act = parse_activation(activation, act_args);
  // Like eager convolution: channels_last out when either operand is channels_last.
  const bool channels_last = input.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
                             weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
  a.format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  return a;
}

int64_t out_numel(const ConvArgs& a) {
  return a.out_sizes[0] * a.out_sizes[1] * a.out_sizes[2] * a.out_sizes[3];
}

at::Tensor empty_output(const ConvArgs& a) {
  return at::empty(a.out_sizes, a.input.options().memory_format(a.format));
}

// ---- engines available everywhere / on the CPU -------------------------------------------------------
const char* always(const ConvArgs&) { return nullptr; }

// ATen's convolution (bias included), the residual added and the activation applied in place.
at::Tensor run_eager(const ConvArgs& a) {
  at::Tensor y =
      at::convolution(a.input, a.weight, a.bias, a.stride, a.padding, a.dilation, false, {0, 0}, a.groups);
  if (a.residual) y.add_(*a.residual);
  return apply_activation(y, a.act, /*inplace=*/true);
}

// torch's oneDNN fused convolution + post-ops (what inductor uses on the CPU). Looked up at first use
// since only builds with oneDNN register them.
using PointwiseFn = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                               at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, int64_t, c10::string_view,
                               c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>);
using BinaryFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                            int64_t, c10::string_view, std::optional<at::Scalar>, std::optional<c10::string_view>,
                            c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>);

struct OneDnnOps {
  std::optional<c10::TypedOperatorHandle<PointwiseFn>> unary;
  std::optional<c10::TypedOperatorHandle<BinaryFn>> binary;
};

const OneDnnOps& onednn_ops() {
  static const OneDnnOps ops = [] {
    OneDnnOps o;
    if (!at::hasMKLDNN()) return o;
    auto& dispatcher = c10::Dispatcher::singleton();
    try {  // typed() throws if this torch declares another signature: then go without
      if (auto h = dispatcher.findSchema({"mkldnn::_convolution_pointwise", ""})) o.unary = h->typed<PointwiseFn>();
      if (auto h = dispatcher.findSchema({"mkldnn::_convolution_pointwise", "binary"})) {
        o.binary = h->typed<BinaryFn>();
      }
    } catch (const c10::Error&) {
      o = OneDnnOps{};
    }
    return o;
  }();
  return ops;
}

// The dtypes torch's oneDNN runs on this CPU, as a mask of ScalarType bits: float32 always; float16 needs
// AVX512-FP16 or AVX-NE-CONVERT and bfloat16 AVX512-BW/VL/DQ or AVX-NE-CONVERT (torch's own query, asked
// once). Tests may override the mask (_conv_onednn_dtypes_override) to show the fallback on any CPU.
uint64_t dtype_bit(at::ScalarType t) {
  return uint64_t{1} << static_cast<int>(t);
}

uint64_t query_onednn_dtypes() {
  const auto ask = [](const char* op) {
    auto h = c10::Dispatcher::singleton().findSchema({op, ""});
    return h.has_value() && h->typed<bool()>().call();
  };
  if (!at::hasMKLDNN()) return 0;
  return dtype_bit(at::kFloat) | (ask("mkldnn::_is_mkldnn_fp16_supported") ? dtype_bit(at::kHalf) : 0) |
         (ask("mkldnn::_is_mkldnn_bf16_supported") ? dtype_bit(at::kBFloat16) : 0);
}

constexpr int64_t kNoOverride = -1;
std::atomic<int64_t> onednn_dtypes_override{kNoOverride};

uint64_t onednn_dtypes() {
  static const uint64_t cpu = query_onednn_dtypes();
  const int64_t o = onednn_dtypes_override.load(std::memory_order_relaxed);
  return o == kNoOverride ? cpu : static_cast<uint64_t>(o);
}

const char* onednn_why_not(const ConvArgs& a) {
  if (!a.input.is_cpu()) return "not a CPU tensor";
  if (!onednn_ops().unary.has_value()) return "this torch has no oneDNN fused convolution";
  if (a.residual && !onednn_ops().binary.has_value()) return "this torch has no oneDNN convolution + add";
  const at::ScalarType dt = a.input.scalar_type();
  if (onednn_dtypes() & dtype_bit(dt)) return nullptr;
  switch (dt) {
    case at::kHalf: return "this CPU's oneDNN has no float16 path (it needs AVX512-FP16 or AVX-NE-CONVERT)";
    case at::kBFloat16: return "this CPU's oneDNN has no bfloat16 path (it needs AVX512-BW/VL/DQ or AVX-NE-CONVERT)";
    default: return "oneDNN takes float32, float16 and bfloat16 only";
  }
}

at::Tensor onednn_run(const ConvArgs& a) {
  const OneDnnOps& ops = onednn_ops();
  if (a.residual) {
    // The binary form fuses only relu after the add; other activations follow in place. Where oneDNN
    // cannot fuse the add (NCHW, grouped convolutions, ...) torch falls back to ATen's add_relu, which
    // has only a float32 kernel: in reduced precision relu follows in place too.
    const bool fuse_relu = a.act.act == Act::Relu && a.input.scalar_type() == at::kFloat;
    at::Tensor y = ops.binary->call(a.input, *a.residual, a.weight, a.bias, a.padding, a.stride, a.dilation,
                                    a.groups, "add", std::nullopt,
                                    fuse_relu ? std::optional<c10::string_view>("relu") : std::nullopt,
                                    c10::List<std::optional<at::Scalar>>(), std::nullopt);
    return fuse_relu ? y : apply_activation(y, a.act, /*inplace=*/true);
  }
  const char* attr = "none";
  c10::List<std::optional<at::Scalar>> scalars;
  std::optional<c10::string_view> algorithm;
  switch (a.act.act) {
    case Act::Identity: break;
    case Act::Relu: attr = "relu"; break;
    case Act::Hardtanh:
      attr = "hardtanh";
      scalars.push_back(at::Scalar(a.act.alpha));
      scalars.push_back(at::Scalar(a.act.beta));
      break;
    case Act::LeakyRelu:
      attr = "leaky_relu";
      scalars.push_back(at::Scalar(a.act.alpha));
      break;
    case Act::Silu: attr = "swish"; break;
    case Act::Gelu:
      attr = "gelu";
      algorithm = "none";
      break;
    case Act::GeluTanh:
      attr = "gelu";
      algorithm = "tanh";
      break;
    case Act::Sigmoid: attr = "sigmoid"; break;
    case Act::Tanh: attr = "tanh"; break;
    case Act::Hardswish: attr = "hardswish"; break;
  }
  return ops.unary->call(a.input, a.weight, a.bias, a.padding, a.stride, a.dilation, a.groups, attr, scalars,
                         algorithm);
}

// ---- engine registry, per-key choice and its cache --------------------------------------------------
constexpr double kSwitchMargin = 1.03;  // a candidate replaces eager only when at least 3% faster

struct DeviceEngines {
  DeviceHooks hooks{};
  std::vector<Candidate> candidates;  // [0] is eager
  std::vector<std::string> labels;    // per candidate: "fastpipe::conv_engine.<name>", the profiler's name

  // Runs candidate i under a profiler label, so that a trace (and the tests) show which engine ran.
  at::Tensor run(size_t i, const ConvArgs& a) const {
    RECORD_FUNCTION(labels[i].c_str(), std::vector<c10::IValue>());
    return candidates[i].run(a);
  }
};

using Key = std::array<int64_t, 28>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 0;
    for (int64_t v : k) h = h * 1000003u ^ std::hash<int64_t>{}(v);
    return h;
  }
};

struct Choice {
  size_t index;
  std::string report;
};

struct EngineState {
  std::mutex mutex;
  std::unordered_map<int, DeviceEngines> devices;  // by c10::DeviceType
  std::unordered_map<Key, Choice, KeyHash> cache;
  // Candidates that threw on a key (bit i: candidate i), never tried on it again; `any_failed` lets
  // the forced path skip building the key while nothing ever failed.
  std::unordered_map<Key, uint64_t, KeyHash> failed;
  std::atomic<bool> any_failed{false};
  std::unordered_set<std::string> warned;  // warnings already given (each is given once)
};

EngineState& engine_state() {
  static EngineState state;
  return state;
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
  put(a.input.is_cuda() && at::globalContext().allowTF32CuDNN());  // TF32 changes the fp32 conv's speed
  TORCH_INTERNAL_ASSERT(i == k.size(), "engine key has ", i, " fields, expected ", k.size());
  return k;
}

std::string describe(const ConvArgs& a) {
  std::ostringstream s;
  s << a.input.device().type() << " " << a.input.scalar_type() << " input" << a.input.sizes()
    << (a.format == at::MemoryFormat::ChannelsLast ? " channels_last" : "") << " weight" << a.weight.sizes()
    << " stride" << at::IntArrayRef(a.stride) << " padding" << at::IntArrayRef(a.padding) << " dilation"
    << at::IntArrayRef(a.dilation) << " groups=" << a.groups << " " << act_entry(a.act.act).name
    << (a.bias ? " +bias" : "") << (a.residual ? " +residual" : "");
  return s.str();
}

size_t pick_engine(at::ArrayRef<double> times) {
  size_t best = 0;
  for (size_t i = 1; i < times.size(); ++i) {
    if (times[i] < times[best]) best = i;
  }
  return times[best] * kSwitchMargin <= times[0] ? best : 0;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::atomic<void (*)(const std::string&)> warning_sink{nullptr};

void warn_once(EngineState& st, const std::string& message) {
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
void note_failure(EngineState& st, const DeviceEngines& dev, size_t index, const ConvArgs& a, const char* error) {
  const Key key = make_key(a);
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    st.failed[key] |= uint64_t{1} << index;
    st.any_failed = true;
  }
  std::string first_line(error);
  first_line = first_line.substr(0, first_line.find('\n'));
  warn_once(st, c10::str("fastpipe: conv engine '", dev.candidates[index].name, "' failed on ", describe(a),
                         " and is not used for it (eager runs instead): ", first_line));
}

bool failed_before(EngineState& st, size_t index, const ConvArgs& a) {
  if (!st.any_failed) return false;
  const Key key = make_key(a);
  std::lock_guard<std::mutex> lock(st.mutex);
  auto it = st.failed.find(key);
  return it != st.failed.end() && (it->second >> index & 1);
}

// Times every candidate that can run `a` on `a` itself (like cudnn.benchmark) and picks one.
Choice tune(EngineState& st, const ConvArgs& a, const DeviceEngines& dev) {
  const auto& cands = dev.candidates;
  const c10::DeviceIndex index = a.input.device().index();
  auto sync = [&] {
    if (dev.hooks.synchronize) dev.hooks.synchronize(index);
  };
  auto timed_run = [&](size_t i) {
    sync();
    const double t0 = now_ms();
    dev.run(i, a);
    sync();
    return now_ms() - t0;
  };
  // Warm-up: a first call builds plans and primitives. A candidate that throws for this call is left
  // out (and remembered); eager throwing is the caller's error and surfaces.
  std::vector<size_t> eligible{0};
  for (size_t i = 1; i < cands.size(); ++i) {
    if (cands[i].why_not(a) == nullptr && !failed_before(st, i, a)) eligible.push_back(i);
  }
  std::vector<size_t> live;
  std::string failures;
  double slowest = 0;
  for (size_t i : eligible.size() > 1 ? eligible : std::vector<size_t>{}) {  // eager alone: nothing to time
    try {
      slowest = std::max(slowest, timed_run(i));
      live.push_back(i);
    } catch (const c10::Error& e) {
      if (i == 0) throw;
      note_failure(st, dev, i, a, e.what_without_backtrace());
      failures += std::string(" ") + cands[i].name + "=failed";
    }
  }
  std::vector<double> times(cands.size(), std::numeric_limits<double>::infinity());
  if (live.size() > 1) {
    // Interleaved rounds; each candidate keeps its fastest. Load from elsewhere only ever adds time
    // (on a busy CPU, in bursts), so the minimum is the least disturbed estimate of a candidate's cost.
    // About 100 ms of rounds, 3 to 25: fast calls are the noisiest and cheapest to repeat.
    const int rounds = static_cast<int>(std::clamp(100.0 / std::max(slowest, 1e-3), 3.0, 25.0));
    for (int r = 0; r < rounds; ++r) {
      for (size_t i : live) times[i] = std::min(times[i], timed_run(i));
    }
  } else {
    times[0] = 0;  // eager alone
  }
  Choice choice{pick_engine(times), describe(a) + " -> "};
  choice.report += cands[choice.index].name;
  if (live.size() > 1 || !failures.empty()) {
    std::ostringstream s;
    s.precision(4);
    s << " (ms:";
    for (size_t i : live) s << " " << cands[i].name << "=" << times[i];
    s << failures << ")";
    choice.report += s.str();
  }
  return choice;
}

// The engine for a call: the forced one (FASTPIPE_CONV_ENGINE) where it can run the call, else the
// cached or newly timed choice of the call's key.
struct Selection {
  const DeviceEngines* dev;
  size_t index;
  bool forced;
};

Selection select_engine(const ConvArgs& a) {
  EngineState& st = engine_state();
  const DeviceEngines* dev = nullptr;
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    auto it = st.devices.find(static_cast<int>(a.input.device().type()));
    TORCH_CHECK(it != st.devices.end(), "fastpipe has no convolution engines for device type ",
                a.input.device().type());
    dev = &it->second;  // map nodes are stable; devices are only added during static initialisation
  }
  const Selection eager{dev, 0, false};
  const char* forced = std::getenv("FASTPIPE_CONV_ENGINE");
  if (forced != nullptr && *forced != '\0' && std::strcmp(forced, "auto") != 0) {
    for (size_t i = 0; i < dev->candidates.size(); ++i) {
      const Candidate& c = dev->candidates[i];
      if (std::strcmp(c.name, forced) != 0) continue;
      if (const char* why = c.why_not(a)) {
        warn_once(st, c10::str("fastpipe: FASTPIPE_CONV_ENGINE=", forced, " cannot run ", a.input.scalar_type(),
                               " on ", a.input.device().type(), " (", why, "): eager runs instead"));
        return eager;
      }
      return i > 0 && failed_before(st, i, a) ? eager : Selection{dev, i, true};
    }
    std::string known;
    {
      std::lock_guard<std::mutex> lock(st.mutex);
      for (const auto& [type, d] : st.devices) {
        for (const auto& c : d.candidates) {
          if (std::strcmp(c.name, forced) == 0) return eager;  // an engine of another device type
          if (known.find(c.name) == std::string::npos) known += std::string(", ") + c.name;
        }
      }
    }
    TORCH_CHECK(false, "FASTPIPE_CONV_ENGINE=", forced, " names no engine; use auto", known);
  }
  const Key key = make_key(a);
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    auto it = st.cache.find(key);
    if (it != st.cache.end()) return Selection{dev, it->second.index, false};
  }
  if (dev->hooks.capturing && dev->hooks.capturing()) return eager;  // timing would break a graph capture
  Choice choice = tune(st, a, *dev);
  const size_t index = choice.index;
  std::lock_guard<std::mutex> lock(st.mutex);
  st.cache.emplace(key, std::move(choice));
  return Selection{dev, index, false};
}

// Runs the selected engine. A forced engine that throws is remembered for the key and eager runs
// instead (the auto path already dropped throwing candidates while timing).
at::Tensor run_engine(const ConvArgs& a) {
  const Selection s = select_engine(a);
  if (!s.forced || s.index == 0) return s.dev->run(s.index, a);
  try {
    return s.dev->run(s.index, a);
  } catch (const c10::Error& e) {
    note_failure(engine_state(), *s.dev, s.index, a, e.what_without_backtrace());
    return s.dev->run(0, a);
  }
}

// ---- introspection ops (fastpipe/nn/_engines.py) ------------------------------------------------
std::vector<std::string> engine_names(c10::string_view device) {
  const c10::Device d{std::string(device)};
  EngineState& st = engine_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  std::vector<std::string> names;
  auto it = st.devices.find(static_cast<int>(d.type()));
  if (it != st.devices.end()) {
    for (const auto& c : it->second.candidates) names.emplace_back(c.name);
  }
  return names;
}

std::vector<std::string> engine_cache() {
  EngineState& st = engine_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  std::vector<std::string> lines;
  for (const auto& [key, choice] : st.cache) lines.push_back(choice.report);
  std::sort(lines.begin(), lines.end());
  return lines;
}

void engine_clear() {
  EngineState& st = engine_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  st.cache.clear();
  st.failed.clear();
  st.any_failed = false;
  st.warned.clear();
}

const std::pair<at::ScalarType, const char*> kOneDnnDtypeNames[] = {
    {at::kFloat, "float32"}, {at::kHalf, "float16"}, {at::kBFloat16, "bfloat16"}, {at::kDouble, "float64"}};

std::vector<std::string> onednn_dtype_names() {
  std::vector<std::string> names;
  for (const auto& [t, name] : kOneDnnDtypeNames) {
    if (onednn_dtypes() & dtype_bit(t)) names.emplace_back(name);
  }
  return names;
}

// Test hook: declare the oneDNN engine able to run exactly `dtypes` (None: what this CPU can run).
// Forgets every choice, failure and warning, which depended on the old answer.
void onednn_dtypes_override_op(const std::optional<std::vector<std::string>>& dtypes) {
  int64_t mask = kNoOverride;
  if (dtypes) {
    mask = 0;
    for (const auto& d : *dtypes) {
      const auto* e = std::find_if(std::begin(kOneDnnDtypeNames), std::end(kOneDnnDtypeNames),
                                   [&](const auto& p) { return d == p.second; });
      TORCH_CHECK(e != std::end(kOneDnnDtypeNames), "dtypes: unknown dtype '", d, "'");
      mask |= static_cast<int64_t>(dtype_bit(e->first));
    }
  }
  onednn_dtypes_override = mask;
  engine_clear();
}

int64_t pick_engine_op(at::ArrayRef<double> times) {
  TORCH_CHECK(!times.empty(), "times must hold eager's time first, got an empty list");
  return static_cast<int64_t>(pick_engine(times));
}

std::tuple<at::Tensor, at::Tensor> conv2d_act_backward_cpu(const at::Tensor& grad_out, const at::Tensor& saved,
                                                           c10::string_view activation,
                                                           at::ArrayRef<double> act_args, bool bias_grad) {
  return act_backward_aten(grad_out, saved, check_backward_args(grad_out, saved, activation, act_args), bias_grad);
}

// ---- the ops as seen from the dispatcher, for autocast and autograd ------------------------------------
template <typename Ret>
using ConvOpFn = Ret(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::IntArrayRef,
                     at::IntArrayRef, at::IntArrayRef, int64_t, c10::string_view, at::ArrayRef<double>,
                     const std::optional<at::Tensor>&);

constexpr char kConv2dAct[] = "fastpipe::conv2d_act";
constexpr char kConv2dActTrain[] = "fastpipe::_conv2d_act_train";

template <typename Fn>
c10::TypedOperatorHandle<Fn> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

// Autocast: run the conv ops in the autocast dtype, like F.conv2d.
template <c10::DeviceType D, typename Ret, const char* Name>
Ret autocast_conv(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                  c10::string_view activation, at::ArrayRef<double> act_args,
                  const std::optional<at::Tensor>& residual) {
  static const auto op = op_handle<ConvOpFn<Ret>>(Name);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(at::autocast::get_autocast_dispatch_key_from_device_type(D));
  const at::ScalarType dt = at::autocast::get_lower_precision_fp_from_device_type(D);
  using at::autocast::cached_cast;
  return op.call(cached_cast(dt, input, D), cached_cast(dt, weight, D), cached_cast(dt, bias, D), stride, padding,
                 dilation, groups, activation, act_args, cached_cast(dt, residual, D));
}

template <c10::DeviceType D>
void register_autocast(torch::Library& m) {
  m.impl("conv2d_act", &autocast_conv<D, at::Tensor, kConv2dAct>);
  m.impl("_conv2d_act_train", &autocast_conv<D, std::tuple<at::Tensor, at::Tensor>, kConv2dActTrain>);
}

// ---- autograd ---------------------------------------------------------------------------------------
// In C++ rather than torch.library.register_autograd: the Python wrapper costs ~0.1 ms per call,
// more than a small convolution (and far more than its CUDA kernels).

// Activations whose derivative their output determines: backward keeps the output (which exists
// anyway); the others keep the pre-activation.
bool grad_from_output(const ActSpec& s) {
  switch (s.act) {
    case Act::Identity:
    case Act::Relu:
    case Act::Hardtanh:
    case Act::Sigmoid:
    case Act::Tanh:
      return true;
    case Act::LeakyRelu:
      return s.alpha >= 0;  // a negative slope flips the sign: the output no longer tells the branch
    default:
      return false;
  }
}

using ActBackwardFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, c10::string_view,
                                                         at::ArrayRef<double>, bool);

// act(conv(input) + bias + residual). An absent bias or residual is no input of the node: the inputs
// (edges) are input, weight, then bias and residual where given.
struct ConvActFunction : public torch::autograd::Function<ConvActFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                                                const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                                const std::optional<at::Tensor>& residual, at::IntArrayRef stride,
                                                at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                                                c10::string_view activation, at::ArrayRef<double> act_args,
                                                bool keep_preact, bool return_preact) {
    static const auto fwd = op_handle<ConvOpFn<at::Tensor>>(kConv2dAct);
    static const auto train = op_handle<ConvOpFn<std::tuple<at::Tensor, at::Tensor>>>(kConv2dActTrain);
    at::Tensor out, preact;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      if (keep_preact || return_preact) {
        std::tie(out, preact) =
            train.call(input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual);
      } else {
        out = fwd.call(input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual);
      }
    }
    ctx->saved_data["stride"] = stride.vec();
    ctx->saved_data["padding"] = padding.vec();
    ctx->saved_data["dilation"] = dilation.vec();
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["activation"] = std::string(activation);
    ctx->saved_data["act_args"] = act_args.vec();
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["has_residual"] = residual.has_value();
    // conv2d_act_autograd asks for keep_preact whenever the activation needs it, so preact is there.
    ctx->save_for_backward({input, weight, grad_from_output(parse_activation(activation, act_args)) ? out : preact});
    if (!return_preact) return {out};
    ctx->mark_non_differentiable({preact});
    ctx->set_materialize_grads(false);  // else autograd fills a zero gradient for preact on every backward
    return {out, preact};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto act_backward = op_handle<ActBackwardFn>("fastpipe::_conv2d_act_backward");
    constexpr size_t kInputs = 12;  // forward's arguments after ctx
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) return torch::autograd::variable_list(kInputs);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &weight = saved[1];
    const auto stride = ctx->saved_data["stride"].toIntVector();
    const auto padding = ctx->saved_data["padding"].toIntVector();
    const auto dilation = ctx->saved_data["dilation"].toIntVector();
    const int64_t groups = ctx->saved_data["groups"].toInt();
    const std::string activation = ctx->saved_data["activation"].toStringRef();
    const auto act_args = ctx->saved_data["act_args"].toDoubleVector();
    const at::Tensor& act_saved = saved[2];
    TORCH_INTERNAL_ASSERT(act_saved.defined(), "conv2d_act backward without the tensor it keeps");
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    const bool need_b = has_bias && ctx->needs_input_grad(2);
    const bool need_r = ctx->saved_data["has_residual"].toBool() && ctx->needs_input_grad(has_bias ? 3 : 2);
    const bool identity = activation == "identity";
    // The bias gradient comes from convolution_backward where no activation kernel runs, and on the CPU,
    // where oneDNN sums it inside its weight-gradient pass; on CUDA the activation kernel sums it in the
    // same pass over the gradient.
    const bool bias_from_conv = need_b && (identity || !grad.is_cuda());
    at::Tensor grad_pre = grad, grad_bias;
    if (!identity) {
      std::tie(grad_pre, grad_bias) = act_backward.call(grad, act_saved, activation, act_args,
                                                        need_b && !bias_from_conv);
    }
    at::Tensor grad_x, grad_w;
    if (need_x || need_w || bias_from_conv) {
      const std::vector<int64_t> bias_sizes{weight.size(0)};
      at::Tensor grad_b;
      std::tie(grad_x, grad_w, grad_b) = at::convolution_backward(
          grad_pre, input, weight, bias_from_conv ? std::optional<at::IntArrayRef>(bias_sizes) : std::nullopt,
          stride, padding, dilation, false, {0, 0}, groups, {need_x, need_w, bias_from_conv});
      if (bias_from_conv) grad_bias = grad_b;
    }
    torch::autograd::variable_list out(kInputs);  // by forward argument
    out[0] = grad_x;
    out[1] = grad_w;
    out[2] = need_b ? grad_bias : at::Tensor();
    out[3] = need_r ? grad_pre : at::Tensor();
    return out;
  }
};

bool requires_grad(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->requires_grad();
}

at::Tensor conv2d_act_autograd(const at::Tensor& input, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                               at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                               c10::string_view activation, at::ArrayRef<double> act_args,
                               const std::optional<at::Tensor>& residual) {
  if (!at::GradMode::is_enabled() ||
      !(input.requires_grad() || weight.requires_grad() || requires_grad(bias) || requires_grad(residual))) {
    // No backward will run: skip building an autograd node (a few microseconds per call).
    static const auto fwd = op_handle<ConvOpFn<at::Tensor>>(kConv2dAct);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return fwd.call(input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual);
  }
  // Keep the pre-activation when the activation's derivative needs it.
  const bool keep_preact = !grad_from_output(parse_activation(activation, act_args));
  return ConvActFunction::apply(input, weight, bias, residual, stride, padding, dilation, groups, activation,
                                act_args, keep_preact, false)[0];
}

std::tuple<at::Tensor, at::Tensor> conv2d_act_train_autograd(const at::Tensor& input, const at::Tensor& weight,
                                                             const std::optional<at::Tensor>& bias,
                                                             at::IntArrayRef stride, at::IntArrayRef padding,
                                                             at::IntArrayRef dilation, int64_t groups,
                                                             c10::string_view activation,
                                                             at::ArrayRef<double> act_args,
                                                             const std::optional<at::Tensor>& residual) {
  auto out = ConvActFunction::apply(input, weight, bias, residual, stride, padding, dilation, groups, activation,
                                    act_args, true, true);
  return {out[0], out[1]};
}

[[maybe_unused]] const bool cpu_engines =
    register_engines(c10::DeviceType::CPU, DeviceHooks{}, {{"onednn", onednn_why_not, onednn_run}});

#ifndef FASTPIPE_WITH_CUDA
void no_cuda_kernels(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK(false, op.schema().name(),
              ": fastpipe was built without CUDA kernels (FASTPIPE_CUDA=0, a CPU-only torch or no CUDA toolkit at "
              "build time); rebuild it with CUDA to use CUDA tensors");
}
#endif

}  // namespace

// ---- op bodies (conv.h) -----------------------------------------------------------------------------
void set_warning_sink(void (*sink)(const std::string&)) {
  warning_sink = sink;
}

bool register_engines(c10::DeviceType type, DeviceHooks hooks, std::vector<Candidate> candidates) {
  EngineState& st = engine_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  DeviceEngines& dev = st.devices[static_cast<int>(type)];
  dev.hooks = hooks;
  dev.candidates = {Candidate{"eager", always, run_eager}};
  dev.candidates.insert(dev.candidates.end(), candidates.begin(), candidates.end());
  TORCH_INTERNAL_ASSERT(dev.candidates.size() <= 64, "EngineState::failed keeps one bit per candidate");
  dev.labels.clear();
  for (const auto& c : dev.candidates) dev.labels.push_back(std::string("fastpipe::conv_engine.") + c.name);
  return true;
}

at::Tensor conv2d_act(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                      at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                      c10::string_view activation, at::ArrayRef<double> act_args,
                      const std::optional<at::Tensor>& residual) {
  const ConvArgs a =
      make_args(input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual);
  const c10::OptionalDeviceGuard guard(input.device());
  if (out_numel(a) == 0) return empty_output(a);
  return run_engine(a).contiguous(a.format);
}

std::tuple<at::Tensor, at::Tensor> conv2d_act_train(const at::Tensor& input, const at::Tensor& weight,
                                                    const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                                    at::IntArrayRef padding, at::IntArrayRef dilation,
                                                    int64_t groups, c10::string_view activation,
                                                    at::ArrayRef<double> act_args,
                                                    const std::optional<at::Tensor>& residual) {
  ConvArgs a = make_args(input, weight, bias, stride, padding, dilation, groups, activation, act_args, residual);
  const c10::OptionalDeviceGuard guard(input.device());
  if (out_numel(a) == 0) return {empty_output(a), empty_output(a)};
  // The engines compute the pre-activation (their choice is that of the identity key); the activation
  // follows out of place so that both tensors survive.
  const ActSpec act = a.act;
  a.act = ActSpec{};
  at::Tensor preact = run_engine(a).contiguous(a.format);
  return {apply_activation(preact, act, /*inplace=*/false), preact};
}

ActSpec check_backward_args(const at::Tensor& grad_out, const at::Tensor& saved, c10::string_view activation,
                            at::ArrayRef<double> act_args) {
  TORCH_CHECK(saved.dim() == 4, "saved must be 4-D (N, C, H, W), got ", saved.dim(), "-D");
  TORCH_CHECK(grad_out.sizes() == saved.sizes(), "grad_out has shape ", grad_out.sizes(), " but saved has ",
              saved.sizes());
  TORCH_CHECK(grad_out.scalar_type() == saved.scalar_type(), "grad_out has dtype ", grad_out.scalar_type(),
              " but saved has ", saved.scalar_type());
  TORCH_CHECK(grad_out.device() == saved.device(), "grad_out is on ", grad_out.device(), " but saved is on ",
              saved.device());
  return parse_activation(activation, act_args);
}

std::tuple<at::Tensor, at::Tensor> act_backward_aten(const at::Tensor& grad_out, const at::Tensor& saved,
                                                     const ActSpec& act, bool bias_grad) {
  const auto fmt = saved.suggest_memory_format();
  const at::Tensor g = grad_out.contiguous(fmt);
  const at::Tensor s = saved.contiguous(fmt);
  at::Tensor gz;
  switch (act.act) {
    case Act::Identity: gz = g.clone(fmt); break;
    case Act::Relu: gz = at::threshold_backward(g, s, 0); break;
    case Act::Hardtanh: gz = at::hardtanh_backward(g, s, act.alpha, act.beta); break;
    case Act::LeakyRelu: gz = at::leaky_relu_backward(g, s, act.alpha, /*self_is_result=*/false); break;
    case Act::Silu: gz = at::silu_backward(g, s); break;
    case Act::Gelu: gz = at::gelu_backward(g, s, "none"); break;
    case Act::GeluTanh: gz = at::gelu_backward(g, s, "tanh"); break;
    case Act::Sigmoid: gz = at::sigmoid_backward(g, s); break;
    case Act::Tanh: gz = at::tanh_backward(g, s); break;
    case Act::Hardswish: gz = at::hardswish_backward(g, s); break;
  }
  gz = gz.contiguous(fmt);
  at::Tensor gb = bias_grad ? gz.sum({0, 2, 3}) : at::empty({0}, gz.options());
  return {gz, gb};
}

}  // namespace fastpipe::conv

TORCH_LIBRARY(fastpipe, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  // act(conv2d(input, weight) + bias + residual) with activation/act_args as in fastpipe/ops.py.
  m.def(
      "conv2d_act(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
      "int[2] dilation=1, int groups=1, str activation=\"relu\", float[] act_args=[], Tensor? residual=None) "
      "-> Tensor",
      tags);
  // The same, also returning the pre-activation (kept for backward by activations that need it).
  m.def(
      "_conv2d_act_train(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
      "int[2] dilation=1, int groups=1, str activation=\"relu\", float[] act_args=[], Tensor? residual=None) "
      "-> (Tensor, Tensor)",
      tags);
  // (grad w.r.t. the pre-activation, grad_bias or an empty tensor when not bias_grad) from the
  // gradient w.r.t. the output and the saved output or pre-activation.
  m.def(
      "_conv2d_act_backward(Tensor grad_out, Tensor saved, str activation, float[] act_args, bool bias_grad) "
      "-> (Tensor, Tensor)",
      tags);
  // Engine choice: names per device type, the cached choices, clearing them, and the choice rule.
  m.def("_conv_engines(str device) -> str[]", &fastpipe::conv::engine_names);
  m.def("_conv_engine_cache() -> str[]", &fastpipe::conv::engine_cache);
  m.def("_conv_engine_clear() -> ()", &fastpipe::conv::engine_clear);
  m.def("_conv_pick_engine(float[] times) -> int", &fastpipe::conv::pick_engine_op);
  // The dtypes the CPU oneDNN engine declares on this CPU, and the test hook that overrides them.
  m.def("_conv_onednn_dtypes() -> str[]", &fastpipe::conv::onednn_dtype_names);
  m.def("_conv_onednn_dtypes_override(str[]? dtypes) -> ()", &fastpipe::conv::onednn_dtypes_override_op);
}

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) {
  m.impl("conv2d_act", &fastpipe::conv::conv2d_act);
  m.impl("_conv2d_act_train", &fastpipe::conv::conv2d_act_train);
  m.impl("_conv2d_act_backward", &fastpipe::conv::conv2d_act_backward_cpu);
}

TORCH_LIBRARY_IMPL(fastpipe, Autograd, m) {
  m.impl("conv2d_act", &fastpipe::conv::conv2d_act_autograd);
  m.impl("_conv2d_act_train", &fastpipe::conv::conv2d_act_train_autograd);
}

TORCH_LIBRARY_IMPL(fastpipe, AutocastCPU, m) {
  fastpipe::conv::register_autocast<c10::DeviceType::CPU>(m);
}

TORCH_LIBRARY_IMPL(fastpipe, AutocastCUDA, m) {
  fastpipe::conv::register_autocast<c10::DeviceType::CUDA>(m);
}

#ifndef FASTPIPE_WITH_CUDA
TORCH_LIBRARY_IMPL(fastpipe, CUDA, m) {
  const auto fail = [] { return torch::CppFunction::makeFromBoxedFunction<&fastpipe::conv::no_cuda_kernels>(); };
  m.impl("conv2d_act", fail());
  m.impl("_conv2d_act_train", fail());
  m.impl("_conv2d_act_backward", fail());
}
#endif
