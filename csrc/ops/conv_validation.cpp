#include "ops/conv_validation.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>

#include <algorithm>

namespace fastpipe::conv {

// How far a candidate's output may be from eager's, relative to the largest magnitude of eager's: the
// rounding of the dtype over a convolution's sum, and TF32 where cuDNN may use it for float32.
double output_tolerance(const ConvArgs& a) {
  switch (a.input.scalar_type()) {
    case at::kDouble: return 1e-9;
    case at::kFloat:
      return a.input.is_cuda() && at::globalContext().allowTF32CuDNN(at::Float32Op::CONV) ? 2e-2 : 1e-3;
    case at::kHalf: return 1e-2;
    default: return 4e-2;  // bfloat16
  }
}

// Why `got` is not eager's `want` within tolerance (nullopt when it is): a shape or dtype that differs,
// a NaN or infinity where eager has none, or the largest difference.
static std::optional<std::string> disagreement(const at::Tensor& got, const at::Tensor& want, double tolerance) {
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type())
    return c10::str("its output is ", got.scalar_type(), got.sizes(), ", eager's ", want.scalar_type(), want.sizes());
  if (want.numel() == 0) return std::nullopt;
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  const bool want_finite = w.isfinite().all().item<bool>();
  if (want_finite && !g.isfinite().all().item<bool>()) return std::string("its output has NaN or infinity, eager's none");
  if (!want_finite) return std::nullopt;  // eager overflowed too: nothing to compare against
  const double scale = std::max(w.abs().max().item<double>(), 1e-30);
  const double diff = g.sub(w).abs().max().item<double>();
  if (diff <= tolerance * scale) return std::nullopt;
  return c10::str("its output differs from eager's by up to ", diff, " (", diff / scale,
                  " of the largest magnitude; tolerance ", tolerance, ")");
}

// The same for every result of an engine (the output, or each gradient eager computed).
std::optional<std::string> disagreement(const EngineOut& got, const EngineOut& want, const ConvArgs& a) {
  const char* names[] = {"input gradient: ", "weight gradient: ", "bias gradient: "};
  const double tolerance = output_tolerance(a);
  for (size_t i = 0; i < want.size(); ++i) {
    if (!want[i].defined()) continue;
    const char* what = a.backward ? names[i] : "";
    if (!got[i].defined()) return c10::str(what, "not computed");
    if (auto why = disagreement(got[i], want[i], tolerance)) return what + *why;
  }
  return std::nullopt;
}

}  // namespace fastpipe::conv
