// Which ops of TrivialAugmentWide, RandAugment or AutoAugment a sample gets, drawn as torchvision draws
// them but from the hash of (seed, epoch, sample) (sample_draws.h), so the reader threads and the device
// make the same choice in any run. The candidates and their magnitudes come from torchvision's own
// tables (fastpipe/augment.py builds them with its _AUGMENTATION_SPACE and policies), so that every
// magnitude is torchvision's float32 value.
// Plain C++ (no torch, no CUDA headers outside nvcc).
#pragma once

#include <stdint.h>

#include "cuda/augment_ops.h"
#include "cuda/host_device.h"
#include "cuda/sample_draws.h"

namespace fastpipe::images {

enum class AugmentPolicy : int32_t {
  kNone = 0,
  kOneOf,       // TrivialAugmentWide, RandAugment: num_ops times, one candidate uniformly, a magnitude bin
  kSubPolicy,   // AutoAugment: one sub-policy (candidates 2s, 2s + 1) uniformly, each op with its p
};

// One candidate op: its magnitudes are magnitudes[first, first + count) (count 0: magnitude 0), drawn
// uniformly; `is_signed`: negated with probability 1/2; applied with probability p.
struct AugmentCandidate {
  int32_t op = 0;  // AugOp
  int32_t is_signed = 0;
  float p = 1.0f;
  int32_t first = 0, count = 0;
};

constexpr int kMaxAugmentCandidates = 50;  // AutoAugment's 25 sub-policies of 2
constexpr int kMaxAugmentMagnitudes = 512;
constexpr int kMaxAugmentOps = 8;           // per sample (RandAugment's num_ops)

struct AugmentParams {
  int32_t policy = 0;  // AugmentPolicy
  int32_t num_ops = 0;
  int32_t candidates = 0;
  uint8_t fill[3] = {0, 0, 0};
  AugmentCandidate candidate[kMaxAugmentCandidates];
  float magnitudes[kMaxAugmentMagnitudes];
};

// A sample's ops, in order.
struct SampleOps {
  int32_t count = 0;
  PlannedOp op[kMaxAugmentOps];
};

// Draw numbers: after RandomErasing's (random_erasing.h: 64 to 104); op k uses 128 + 4k + j.
constexpr uint64_t kDrawAugment = 128;

FASTPIPE_HD inline void add_op(const AugmentParams& a, const AugmentCandidate& c, uint64_t seed, uint64_t epoch,
                               uint64_t index, uint64_t d, int h, int w, SampleOps* out) {
  float magnitude = 0.0f;
  if (c.count > 0) {
    magnitude = a.magnitudes[c.first + below(transforms::sample_bits(seed, epoch, index, d + 1), c.count)];
    if (c.is_signed && draw01(seed, epoch, index, d + 2) <= 0.5) magnitude = -magnitude;
  }
  out->op[out->count++] = plan_op(static_cast<AugOp>(c.op), magnitude, h, w);
}

// The ops of sample `index` in `epoch` on an output of h x w.
FASTPIPE_HD inline SampleOps draw_augment(const AugmentParams& a, uint64_t seed, uint64_t epoch, uint64_t index, int h,
                                          int w) {
  SampleOps s;
  if (a.policy == static_cast<int32_t>(AugmentPolicy::kOneOf)) {
    for (int k = 0; k < a.num_ops; ++k) {
      const uint64_t d = kDrawAugment + 4 * static_cast<uint64_t>(k);
      const AugmentCandidate& c = a.candidate[below(transforms::sample_bits(seed, epoch, index, d), a.candidates)];
      add_op(a, c, seed, epoch, index, d, h, w, &s);
    }
  } else if (a.policy == static_cast<int32_t>(AugmentPolicy::kSubPolicy)) {
    const int sub = below(transforms::sample_bits(seed, epoch, index, kDrawAugment), a.candidates / 2);
    for (int k = 0; k < 2; ++k) {
      const uint64_t d = kDrawAugment + 4 * static_cast<uint64_t>(k + 1);
      const AugmentCandidate& c = a.candidate[2 * sub + k];
      if (draw01(seed, epoch, index, d + 3) <= static_cast<double>(c.p)) add_op(a, c, seed, epoch, index, d, h, w, &s);
    }
  }
  return s;
}

}  // namespace fastpipe::images
