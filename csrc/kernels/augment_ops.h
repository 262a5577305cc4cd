// The ops of torchvision's TrivialAugmentWide, RandAugment and AutoAugment on a uint8 RGB image (3 planes),
// as torchvision's tensor kernels compute them (transforms/v2/functional: _color.py, _geometry.py) in
// float32, so that each output equals torchvision's:
// - point ops (brightness, contrast, posterize, solarize, autocontrast, equalize, invert) become a table
//   per channel, built from the image's histograms and grey sum (ImageStats) where the op needs them;
// - colour (saturation) blends each pixel with its own floored grey, sharpness with the rounded 3x3 blur
//   of the interior (the border is kept);
// - shear, translate and rotate sample the image through torchvision's inverse affine matrix and
//   affine grid (align_corners=False), nearest or bilinear with torchvision's fill outside, or rot90 where
//   torchvision takes it.
// Everything about an op that does not depend on the pixels is worked out once per sample, where the op
// is drawn (plan_op). Plain C++ (no torch, no CUDA headers outside nvcc): the CPU tests run all of it.
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

// _blend's uint8 result: image1 * ratio + image2 * (1 - ratio), clamped, truncated.
template <class Fma = ExactFma>
FASTPIPE_HD inline uint8_t blend(const PlannedOp& op, float image1, float image2, Fma fma = Fma()) {
  float v = fma(image2, op.other_weight, mul_rn(image1, op.ratio));
  v = v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v);
  return static_cast<uint8_t>(v);
}

// Sharpness's uint8 result for pixel value v whose 3x3 neighbourhood (v included) sums to `sum`:
// conv2d with 1/13 around and 5/13 in the middle, rounded (round(M / 13) for the integer M = sum + 4v,
// never a tie: M / 13 = n + 1/2 has no integer solution), then view + (blurred - view) * (1 - factor).
template <class Fma = ExactFma>
FASTPIPE_HD inline uint8_t sharpened(const PlannedOp& op, int v, int sum, Fma fma = Fma()) {
  const float blurred = static_cast<float>((2 * (sum + 4 * v) + 13) / 26);
  const float x = static_cast<float>(v);
  float o = fma(blurred - x, op.other_weight, x);
  o = o < 0.0f ? 0.0f : (o > 255.0f ? 255.0f : o);
  return static_cast<uint8_t>(o);
}

// ---- planning (per sample, before any pixel) ------------------------------------------------------

// torchvision's _get_inverse_affine_matrix (scale 1), in double as Python computes it.
FASTPIPE_HD inline void inverse_affine(double cx, double cy, double angle, double tx, double ty, double shear_x,
                                       double shear_y, double m[6]) {
  const double deg = 3.141592653589793 / 180.0;  // Python's math.radians
  const double rot = angle * deg, sx = shear_x * deg, sy = shear_y * deg;
  const double cos_sy = cos(sy), tan_sx = tan(sx), rot_minus_sy = rot - sy;
  const double cx_plus_tx = cx + tx, cy_plus_ty = cy + ty;
  const double a = cos(rot_minus_sy) / cos_sy;
  const double b = -(a * tan_sx + sin(rot));
  const double c = sin(rot_minus_sy) / cos_sy;
  const double d = cos(rot) - c * tan_sx;
  m[0] = d;
  m[1] = -b;
  m[2] = 0.0 + (cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty);
  m[3] = -c;
  m[4] = a;
  m[5] = 0.0 + (cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty);
}

// The affine grid's coefficients: _affine_grid divides theta's rows by (w / 2, h / 2) in float32.
FASTPIPE_HD inline void grid_coefficients(const double m[6], int h, int w, float theta[6]) {
  const float sx = static_cast<float>(0.5 * w), sy = static_cast<float>(0.5 * h);
  for (int j = 0; j < 3; ++j) {
    theta[j] = static_cast<float>(m[j]) / sx;
    theta[3 + j] = static_cast<float>(m[3 + j]) / sy;
  }
}

// Python's float % 360 (the sign of the divisor).
FASTPIPE_HD inline double python_mod360(double a) {
  double r = fmod(a, 360.0);
  if (r != 0.0 && r < 0.0) r += 360.0;
  return r;
}

