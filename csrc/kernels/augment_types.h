// The augmentations' vocabulary (augment_ops.h): the ops and their names, how each reads its input, the
// geometric ops' sampling, one op as planned for a sample, and the image statistics the table ops need.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/float_rounding.h"
#include "kernels/host_device.h"

namespace fastpipe::images {

enum class AugOp : int32_t {
  kIdentity = 0,
  kShearX,
  kShearY,
  kTranslateX,
  kTranslateY,
  kRotate,
  kBrightness,
  kColor,
  kContrast,
  kSharpness,
  kPosterize,
  kSolarize,
  kAutoContrast,
  kEqualize,
  kInvert,
  kHue,        // ColorJitter's hue
  kGrayscale,  // RandomGrayscale
  kBlur,       // GaussianBlur
  kMixOriginal,  // AugMix: the mix starts as the image times the weight, which the chains start from
  kMixChain,     // AugMix: a chain's image times the weight added to the mix; the next chain starts
  kMixLast,      // AugMix: the last chain's added, and the mix truncated to uint8 becomes the image
  kCount
};
// Their names, in order: torchvision's op names (fastpipe.augment.OPS, from _C.AUGMENT["ops"]).
constexpr const char* kAugOpNames[] = {
    "Identity",   "ShearX",   "ShearY",       "TranslateX", "TranslateY", "Rotate",   "Brightness",
    "Color",      "Contrast", "Sharpness",    "Posterize",  "Solarize",   "AutoContrast", "Equalize",
    "Invert",     "Hue",      "Grayscale",    "Blur",       "MixOriginal", "MixChain", "MixLast"};
static_assert(sizeof(kAugOpNames) / sizeof(kAugOpNames[0]) == static_cast<int>(AugOp::kCount), "a name for every op");

// How an op reads its input.
enum class OpKind : int32_t {
  kCopy = 0, kTable, kColor, kSharpness, kAffine, kQuarterTurns, kHue, kGrey, kBlur,
  kBilinear,  // an affine op sampled bilinearly
  kMix,       // AugMix's mixing, in place, with the original image and the mix (mix_pixel)
  kBicubic    // an affine op sampled bicubically (bicubic_pixel)
};

// How the geometric ops fill what they bring in from outside the image, sampled bilinearly (nearest
// sampling takes the fill as it is): torchvision's _apply_grid_transform without a fill (grid_sample's
// zeros), or with one, blended by the interpolated mask as v2 writes it, (v - fill) * mask + fill, or as v1
// writes it, v * mask + (1 - mask) * fill (float rounding differs).
enum class FillBlend : int32_t { kZeros = 0, kV2, kV1 };

// The geometric ops' sampling (AugmentParams::sampling): nearest or bilinear, the fill's blend and values
// (torchvision's floats), and where the torch in use fuses a multiply-add (measured by
// fastpipe/torch_rounding.py: torch's bmm sums the affine grid with a BLAS or its own loop, and its CPU
// kernels are vectorised with FMA or not, by CPU and size), so that positions round as torchvision's.
struct Sampling {
  int32_t bilinear = 0;
  int32_t bicubic = 0;  // grid_sample's bicubic (torchvision's tensor ops refuse it: see bicubic_pixel)
  int32_t blend = 0;  // FillBlend
  float fill[3] = {0, 0, 0};
  int32_t grid_fma = 1;         // the grid's bx * t0 + by * t1 (+ t2) with by * t1 fused
  int32_t unnormalize_fma = 1;  // grid_sample's (g + 1) * size / 2 - 0.5 fused
  int32_t interpolate_fma = 1;  // bilinear's corners after the first fused into the sum
};

constexpr int kMaxBlurTaps = 47;  // GaussianBlur's kernel size per axis

// One op drawn for a sample, with what does not depend on the pixels.
struct PlannedOp {
  int32_t op = 0;           // AugOp
  int32_t kind = 0;         // OpKind
  float magnitude = 0.0f;   // as torchvision draws it (a float32 value, signed)
  float ratio = 0.0f;       // blends: image * ratio + other * (1 - ratio), both as float32
  float other_weight = 0.0f;
  int32_t turns = 0;        // kQuarterTurns: torch.rot90's k
  int32_t by_factor = 0;    // 1: planned by plan_factor (ColorJitter, RandomGrayscale; magnitude is the factor)
  int32_t taps[2] = {0, 0};  // kBlur: the kernel's size along x and y (its weights: SampleOps::blur)
  float theta[6] = {0, 0, 0, 0, 0, 0};  // kAffine, kBilinear: the grid's coefficients (see affine_source)
  Sampling sampling;                     // kAffine, kBilinear: how to round, and the bilinear fill
};

// What the table ops need of the image: a histogram per channel and the sum of the floored greys.
struct ImageStats {
  uint32_t hist[3][256];
  int64_t grey_sum;
};

}  // namespace fastpipe::images
