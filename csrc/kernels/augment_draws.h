// Which augmentation ops a sample gets, drawn as torchvision draws them but from the hash of (seed, epoch,
// sample) (sample_draws.h), so the reader threads and the device make the same choice in any run. The
// augmentations are a list of stages, applied in order:
// - TrivialAugmentWide, RandAugment (kOneOf): num_ops times one candidate op uniformly, with a magnitude
//   bin drawn uniformly; AutoAugment (kSubPolicy): one sub-policy (candidates 2s, 2s + 1) uniformly, each
//   op with its probability. Their candidates and magnitudes are torchvision's own tables
//   (fastpipe/augment.py builds them with its _AUGMENTATION_SPACE and policies), so that every magnitude
//   is torchvision's float32 value.
// - ColorJitter (kColorJitter): its 4 adjustments in a random order, each factor uniform in its range.
// - RandomGrayscale (kGrayscale); GaussianBlur (kBlur: a sigma per sample, the weights made here, on the
//   host, once).
// - AugMix (kAugMix): the original's share and each chain's weight from Dirichlet draws (Gamma variates,
//   normalised), each chain 1 to 3 ops (or chain_depth) drawn uniformly from its candidates with a
//   magnitude of the first `severity` bins; the mixing steps (kMixOriginal, kMixChain, kMixLast) around
//   the chains' ops.
// A stage applies with probability p (and, in a RandomApply, when the RandomApply's draw, which its
// stages share, says so).
// Plain C++ (no torch, no CUDA headers outside nvcc).
#pragma once

#include <stdint.h>

#include "kernels/augment_ops.h"
#include "kernels/host_device.h"
#include "kernels/sample_draws.h"

namespace fastpipe::images {

enum class AugmentStageKind : int32_t {
  kOneOf = 1, kSubPolicy = 2, kColorJitter = 3, kGrayscale = 4, kBlur = 5, kAugMix = 6
};
// Every kind, with its name in fastpipe/augment.py (_C.AUGMENT["stage_kinds"]).
struct AugmentStageKindName {
  AugmentStageKind kind;
  const char* name;
};
constexpr AugmentStageKindName kAugmentStageKindNames[] = {
    {AugmentStageKind::kOneOf, "one_of"},       {AugmentStageKind::kSubPolicy, "sub_policy"},
    {AugmentStageKind::kColorJitter, "color_jitter"}, {AugmentStageKind::kGrayscale, "grayscale"},
    {AugmentStageKind::kBlur, "blur"},          {AugmentStageKind::kAugMix, "augmix"}};

// One candidate op: its magnitudes are magnitudes[first, first + count) (count 0: magnitude 0), drawn
// uniformly; `is_signed`: negated with probability 1/2; applied with probability p.
struct AugmentCandidate {
  int32_t op = 0;  // AugOp
  int32_t is_signed = 0;
  float p = 1.0f;
  int32_t first = 0, count = 0;
};

struct AugmentStage {
  int32_t kind = 0;  // AugmentStageKind
  float p = 1.0f;    // the stage applies with this probability
  int32_t gate = -1;  // >= 0: and if its RandomApply's draw (shared by the stages with this gate) < gate_p
  float gate_p = 1.0f;
  int32_t num_ops = 0;                      // kOneOf: ops per sample; kAugMix: ops per chain (-1: 1 to 3)
  int32_t first = 0, count = 0;             // kOneOf, kSubPolicy, kAugMix: candidates [first, first + count)
  int32_t chains = 0;                       // kAugMix: mixture_width
  float alpha = 1.0f;                       // kAugMix: the Dirichlet's concentration
  int32_t jitter[4] = {0, 0, 0, 0};         // kColorJitter: brightness, contrast, saturation, hue on
  float lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};  // ... their factor ranges; kBlur: lo[0], hi[0] sigma's
  int32_t taps[2] = {0, 0};                 // kBlur: the kernel's size along x and y
};

constexpr int kMaxAugmentStages = 4;
constexpr int kMaxAugmentCandidates = 64;  // AutoAugment's 25 sub-policies of 2, and TrivialAugment's 14
constexpr int kMaxAugmentMagnitudes = 512;
constexpr int kMaxAugmentOps = 16;          // per sample (AugMix's default: up to 13)
constexpr int kMaxAugMixChains = 6;

struct AugmentParams {
  int32_t stages = 0;  // 0: no augmentation
  uint8_t fill[3] = {0, 0, 0};  // nearest sampling's fill
  Sampling sampling;             // the geometric ops' interpolation and bilinear fill
  AugmentStage stage[kMaxAugmentStages];
  int32_t candidates = 0;
  AugmentCandidate candidate[kMaxAugmentCandidates];
  float magnitudes[kMaxAugmentMagnitudes];
};

// A sample's ops, in order, and its GaussianBlur's weights (x's, then y's at kMaxBlurTaps).
struct SampleOps {
  int32_t count = 0;
  PlannedOp op[kMaxAugmentOps];
  float blur[2 * kMaxBlurTaps];
};