// Everything op `op` with `magnitude` needs on an h x w image, but its pixels; `sampling`: how its
// geometric ops sample (nearest when null).
FASTPIPE_HD inline PlannedOp plan_op(AugOp op, float magnitude, int h, int w, const Sampling* sampling = nullptr) {
  PlannedOp p;
  p.op = static_cast<int32_t>(op);
  p.magnitude = magnitude;
  if (sampling) p.sampling = *sampling;
  const OpKind affine =
      p.sampling.bicubic ? OpKind::kBicubic : (p.sampling.bilinear ? OpKind::kBilinear : OpKind::kAffine);
  const double mag = magnitude;
  const double rad_to_deg = 180.0 / 3.141592653589793;  // Python's math.degrees
  double m[6];
  switch (op) {
    case AugOp::kShearX:
    case AugOp::kShearY: {
      // affine(center=[0, 0]): the centre relative to the image's middle is (-w / 2, -h / 2).
      const double shear = atan(mag) * rad_to_deg;
      inverse_affine(-0.5 * w, -0.5 * h, 0.0, 0.0, 0.0, op == AugOp::kShearX ? shear : 0.0,
                     op == AugOp::kShearY ? shear : 0.0, m);
      p.kind = static_cast<int32_t>(affine);
      grid_coefficients(m, h, w, p.theta);
      return p;
    }
    case AugOp::kTranslateX:
    case AugOp::kTranslateY: {
      const double t = static_cast<double>(static_cast<int64_t>(mag));  // int(magnitude)
      inverse_affine(0.0, 0.0, 0.0, op == AugOp::kTranslateX ? t : 0.0, op == AugOp::kTranslateY ? t : 0.0, 0.0,
                     0.0, m);
      p.kind = static_cast<int32_t>(affine);
      grid_coefficients(m, h, w, p.theta);
      return p;
    }
    case AugOp::kRotate: {
      const double angle = python_mod360(mag);
      // rotate_image's fast paths: torch.rot90 (90 and 270 only on square images).
      if (angle == 0.0) {
        p.kind = static_cast<int32_t>(OpKind::kCopy);
      } else if (angle == 180.0 || (h == w && (angle == 90.0 || angle == 270.0))) {
        p.kind = static_cast<int32_t>(OpKind::kQuarterTurns);
        p.turns = static_cast<int32_t>(angle / 90.0);
      } else {
        inverse_affine(0.0, 0.0, -angle, 0.0, 0.0, 0.0, 0.0, m);
        p.kind = static_cast<int32_t>(affine);
        grid_coefficients(m, h, w, p.theta);
      }
      return p;
    }
    case AugOp::kBrightness:
    case AugOp::kColor:
    case AugOp::kContrast:
    case AugOp::kSharpness: {
      const double factor = 1.0 + mag;
      p.ratio = static_cast<float>(factor);
      p.other_weight = static_cast<float>(1.0 - factor);
      p.kind = static_cast<int32_t>(op == AugOp::kColor       ? OpKind::kColor
                                    : op == AugOp::kSharpness ? OpKind::kSharpness
                                                              : OpKind::kTable);
      return p;
    }
    case AugOp::kPosterize:
    case AugOp::kSolarize:
    case AugOp::kAutoContrast:
    case AugOp::kEqualize:
    case AugOp::kInvert: p.kind = static_cast<int32_t>(OpKind::kTable); return p;
    default: p.kind = static_cast<int32_t>(OpKind::kCopy); return p;
  }
}

// A ColorJitter adjustment (brightness, contrast, saturation, hue) with its factor, RandomGrayscale, or
// GaussianBlur (factor: its sigma; the caller sets the taps).
FASTPIPE_HD inline PlannedOp plan_factor(AugOp op, float factor) {
  PlannedOp p;
  p.op = static_cast<int32_t>(op);
  p.magnitude = factor;
  p.by_factor = 1;
  p.ratio = factor;  // _blend's ratio (hue: the shift), a float32 as torch takes the Python float
  p.other_weight = static_cast<float>(1.0 - static_cast<double>(factor));
  p.kind = static_cast<int32_t>(op == AugOp::kColor       ? OpKind::kColor
                                : op == AugOp::kHue       ? OpKind::kHue
                                : op == AugOp::kGrayscale ? OpKind::kGrey
                                : op == AugOp::kBlur      ? OpKind::kBlur
                                                          : OpKind::kTable);
  return p;
}

// An AugMix step (kMixOriginal, kMixChain, kMixLast) with its weight (a float32, as torch's Dirichlet
// draws and the product with the original's share give it).
FASTPIPE_HD inline PlannedOp plan_mix(AugOp op, float weight) {
  PlannedOp p;
  p.op = static_cast<int32_t>(op);
  p.kind = static_cast<int32_t>(OpKind::kMix);
  p.magnitude = weight;
  p.ratio = weight;
  return p;
}

