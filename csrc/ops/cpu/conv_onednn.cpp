#include "ops/cpu/conv_onednn.h"

#include <ATen/Context.h>
#include <ATen/core/List.h>

#include <algorithm>
#include <atomic>
#include <iterator>

#include "ops/activations.h"
#include "ops/conv_tuner.h"

namespace fastpipe::conv {
namespace {

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

// The unary form: the convolution with `act` fused (Identity: none).
at::Tensor onednn_conv(const ConvArgs& a, const ActSpec& act) {
  const char* attr = "none";
  c10::List<std::optional<at::Scalar>> scalars;
  std::optional<c10::string_view> algorithm;
  switch (act.act) {
    case Act::Identity: break;
    case Act::Relu: attr = "relu"; break;
    case Act::Hardtanh:
      attr = "hardtanh";
      scalars.push_back(at::Scalar(act.alpha));
      scalars.push_back(at::Scalar(act.beta));
      break;
    case Act::LeakyRelu:
      attr = "leaky_relu";
      scalars.push_back(at::Scalar(act.alpha));
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
  return onednn_ops().unary->call(a.input, a.weight, a.bias, a.padding, a.stride, a.dilation, a.groups, attr,
                                  scalars, algorithm);
}

at::Tensor onednn_run(const ConvArgs& a) {
  if (!a.residual) return onednn_conv(a, a.act);
  // torch 2.11's fused convolution + add cannot create its memory for an output of one pixel in
  // channels_last ("could not create a memory"; 2.14 can): there the add follows the convolution.
  if (a.residual->size(2) == 1 && a.residual->size(3) == 1)
    return apply_activation(onednn_conv(a, ActSpec{}).add_(*a.residual), a.act, /*inplace=*/true);
  // The binary form fuses only relu after the add; other activations follow in place. Where oneDNN
  // cannot fuse the add (NCHW, grouped convolutions, ...) torch falls back to ATen's add_relu, which
  // has only a float32 kernel: in reduced precision relu follows in place too.
  const bool fuse_relu = a.act.act == Act::Relu && a.input.scalar_type() == at::kFloat;
  at::Tensor y = onednn_ops().binary->call(a.input, *a.residual, a.weight, a.bias, a.padding, a.stride, a.dilation,
                                           a.groups, "add", std::nullopt,
                                           fuse_relu ? std::optional<c10::string_view>("relu") : std::nullopt,
                                           c10::List<std::optional<at::Scalar>>(), std::nullopt);
  return fuse_relu ? y : apply_activation(y, a.act, /*inplace=*/true);
}

// Names for the introspection ops (float64 only ever by the test override).
const std::pair<at::ScalarType, const char*> kOneDnnDtypeNames[] = {
    {at::kFloat, "float32"}, {at::kHalf, "float16"}, {at::kBFloat16, "bfloat16"}, {at::kDouble, "float64"}};

[[maybe_unused]] const bool cpu_engines =
    register_engines(c10::DeviceType::CPU, DeviceHooks{}, {{"onednn", onednn_why_not, onednn_run}});

}  // namespace

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

}  // namespace fastpipe::conv