// Draw numbers: draw_numbers.h.
static_assert(draws::kMaxStages == kMaxAugmentStages, "draw_numbers.h reserves draws for each stage");

FASTPIPE_HD inline void add_op(const AugmentParams& a, const AugmentCandidate& c, uint64_t seed, uint64_t epoch,
                               uint64_t index, uint64_t d, int h, int w, SampleOps* out) {
  float magnitude = 0.0f;
  if (c.count > 0) {
    magnitude = a.magnitudes[c.first + below(transforms::sample_bits(seed, epoch, index, d + 1), c.count)];
    if (c.is_signed && draw01(seed, epoch, index, d + 2) <= 0.5) magnitude = -magnitude;
  }
  if (out->count < kMaxAugmentOps) out->op[out->count++] = plan_op(static_cast<AugOp>(c.op), magnitude, h, w, &a.sampling);
}

// ColorJitter: torch.randperm(4)'s order (a Fisher-Yates shuffle of our draws), each adjustment that is on
// with its factor (a float32, as torch's uniform_ draws it).
FASTPIPE_HD inline void add_jitter(const AugmentStage& st, uint64_t seed, uint64_t epoch, uint64_t index, uint64_t d,
                                   SampleOps* out) {
  int order[4] = {0, 1, 2, 3};
  for (int k = 3; k > 0; --k) {
    const int j = below(transforms::sample_bits(seed, epoch, index, d + static_cast<uint64_t>(k)), k + 1);
    const int t = order[k];
    order[k] = order[j];
    order[j] = t;
  }
  const AugOp ops[4] = {AugOp::kBrightness, AugOp::kContrast, AugOp::kColor, AugOp::kHue};
  for (int k = 0; k < 4; ++k) {
    const int a = order[k];
    if (!st.jitter[a] || out->count >= kMaxAugmentOps) continue;
    const double u = draw01(seed, epoch, index, d + 4 + static_cast<uint64_t>(a));
    const float factor = static_cast<float>(st.lo[a] + (static_cast<double>(st.hi[a]) - st.lo[a]) * u);
    out->op[out->count++] = plan_factor(ops[a], factor);
  }
}

// A Gamma(alpha) variate from draws d to d + 30 (Marsaglia and Tsang's; alpha < 1 as Gamma(alpha + 1)
// times U^(1 / alpha)); in double, on the host where the draws are made.
FASTPIPE_HD inline double gamma_draw(double alpha, uint64_t seed, uint64_t epoch, uint64_t index, uint64_t d) {
  const double a = alpha < 1.0 ? alpha + 1.0 : alpha;
  const double dd = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * dd);
  double x = dd;  // the mode, after 9 rejections in a row (under 1e-11 for a >= 1)
  for (int t = 0; t < 9; ++t) {
    const uint64_t k = d + 3 * static_cast<uint64_t>(t);
    const double u1 = 1.0 - draw01(seed, epoch, index, k), u2 = draw01(seed, epoch, index, k + 1);
    const double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    const double v = (1.0 + c * z) * (1.0 + c * z) * (1.0 + c * z);
    if (v <= 0.0) continue;
    if (log(1.0 - draw01(seed, epoch, index, k + 2)) < 0.5 * z * z + dd - dd * v + dd * log(v)) {
      x = dd * v;
      break;
    }
  }
  return alpha < 1.0 ? x * pow(1.0 - draw01(seed, epoch, index, d + 30), 1.0 / alpha) : x;
}

// AugMix's steps for the stage's draws from `base`, if they fit after the ops so far.
FASTPIPE_HD inline void add_augmix(const AugmentParams& a, const AugmentStage& st, uint64_t seed, uint64_t epoch,
                                   uint64_t index, uint64_t base, int h, int w, SampleOps* out) {
  const int chains = st.chains < kMaxAugMixChains ? st.chains : kMaxAugMixChains;
  int depth[kMaxAugMixChains], steps = 1;
  for (int i = 0; i < chains; ++i) {
    depth[i] = st.num_ops > 0 ? st.num_ops : 1 + below(transforms::sample_bits(seed, epoch, index, base + i), 3);
    steps += depth[i] + 1;
  }
  if (out->count + steps > kMaxAugmentOps) return;
  // Dirichlet([alpha, alpha]) for the original's share and Dirichlet([alpha] * chains) for the chains',
  // each a float32 as torch's _sample_dirichlet returns it; a chain's weight is its share times m1.
  double g[2 + kMaxAugMixChains], pair = 0.0, all = 0.0;
  for (int j = 0; j < 2 + chains; ++j) {
    g[j] = gamma_draw(st.alpha, seed, epoch, index, base + 16 + 32 * static_cast<uint64_t>(j));
    (j < 2 ? pair : all) += g[j];
  }
  const float m0 = static_cast<float>(pair > 0.0 ? g[0] / pair : 0.5);
  const float m1 = static_cast<float>(pair > 0.0 ? g[1] / pair : 0.5);
  out->op[out->count++] = plan_mix(AugOp::kMixOriginal, m0);
  for (int i = 0; i < chains; ++i) {
    for (int k = 0; k < depth[i]; ++k) {
      const uint64_t d = base + 512 + 64 * static_cast<uint64_t>(i) + 4 * static_cast<uint64_t>(k);
      const AugmentCandidate& c = a.candidate[st.first + below(transforms::sample_bits(seed, epoch, index, d), st.count)];
      add_op(a, c, seed, epoch, index, d, h, w, out);
    }
    const float share = static_cast<float>(all > 0.0 ? g[2 + i] / all : 1.0 / chains);
    out->op[out->count++] = plan_mix(i + 1 < chains ? AugOp::kMixChain : AugOp::kMixLast, mul_rn(share, m1));
  }
}