// Whether the op's table needs the histograms / the grey sum.
FASTPIPE_HD inline bool needs_histograms(const PlannedOp& p) {
  return p.op == static_cast<int32_t>(AugOp::kAutoContrast) || p.op == static_cast<int32_t>(AugOp::kEqualize);
}
FASTPIPE_HD inline bool needs_grey_sum(const PlannedOp& p) { return p.op == static_cast<int32_t>(AugOp::kContrast); }

// ---- the table ops ----------------------------------------------------------------------------------

// Channel c's table of a kTable op on an image of `pixels` pixels with statistics `s`.
FASTPIPE_HD inline void op_table(const PlannedOp& p, const ImageStats& s, int64_t pixels, int c, uint8_t lut[256]) {
  const AugOp op = static_cast<AugOp>(p.op);
  if (op == AugOp::kEqualize) {
    // equalize_image: PIL's scheme; step from the pixels not in the last non-empty bin.
    const uint32_t* hist = s.hist[c];
    int last = 255;
    while (last > 0 && hist[last] == 0) --last;
    const int64_t step = (pixels - hist[last]) / 255;
    int64_t cum = 0;
    lut[0] = 0;
    for (int k = 0; k < 256; ++k) {
      if (k > 0) {
        const int64_t v = (cum + step / 2) / (step > 0 ? step : 1);
        lut[k] = static_cast<uint8_t>(v > 255 ? 255 : v);
      }
      cum += hist[k];
    }
    if (step == 0) {
      for (int k = 0; k < 256; ++k) lut[k] = static_cast<uint8_t>(k);
    }
    return;
  }
  float lo = 0.0f, inv_scale = 1.0f, mean = 0.0f;
  if (op == AugOp::kAutoContrast) {
    int mn = 0, mx = 255;
    while (mn < 255 && s.hist[c][mn] == 0) ++mn;
    while (mx > 0 && s.hist[c][mx] == 0) --mx;
    if (mx > mn) {
      lo = static_cast<float>(mn);
      inv_scale = mul_rn(static_cast<float>(mx - mn), static_cast<float>(1.0 / 255));
    }
  } else if (op == AugOp::kContrast) {
    mean = div_rn(static_cast<float>(s.grey_sum), static_cast<float>(pixels));
  }
  const float solarize_at = static_cast<float>(255.0 * static_cast<double>(p.magnitude));
  const int bits = static_cast<int>(p.magnitude);
  for (int k = 0; k < 256; ++k) {
    const float x = static_cast<float>(k);
    switch (op) {
      case AugOp::kBrightness: lut[k] = blend(p, x, 0.0f); break;
      case AugOp::kContrast: lut[k] = blend(p, x, mean); break;
      case AugOp::kPosterize:
        lut[k] = bits >= 8 ? static_cast<uint8_t>(k) : static_cast<uint8_t>(k & (((1 << bits) - 1) << (8 - bits)));
        break;
      case AugOp::kSolarize: lut[k] = static_cast<uint8_t>(x >= solarize_at ? 255 - k : k); break;
      case AugOp::kInvert: lut[k] = static_cast<uint8_t>(255 - k); break;
      case AugOp::kAutoContrast: {
        float v = div_rn(x - lo, inv_scale);
        v = v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v);
        lut[k] = static_cast<uint8_t>(v);
        break;
      }
      default: lut[k] = static_cast<uint8_t>(k);
    }
  }
}

// ---- per pixel --------------------------------------------------------------------------------------

// The affine grid, split so that the CPU can compute a column's products once: _affine_grid's base grid
// (bx, by, 1) = (x + (1 - w) / 2, y + (1 - h) / 2, 1) times an axis's 3 coefficients t, summed as torch's
// bmm sums it (bx * t0 first, by * t1 fused in where Sampling::grid_fma); then grid_sample's
// unnormalisation, (g + 1) * size / 2 - 0.5 (fused where Sampling::unnormalize_fma).
FASTPIPE_HD inline float base_coordinate(int x, int w) {
  return add_rn(static_cast<float>(x), static_cast<float>((1.0 - w) * 0.5));
}
// The source position along an axis of `size` for column product `column` (bx * t0) and row by.
template <class Fma = ExactFma>
FASTPIPE_HD inline float grid_position(const Sampling& s, float column, float by, float t1, float t2, int size,
                                       Fma fma = Fma()) {
  const float g = add_rn(s.grid_fma ? fma(by, t1, column) : add_rn(column, mul_rn(by, t1)), t2);
  const float half = static_cast<float>(size) / 2.0f;
  return s.unnormalize_fma ? fma(add_rn(g, 1.0f), half, -0.5f) : add_rn(mul_rn(add_rn(g, 1.0f), half), -0.5f);
}
// Output (y, x)'s source position (iy, ix) under a kAffine or kBilinear op.
template <class Fma = ExactFma>
FASTPIPE_HD inline void affine_position(const PlannedOp& p, int h, int w, int y, int x, float* iy, float* ix,
                                        Fma fma = Fma()) {
  const float bx = base_coordinate(x, w), by = base_coordinate(y, h);
  *ix = grid_position(p.sampling, mul_rn(bx, p.theta[0]), by, p.theta[1], p.theta[2], w, fma);
  *iy = grid_position(p.sampling, mul_rn(bx, p.theta[3]), by, p.theta[4], p.theta[5], h, fma);
}
FASTPIPE_HD inline bool inside_image(float iy, float ix, int h, int w) {
  return ix > -1.0f && ix < static_cast<float>(w) && iy > -1.0f && iy < static_cast<float>(h);
}

