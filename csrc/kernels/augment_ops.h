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

#include "kernels/augment_filters.h"
#include "kernels/augment_geometry.h"
#include "kernels/augment_types.h"
#include "kernels/float_rounding.h"
#include "kernels/host_device.h"

namespace fastpipe::images {

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

// ---- per pixel: the op families' own in augment_geometry.h and augment_filters.h ---------------------

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