// The most ops any sample draws from these stages (each stage at its largest), which must be at most
// kMaxAugmentOps: draw_augment would drop the rest.
FASTPIPE_HD inline int most_ops(const AugmentParams& a) {
  int most = 0;
  for (int n = 0; n < a.stages; ++n) {
    const AugmentStage& st = a.stage[n];
    switch (static_cast<AugmentStageKind>(st.kind)) {
      case AugmentStageKind::kOneOf: most += st.num_ops; break;
      case AugmentStageKind::kSubPolicy: most += 2; break;
      case AugmentStageKind::kColorJitter: most += st.jitter[0] + st.jitter[1] + st.jitter[2] + st.jitter[3]; break;
      case AugmentStageKind::kAugMix: most += 1 + st.chains * (st.num_ops > 0 ? st.num_ops + 1 : 4); break;
      case AugmentStageKind::kGrayscale:
      case AugmentStageKind::kBlur: most += 1; break;
    }
  }
  return most;
}

// The ops of sample `index` in `epoch` on an output of h x w.
FASTPIPE_HD inline SampleOps draw_augment(const AugmentParams& a, uint64_t seed, uint64_t epoch, uint64_t index, int h,
                                          int w) {
  SampleOps s;
  for (int n = 0; n < a.stages; ++n) {
    const AugmentStage& st = a.stage[n];
    const uint64_t base = draws::kAugment + draws::kPerStage * static_cast<uint64_t>(n);
    if (st.gate >= 0 && !(draw01(seed, epoch, index, draws::kGate + static_cast<uint64_t>(st.gate)) <
                          static_cast<double>(st.gate_p)))
      continue;
    if (st.p < 1.0f && !(draw01(seed, epoch, index, base + draws::kPerStage - 1) < static_cast<double>(st.p))) continue;
    switch (static_cast<AugmentStageKind>(st.kind)) {
      case AugmentStageKind::kOneOf:
        for (int k = 0; k < st.num_ops; ++k) {
          const uint64_t d = base + 4 * static_cast<uint64_t>(k);
          const AugmentCandidate& c = a.candidate[st.first + below(transforms::sample_bits(seed, epoch, index, d), st.count)];
          add_op(a, c, seed, epoch, index, d, h, w, &s);
        }
        break;
      case AugmentStageKind::kSubPolicy: {
        const int sub = below(transforms::sample_bits(seed, epoch, index, base), st.count / 2);
        for (int k = 0; k < 2; ++k) {
          const uint64_t d = base + 4 * static_cast<uint64_t>(k + 1);
          const AugmentCandidate& c = a.candidate[st.first + 2 * sub + k];
          if (draw01(seed, epoch, index, d + 3) <= static_cast<double>(c.p)) add_op(a, c, seed, epoch, index, d, h, w, &s);
        }
        break;
      }
      case AugmentStageKind::kColorJitter: add_jitter(st, seed, epoch, index, base, &s); break;
      case AugmentStageKind::kAugMix:
        add_augmix(a, st, seed, epoch, index, draws::kAugMix + draws::kPerAugMix * static_cast<uint64_t>(n), h, w, &s);
        break;
      case AugmentStageKind::kGrayscale:
        if (s.count < kMaxAugmentOps) s.op[s.count++] = plan_factor(AugOp::kGrayscale, 0.0f);
        break;
      case AugmentStageKind::kBlur: {
        if (s.count >= kMaxAugmentOps) break;
        // torch.empty(1).uniform_(lo, hi): a float32 sigma.
        const float sigma =
            static_cast<float>(st.lo[0] + (static_cast<double>(st.hi[0]) - st.lo[0]) * draw01(seed, epoch, index, base));
        PlannedOp& op = s.op[s.count++];
        op = plan_factor(AugOp::kBlur, sigma);
        op.taps[0] = st.taps[0];
        op.taps[1] = st.taps[1];
#if !defined(__CUDA_ARCH__)
        gaussian_weights(st.taps[0], sigma, s.blur);
        gaussian_weights(st.taps[1], sigma, s.blur + kMaxBlurTaps);
#endif
        break;
      }
    }
  }
  return s;
}

}  // namespace fastpipe::images