// The source pixel (sy, sx) of output (y, x) of a kAffine op (nearest: the position rounded half to
// even); false where it falls outside (the fill).
FASTPIPE_HD inline bool affine_source(const PlannedOp& p, int h, int w, int y, int x, int* sy, int* sx) {
  float iy = 0.0f, ix = 0.0f;
  affine_position(p, h, w, y, x, &iy, &ix);
  iy = round_even(iy);
  ix = round_even(ix);
  if (!inside_image(iy, ix, h, w)) return false;
  *sx = static_cast<int>(ix);
  *sy = static_cast<int>(iy);
  return true;
}

// A bilinear sample at source position (iy, ix) of an h x w plane, as ATen's CPU kernel weighs it: the
// nw, ne, sw and se corners' weights (0 for a corner outside the image, whose value counts as 0) and
// offsets (0 there), and the mask, the weights summed (what the interpolated ones of torchvision's fill
// mask come to).
FASTPIPE_HD inline float bilinear_taps(float iy, float ix, int h, int w, float weight[4], int32_t offset[4]) {
  const float x0 = floorf(ix), y0 = floorf(iy);
  const float to_west = add_rn(ix, -x0), to_east = add_rn(1.0f, -to_west);
  const float to_north = add_rn(iy, -y0), to_south = add_rn(1.0f, -to_north);
  // Compared as floats, and clamped before the conversion: x0 may be far beyond an int.
  const bool west = x0 > -1.0f && x0 < static_cast<float>(w), east = x0 > -2.0f && x0 < static_cast<float>(w - 1);
  const bool north = y0 > -1.0f && y0 < static_cast<float>(h), south = y0 > -2.0f && y0 < static_cast<float>(h - 1);
  const float xc = x0 < -1.0f ? -1.0f : (x0 > static_cast<float>(w) ? static_cast<float>(w) : x0);
  const float yc = y0 < -1.0f ? -1.0f : (y0 > static_cast<float>(h) ? static_cast<float>(h) : y0);
  const int32_t row = static_cast<int32_t>(yc) * w, col = static_cast<int32_t>(xc);
  const bool inside[4] = {north && west, north && east, south && west, south && east};
  const int32_t at[4] = {row + col, row + col + 1, row + w + col, row + w + col + 1};
  const float weights[4] = {mul_rn(to_south, to_east), mul_rn(to_south, to_west), mul_rn(to_north, to_east),
                            mul_rn(to_north, to_west)};
  float mask = 0.0f;
  for (int k = 0; k < 4; ++k) {
    weight[k] = inside[k] ? weights[k] : 0.0f;
    offset[k] = inside[k] ? at[k] : 0;
    mask = add_rn(mask, weight[k]);
  }
  return mask;
}

// The uint8 value of a bilinear sample from its corners' values and taps: the sum (the nw corner's product,
// then the others, fused in where Sampling::interpolate_fma; a weight of 0 adds exactly 0), the fill
// blended by the mask, rounded half to even.
template <class Fma = ExactFma>
FASTPIPE_HD inline uint8_t bilinear_value(const Sampling& s, float fill, const float value[4], const float weight[4],
                                          float mask, Fma fma = Fma()) {
  float v = 0.0f;  // fma(value, weight, 0) is the rounded product, as the first corner's
  for (int k = 0; k < 4; ++k) v = s.interpolate_fma ? fma(value[k], weight[k], v) : add_rn(v, mul_rn(value[k], weight[k]));
  if (s.blend == static_cast<int32_t>(FillBlend::kV2))
    v = add_rn(mul_rn(add_rn(v, -fill), mask), fill);
  else if (s.blend == static_cast<int32_t>(FillBlend::kV1))
    v = add_rn(mul_rn(v, mask), mul_rn(add_rn(1.0f, -mask), fill));
  v = round_even(v);
  return static_cast<uint8_t>(v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v));
}

