#include "ops/augment_specs.h"

#include <c10/util/Exception.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <iterator>
#include <optional>

#include "kernels/draw_numbers.h"

namespace py = pybind11;

namespace fastpipe {

// The augmentations (fastpipe/augment.py): stages as dicts, candidates and magnitudes, checked.
void set_augment(images::AugmentParams& a, const std::vector<py::dict>& stages,
                 const std::vector<std::tuple<int, bool, float, int, int>>& candidates,
                 const std::vector<float>& magnitudes, const std::vector<int>& fill, const std::string& interpolation,
                 int blend, const std::vector<float>& fill_value, std::tuple<bool, bool, bool> rounding) {
  TORCH_CHECK(stages.size() <= images::kMaxAugmentStages, "at most ", images::kMaxAugmentStages, " augment stages");
  TORCH_CHECK(candidates.size() <= images::kMaxAugmentCandidates, "at most ", images::kMaxAugmentCandidates,
              " augment candidates");
  TORCH_CHECK(magnitudes.size() <= images::kMaxAugmentMagnitudes, "at most ", images::kMaxAugmentMagnitudes,
              " augment magnitudes");
  TORCH_CHECK(fill.size() == 3, "augment_fill needs 3 values");
  TORCH_CHECK(fill_value.size() == 3, "augment_fill_value needs 3 values");
  TORCH_CHECK(blend >= 0 && blend <= 2, "augment_blend must be 0 (no fill), 1 (v2) or 2 (v1)");
  TORCH_CHECK(interpolation == "nearest" || interpolation == "bilinear" || interpolation == "bicubic",
              "augment_interpolation must be nearest, bilinear or bicubic, got ", interpolation);
  a.sampling.bilinear = interpolation == "bilinear" ? 1 : 0;
  a.sampling.bicubic = interpolation == "bicubic" ? 1 : 0;
  a.sampling.blend = blend;
  a.sampling.grid_fma = std::get<0>(rounding);
  a.sampling.unnormalize_fma = std::get<1>(rounding);
  a.sampling.interpolate_fma = std::get<2>(rounding);
  for (int c = 0; c < 3; ++c) {
    TORCH_CHECK(fill_value[c] >= 0.0f && fill_value[c] <= 255.0f, "augment_fill_value must be in [0, 255]");
    a.sampling.fill[c] = fill_value[c];
  }
  a.stages = static_cast<int32_t>(stages.size());
  for (size_t n = 0; n < stages.size(); ++n) {
    const py::dict& d = stages[n];
    images::AugmentStage& st = a.stage[n];
    st.kind = d["kind"].cast<int>();
    st.p = d.contains("p") ? d["p"].cast<float>() : 1.0f;
    st.gate = d.contains("gate") ? d["gate"].cast<int>() : -1;
    st.gate_p = d.contains("gate_p") ? d["gate_p"].cast<float>() : 1.0f;
    TORCH_CHECK(st.gate_p >= 0.0f && st.gate_p <= 1.0f, "augment stage gate_p must be in [0, 1]");
    TORCH_CHECK(std::any_of(std::begin(images::kAugmentStageKindNames), std::end(images::kAugmentStageKindNames),
                            [&](const auto& k) { return static_cast<int>(k.kind) == st.kind; }),
                "augment stage kind ", st.kind, " is unknown");
    TORCH_CHECK(st.p >= 0.0f && st.p <= 1.0f, "augment stage p must be in [0, 1]");
    TORCH_CHECK(st.gate >= -1 && st.gate < images::kMaxAugmentStages, "augment stage gate must be in [-1, ",
                images::kMaxAugmentStages, ")");  // draw_numbers.h reserves a draw per gate
    if (st.kind == static_cast<int>(images::AugmentStageKind::kOneOf) ||
        st.kind == static_cast<int>(images::AugmentStageKind::kSubPolicy)) {
      st.num_ops = d.contains("num_ops") ? d["num_ops"].cast<int>() : 2;
      st.first = d["first"].cast<int>();
      st.count = d["count"].cast<int>();
      TORCH_CHECK(st.num_ops >= 0 && st.num_ops <= images::kMaxAugmentOps, "num_ops must be in [0, ",
                  images::kMaxAugmentOps, "]");
      TORCH_CHECK(st.first >= 0 && st.count >= 1 && static_cast<size_t>(st.first) + st.count <= candidates.size(),
                  "augment stage ", n, "'s candidates are outside the table");
      TORCH_CHECK(st.kind != static_cast<int>(images::AugmentStageKind::kSubPolicy) || st.count % 2 == 0,
                  "sub-policies need two candidates each");
    } else if (st.kind == static_cast<int>(images::AugmentStageKind::kAugMix)) {
      st.num_ops = d["chain_depth"].cast<int>();
      st.chains = d["mixture_width"].cast<int>();
      st.alpha = d["alpha"].cast<float>();
      st.first = d["first"].cast<int>();
      st.count = d["count"].cast<int>();
      TORCH_CHECK(st.num_ops == -1 || (st.num_ops >= 1 && st.num_ops < images::kMaxAugmentOps),
                  "chain_depth must be -1 or in [1, ", images::kMaxAugmentOps, ")");
      TORCH_CHECK(st.chains >= 1 && st.chains <= images::kMaxAugMixChains &&
                      1 + st.chains * (st.num_ops > 0 ? st.num_ops + 1 : 4) <= images::kMaxAugmentOps,
                  "AugMix's mixture_width must be 1 to ", images::kMaxAugMixChains,
                  " with mixture_width x (chain_depth + 1) + 1 at most ", images::kMaxAugmentOps);
      TORCH_CHECK(st.alpha > 0.0f, "AugMix's alpha must be positive");
      TORCH_CHECK(st.first >= 0 && st.count >= 1 && static_cast<size_t>(st.first) + st.count <= candidates.size(),
                  "augment stage ", n, "'s candidates are outside the table");
    } else if (st.kind == static_cast<int>(images::AugmentStageKind::kBlur)) {
      const auto taps = d["taps"].cast<std::pair<int, int>>();
      const auto sigma = d["sigma"].cast<std::pair<float, float>>();
      st.taps[0] = taps.first;
      st.taps[1] = taps.second;
      st.lo[0] = sigma.first;
      st.hi[0] = sigma.second;
      for (const int t : st.taps)
        TORCH_CHECK(t >= 1 && t <= images::kMaxBlurTaps && t % 2 == 1, "a blur's kernel size must be odd, 1 to ",
                    images::kMaxBlurTaps);
      TORCH_CHECK(sigma.first > 0 && sigma.first <= sigma.second, "a blur's sigma must be 0 < lo <= hi");
    } else if (st.kind == static_cast<int>(images::AugmentStageKind::kColorJitter)) {
      const auto ranges = d["ranges"].cast<std::vector<std::optional<std::pair<float, float>>>>();
      TORCH_CHECK(ranges.size() == 4, "a colour jitter needs 4 ranges");
      for (int k = 0; k < 4; ++k) {
        st.jitter[k] = ranges[k].has_value();
        if (ranges[k]) std::tie(st.lo[k], st.hi[k]) = *ranges[k];
        TORCH_CHECK(st.lo[k] <= st.hi[k], "a colour jitter range must be (lo, hi) with lo <= hi");
      }
    }
  }
  a.candidates = static_cast<int32_t>(candidates.size());
  for (size_t k = 0; k < candidates.size(); ++k) {
    const auto& [op, is_signed, prob, first, count] = candidates[k];
    TORCH_CHECK(op >= 0 && op < static_cast<int>(images::AugOp::kCount), "augment op ", op, " is unknown");
    TORCH_CHECK(first >= 0 && count >= 0 && static_cast<size_t>(first) + count <= magnitudes.size(),
                "augment candidate ", k, "'s magnitudes are outside the table");
    a.candidate[k] = images::AugmentCandidate{op, is_signed ? 1 : 0, prob, first, count};
  }
  std::copy(magnitudes.begin(), magnitudes.end(), a.magnitudes);
  for (int c = 0; c < 3; ++c) {
    TORCH_CHECK(fill[c] >= 0 && fill[c] <= 255, "augment_fill must be in [0, 255]");
    a.fill[c] = static_cast<uint8_t>(fill[c]);
  }
}

void bind_augment_tables(py::module& m) {
  py::list ops;
  for (const char* name : images::kAugOpNames) ops.append(name);
  py::dict kinds;
  for (const auto& k : images::kAugmentStageKindNames) kinds[k.name] = static_cast<int>(k.kind);
  py::dict t;
  t["ops"] = py::tuple(ops);
  t["stage_kinds"] = kinds;
  t["max_stages"] = images::kMaxAugmentStages;
  t["max_candidates"] = images::kMaxAugmentCandidates;
  t["max_magnitudes"] = images::kMaxAugmentMagnitudes;
  t["max_ops"] = images::kMaxAugmentOps;
  t["max_blur_taps"] = images::kMaxBlurTaps;
  t["max_chains"] = images::kMaxAugMixChains;
  m.attr("AUGMENT") = t;
  py::list ranges;
  for (const auto& r : draws::kDrawRanges) ranges.append(py::make_tuple(r.owner, r.first, r.end));
  m.attr("DRAW_RANGES") = py::tuple(ranges);
}

}  // namespace fastpipe
