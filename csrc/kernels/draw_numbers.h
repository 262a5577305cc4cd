// Every random draw of a sample is transforms::sample_bits(seed, epoch, index, what) (or draw01 of it):
// `what` numbers the draw. Each consumer owns a range of numbers, all listed here, so that no two draw
// the same bits; kDrawRanges is the same map as a table (exported as _C.DRAW_RANGES, checked disjoint).
#pragma once

#include <stdint.h>

namespace fastpipe::draws {

// The crop's y and x offsets: CropMirrorNormalize's (transforms.h) and the image RandomCrop's
// (image_transform.h); the flip (also the image transforms').
constexpr uint64_t kCropY = 0, kCropX = 1, kFlip = 2;
// RandomResizedCrop's box (image_transform.h): try t of kTries draws kBox + kPerTry * t + k, k < kPerTry.
constexpr uint64_t kTries = 10, kPerTry = 4;
constexpr uint64_t kBox = 16;
// RandomErasing (random_erasing.h): kErase its p; try t draws kErase + 1 + kPerTry * t + k.
constexpr uint64_t kErase = 64;
// Augmentation stage s (augment_draws.h) draws from kAugment + kPerStage * s: op k of a one-of stage
// + 4k + j (j < 3); a sub-policy's choice + 0 and its op k + 4(k + 1) + j (j < 4); a colour jitter + 1 to
// + 7; a blur's sigma + 0; the stage's p the last, + kPerStage - 1. RandomApply's gate g: kGate + g.
constexpr uint64_t kAugment = 128, kPerStage = 64, kMaxStages = 4;
constexpr uint64_t kGate = kAugment + kMaxStages * kPerStage;
// AugMix stage s draws from kAugMix + kPerAugMix * s: chain i's depth + i; Gamma variate j + 16 + 32 j
// (+ 0 to 30); chain i's op k + 512 + 64 i + 4 k (+ 0 to 2).
constexpr uint64_t kAugMix = 1024, kPerAugMix = 1024;

struct DrawRange {
  const char* owner;
  uint64_t first, end;  // [first, end)
};
constexpr DrawRange kDrawRanges[] = {
    {"crop offsets", kCropY, kCropX + 1},
    {"flip", kFlip, kFlip + 1},
    {"RandomResizedCrop", kBox, kBox + kPerTry * kTries},
    {"RandomErasing", kErase, kErase + 1 + kPerTry * kTries},
    {"augmentation stages", kAugment, kAugment + kMaxStages * kPerStage},
    {"RandomApply gates", kGate, kGate + kMaxStages},
    {"AugMix", kAugMix, kAugMix + kMaxStages * kPerAugMix},
};

}  // namespace fastpipe::draws