// Output `at` of a kBilinear op whose source position is (iy, ix) (grid_sample's bilinear interpolation,
// torchvision's fill).
template <class Fma = ExactFma>
FASTPIPE_HD inline void bilinear_pixel(const PlannedOp& p, const uint8_t* src, int h, int w, float iy, float ix,
                                       uint8_t* dst, int64_t at, Fma fma = Fma()) {
  const int64_t plane = static_cast<int64_t>(h) * w;
  float weight[4];
  int32_t offset[4];
  const float mask = bilinear_taps(iy, ix, h, w, weight, offset);
  for (int c = 0; c < 3; ++c) {
    const uint8_t* in = src + c * plane;
    const float value[4] = {static_cast<float>(in[offset[0]]), static_cast<float>(in[offset[1]]),
                            static_cast<float>(in[offset[2]]), static_cast<float>(in[offset[3]])};
    dst[c * plane + at] = bilinear_value(p.sampling, p.sampling.fill[c], value, weight, mask, fma);
  }
}

// grid_sample's cubic convolution weights (A = -0.75) of the four taps around a position t past the
// second one, in float, as its vectorised CPU kernel computes them (get_cubic_coefficients).
FASTPIPE_HD inline void cubic_weights(float t, float k[4]) {
  const float A = -0.75f;
  const float x1 = t, x2 = add_rn(1.0f, -t);
  const float far1 = add_rn(t, 1.0f), far2 = add_rn(2.0f, -t);
  k[0] = add_rn(mul_rn(add_rn(mul_rn(add_rn(mul_rn(A, far1), -5.0f * A), far1), 8.0f * A), far1), -4.0f * A);
  k[1] = add_rn(mul_rn(mul_rn(add_rn(mul_rn(A + 2.0f, x1), -(A + 3.0f)), x1), x1), 1.0f);
  k[2] = add_rn(mul_rn(mul_rn(add_rn(mul_rn(A + 2.0f, x2), -(A + 3.0f)), x2), x2), 1.0f);
  k[3] = add_rn(mul_rn(add_rn(mul_rn(add_rn(mul_rn(A, far2), -5.0f * A), far2), 8.0f * A), far2), -4.0f * A);
}

// Output `at` of a kBicubic op whose source position is (iy, ix): grid_sample's bicubic interpolation
// (padding zeros, align_corners=False: the 4 x 4 taps around the position, each row's cubic in x, then the
// rows' in y, taps outside the image 0), torchvision's fill blended by the mask sampled the same way, as
// _apply_grid_transform computes it for bilinear, then clamped and rounded half to even. torchvision's
// tensor kernels refuse bicubic for their affine ops (PIL's take it, with their own cubic and pixel
// centres): this is what they would compute, the clamp being what its resize does for bicubic.
FASTPIPE_HD inline void bicubic_pixel(const PlannedOp& p, const uint8_t* src, int h, int w, float iy, float ix,
                                      uint8_t* dst, int64_t at) {
  const int64_t plane = static_cast<int64_t>(h) * w;
  const float x0 = floorf(ix), y0 = floorf(iy);
  float kx[4], ky[4];
  cubic_weights(add_rn(ix, -x0), kx);
  cubic_weights(add_rn(iy, -y0), ky);
  // Compared as floats, and converted only inside: a position may be far beyond an int. A tap outside
  // counts as 0 (grid_sample's zeros padding).
  int32_t col[4], row[4];
  bool in_x[4], in_y[4];
  for (int k = 0; k < 4; ++k) {
    const float x = x0 + static_cast<float>(k - 1), y = y0 + static_cast<float>(k - 1);
    in_x[k] = x >= 0.0f && x < static_cast<float>(w);
    in_y[k] = y >= 0.0f && y < static_cast<float>(h);
    col[k] = in_x[k] ? static_cast<int32_t>(x) : 0;
    row[k] = in_y[k] ? static_cast<int32_t>(y) * w : 0;
  }
  const bool inside = in_x[0] && in_x[3] && in_y[0] && in_y[3];  // all 16 taps (most outputs)
  float mask = 1.0f;
  if (p.sampling.blend != static_cast<int32_t>(FillBlend::kZeros)) {  // the fill's mask: the ones sampled alike
    mask = 0.0f;
    for (int i = 0; i < 4; ++i) {
      float m = 0.0f;
      for (int j = 0; j < 4; ++j) m = add_rn(m, mul_rn(in_x[j] && in_y[i] ? 1.0f : 0.0f, kx[j]));
      mask = add_rn(mask, mul_rn(m, ky[i]));
    }
  }
  for (int c = 0; c < 3; ++c) {
    const uint8_t* in = src + c * plane;
    float v = 0.0f;
    for (int i = 0; i < 4; ++i) {
      float r = 0.0f;
      if (inside) {
        const uint8_t* line = in + row[i] + col[0];
        for (int j = 0; j < 4; ++j) r = add_rn(r, mul_rn(static_cast<float>(line[j]), kx[j]));
      } else {
        for (int j = 0; j < 4; ++j) {
          const float value = in_x[j] && in_y[i] ? static_cast<float>(in[row[i] + col[j]]) : 0.0f;
          r = add_rn(r, mul_rn(value, kx[j]));
        }
      }
      v = add_rn(v, mul_rn(r, ky[i]));
    }
    const float fill = p.sampling.fill[c];
    if (p.sampling.blend == static_cast<int32_t>(FillBlend::kV2))
      v = add_rn(mul_rn(add_rn(v, -fill), mask), fill);
    else if (p.sampling.blend == static_cast<int32_t>(FillBlend::kV1))
      v = add_rn(mul_rn(v, mask), mul_rn(add_rn(1.0f, -mask), fill));
    v = round_even(v);
    dst[c * plane + at] = static_cast<uint8_t>(v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v));
  }
}

// torch.rot90(k, dims=(-2, -1)): output (y, x) of an h x w image (out_h x out_w after the turn).
FASTPIPE_HD inline void quarter_turn_source(int turns, int h, int w, int y, int x, int* sy, int* sx) {
  switch (turns) {
    case 1: *sy = x; *sx = w - 1 - y; return;
    case 2: *sy = h - 1 - y; *sx = w - 1 - x; return;
    default: *sy = h - 1 - x; *sx = y; return;
  }
}

// adjust_hue_image on one uint8 pixel, in float32 as torchvision computes it: to [0, 1], _rgb_to_hsv,
// the hue shifted (remainder 1), _hsv_to_rgb, then to uint8 (x * 255.999 truncated).
FASTPIPE_HD inline void hue_pixel(float shift, uint8_t r8, uint8_t g8, uint8_t b8, uint8_t* r_out, uint8_t* g_out,
                                  uint8_t* b_out) {
  const float scale = static_cast<float>(1.0 / 255);
  const float r = mul_rn(static_cast<float>(r8), scale), g = mul_rn(static_cast<float>(g8), scale),
              b = mul_rn(static_cast<float>(b8), scale);
  const float maxc = r > g ? (r > b ? r : b) : (g > b ? g : b);
  const float minc = r < g ? (r < b ? r : b) : (g < b ? g : b);
  const bool eqc = maxc == minc;
  const float range = add_rn(maxc, -minc);
  const float s = div_rn(range, eqc ? 1.0f : maxc);
  const float divisor = eqc ? 1.0f : range;
  const float rc = div_rn(add_rn(maxc, -r), divisor), gc = div_rn(add_rn(maxc, -g), divisor),
              bc = div_rn(add_rn(maxc, -b), divisor);
  const bool maxc_neq_r = maxc != r, maxc_eq_g = maxc == g;
  const float hg = maxc_eq_g && maxc_neq_r ? add_rn(add_rn(rc, 2.0f), -bc) : 0.0f;
  const float hr = !maxc_neq_r ? add_rn(bc, -gc) : 0.0f;
  const float hb = maxc_neq_r && !maxc_eq_g ? add_rn(add_rn(gc, 4.0f), -rc) : 0.0f;
  float h = add_rn(add_rn(hr, hg), hb);
  h = add_rn(mul_rn(h, static_cast<float>(1.0 / 6.0)), 1.0f);  // > 0: fmod(h, 1) is h - trunc(h), exactly
  h = add_rn(h, -truncf(h));
  h = add_rn(h, shift);
  h = add_rn(h, -floorf(h));  // remainder(h, 1): h - 1 exactly, or h + 1 rounded as fmod + 1 rounds
  const float h6 = mul_rn(h, 6.0f);
  const float fi = floorf(h6);
  const float f = add_rn(h6, -fi);
  const int i = static_cast<int>(fi) % 6;  // h6 in [0, 6]: 6 becomes 0
  const float sxf = mul_rn(s, f), one_minus_s = add_rn(1.0f, -s), v = maxc;
  const auto clamp01 = [](float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); };
  const float q = clamp01(mul_rn(add_rn(1.0f, -sxf), v));
  const float t = clamp01(mul_rn(add_rn(sxf, one_minus_s), v));
  const float pp = clamp01(mul_rn(one_minus_s, v));
  // _hsv_to_rgb's table: r = (v, q, p, p, t, v)[i], g = (t, v, v, q, p, p)[i], b = (p, p, t, v, v, q)[i],
  // as selects (which vectorise) rather than an indexed array.
  const float r_hsv = i == 0 || i == 5 ? v : (i == 1 ? q : (i == 4 ? t : pp));
  const float g_hsv = i == 1 || i == 2 ? v : (i == 0 ? t : (i == 3 ? q : pp));
  const float b_hsv = i == 3 || i == 4 ? v : (i == 2 ? t : (i == 5 ? q : pp));
  const float to_u8 = static_cast<float>(255.0 + 1.0 - 1e-3);  // to_dtype_image's float -> uint8
  *r_out = static_cast<uint8_t>(mul_rn(r_hsv, to_u8));
  *g_out = static_cast<uint8_t>(mul_rn(g_hsv, to_u8));
  *b_out = static_cast<uint8_t>(mul_rn(b_hsv, to_u8));
}

// GaussianBlur's 1-D weights for an odd kernel of `taps` and sigma, as _get_gaussian_kernel1d makes them
// in float32 (softmax of -(x / sigma)^2 over x = linspace(-lim, lim), lim = (taps - 1) / (2 sqrt 2)): the
// exponentials and the sum in double, so each weight is within a unit or two of the last place of
// torch's.
inline void gaussian_weights(int taps, float sigma, float* w) {
  const float lim = static_cast<float>((taps - 1) / (2.0 * sqrt(2.0)));
  const float step = taps > 1 ? (lim - -lim) / static_cast<float>(taps - 1) : 0.0f;
  double e[kMaxBlurTaps], sum = 0.0, top = -1e300;
  for (int i = 0; i < taps; ++i) {
    const float x = i < taps / 2 ? -lim + step * static_cast<float>(i) : lim - step * static_cast<float>(taps - 1 - i);
    const float t = x / sigma;
    e[i] = -static_cast<double>(t * t);
    top = e[i] > top ? e[i] : top;
  }
  for (int i = 0; i < taps; ++i) sum += (e[i] = exp(e[i] - top));
  for (int i = 0; i < taps; ++i) w[i] = static_cast<float>(e[i] / sum);
}

// Reflect padding's source index for index i of an axis of n (|i - clamp| < n where the kernel fits, as
// the specs' checks require); an index past that is clamped to the axis, so that a kernel that does not
// fit still reads only the image.
FASTPIPE_HD inline int reflect(int i, int n) {
  const int r = i < 0 ? -i : (i >= n ? 2 * n - 2 - i : i);
  return r < 0 ? 0 : (r >= n ? n - 1 : r);
}

// GaussianBlur, rows (y) first, then columns (x), each sum in order from the first tap, then rounded
// (half to even) as torchvision rounds its float result. In two passes (the reader threads', the
// device's): blur_column at every pixel of a plane, then blur_row over those sums; blurred_value is the
// same sums for one value.
FASTPIPE_HD inline float blur_column(const PlannedOp& p, const float* wy, const uint8_t* plane, int h, int w, int y,
                                     int x) {
  const int ry = p.taps[1] / 2;
  float column = 0.0f;
  for (int i = 0; i < p.taps[1]; ++i)
    column = add_rn(column, mul_rn(wy[i], static_cast<float>(plane[static_cast<int64_t>(reflect(y + i - ry, h)) * w + x])));
  return column;
}
FASTPIPE_HD inline uint8_t blur_row(const PlannedOp& p, const float* wx, const float* columns, int w, int y, int x) {
  const int rx = p.taps[0] / 2;
  float acc = 0.0f;
  for (int j = 0; j < p.taps[0]; ++j)
    acc = add_rn(acc, mul_rn(wx[j], columns[static_cast<int64_t>(y) * w + reflect(x + j - rx, w)]));
  return static_cast<uint8_t>(round_even(acc));
}
FASTPIPE_HD inline uint8_t blurred_value(const PlannedOp& p, const float* wx, const float* wy, const uint8_t* plane,
                                         int h, int w, int y, int x) {
  const int rx = p.taps[0] / 2;
  float acc = 0.0f;
  for (int j = 0; j < p.taps[0]; ++j)
    acc = add_rn(acc, mul_rn(wx[j], blur_column(p, wy, plane, h, w, y, reflect(x + j - rx, w))));
  return static_cast<uint8_t>(round_even(acc));
}

// AugMix's mixing at pixel `at` of the image `img` (3 planes of `plane` values), in place, as torchvision's
// AugMix computes it in float32: mix = m0 * image, then mix.add_(w * chain) per chain, then .to(uint8)
// (truncation); `original`: the image the chains start from (3 planes), `mix`: the sums (3 float planes).
FASTPIPE_HD inline void mix_pixel(const PlannedOp& p, uint8_t* img, uint8_t* original, float* mix, int64_t plane,
                                  int64_t at) {
  for (int c = 0; c < 3; ++c) {
    const int64_t i = c * plane + at;
    const float weighted = mul_rn(p.ratio, static_cast<float>(img[i]));
    if (p.op == static_cast<int32_t>(AugOp::kMixOriginal)) {
      original[i] = img[i];
      mix[i] = weighted;
    } else if (p.op == static_cast<int32_t>(AugOp::kMixChain)) {
      mix[i] = add_rn(mix[i], weighted);
      img[i] = original[i];
    } else {
      const float m = add_rn(mix[i], weighted);
      img[i] = static_cast<uint8_t>(m < 0.0f ? 0.0f : (m > 255.0f ? 255.0f : m));
    }
  }
}

// Output pixel (y, x) of op p on the h x w image `src` (3 planes, channel c at c * h * w), its 3 values
// stored at the same place in `dst`; `lut`: its tables (kTable), `fill`: the value outside the image
// (geometric ops), `blur`: a kBlur's weights (x's, then y's at kMaxBlurTaps).
FASTPIPE_HD inline void op_pixel(const PlannedOp& p, const uint8_t* lut, const uint8_t* fill, const uint8_t* src,
                                 int h, int w, int y, int x, uint8_t* dst, const float* blur = nullptr) {
  const int64_t plane = static_cast<int64_t>(h) * w, at = static_cast<int64_t>(y) * w + x;
  int64_t from = at;
  switch (static_cast<OpKind>(p.kind)) {
    case OpKind::kTable:
      for (int c = 0; c < 3; ++c) dst[c * plane + at] = lut[c * 256 + src[c * plane + at]];
      return;
    case OpKind::kColor: {
      const float grey = floored_grey(src[at], src[plane + at], src[2 * plane + at]);
      for (int c = 0; c < 3; ++c) dst[c * plane + at] = blend(p, static_cast<float>(src[c * plane + at]), grey);
      return;
    }
    case OpKind::kHue:
      hue_pixel(p.ratio, src[at], src[plane + at], src[2 * plane + at], dst + at, dst + plane + at,
                dst + 2 * plane + at);
      return;
    case OpKind::kBlur:
      for (int c = 0; c < 3; ++c)
        dst[c * plane + at] = blurred_value(p, blur, blur + kMaxBlurTaps, src + c * plane, h, w, y, x);
      return;
    case OpKind::kGrey: {
      const uint8_t grey = static_cast<uint8_t>(floored_grey(src[at], src[plane + at], src[2 * plane + at]));
      for (int c = 0; c < 3; ++c) dst[c * plane + at] = grey;
      return;
    }
    case OpKind::kSharpness: {
      if (y == 0 || x == 0 || y == h - 1 || x == w - 1) break;
      for (int c = 0; c < 3; ++c) {
        const uint8_t* v = src + c * plane + at;
        int sum = 0;
        for (int dy = -1; dy <= 1; ++dy)
          for (int dx = -1; dx <= 1; ++dx) sum += v[dy * w + dx];
        dst[c * plane + at] = sharpened(p, v[0], sum);
      }
      return;
    }
    case OpKind::kAffine: {
      int sy = 0, sx = 0;
      if (!affine_source(p, h, w, y, x, &sy, &sx)) {
        for (int c = 0; c < 3; ++c) dst[c * plane + at] = fill[c];
        return;
      }
      from = static_cast<int64_t>(sy) * w + sx;
      break;
    }
    case OpKind::kBilinear: {
      float iy = 0.0f, ix = 0.0f;
      affine_position(p, h, w, y, x, &iy, &ix);
      bilinear_pixel(p, src, h, w, iy, ix, dst, at);
      return;
    }
    case OpKind::kBicubic: {
      float iy = 0.0f, ix = 0.0f;
      affine_position(p, h, w, y, x, &iy, &ix);
      bicubic_pixel(p, src, h, w, iy, ix, dst, at);
      return;
    }
    case OpKind::kQuarterTurns: {
      int sy = 0, sx = 0;
      quarter_turn_source(p.turns, h, w, y, x, &sy, &sx);
      from = static_cast<int64_t>(sy) * w + sx;
      break;
    }
    default: break;
  }
  for (int c = 0; c < 3; ++c) dst[c * plane + at] = src[c * plane + from];
}

}  // namespace fastpipe::images
