// The resize's taps: which source pixels each output of an axis reads, and with what weights, for the
// three filters torchvision's Resize and RandomResizedCrop take (antialiased bilinear and bicubic, and
// nearest), in the arithmetic of the path a torchvision pipeline runs them on:
// - PIL (torchvision on PIL images, its default): weights from the filter stretched by the shrink
//   (PIL's Resample.c), normalised to sum 1. Bilinear is summed here in float (within a level of PIL's
//   fixed point: its weights are >= 0). Bicubic is summed as PIL sums it, because its negative lobes make
//   PIL's rounding matter: two passes, horizontal first, each in 22-bit fixed point and clipped to uint8.
//   Nearest takes the pixel under each output's centre, positions accumulated a step at a time in
//   double (ImagingScaleAffine).
// - torch's uint8 kernels (torchvision.transforms.v2 on uint8 CPU tensors): the same, but the fixed-point
//   weights are int16, at the most bits the axis's largest weight leaves (UpSampleKernel.cpp's
//   _compute_index_ranges_int16_weights), and the cubic is evaluated in torch's order; nearest is
//   floor(o * scale) in float (torch's legacy "nearest").
// - torch's float kernels (torchvision.transforms v1 on tensors, and any float resize): one float pass,
//   clamped to [0, 255] and rounded half to even, as torchvision rounds its uint8 result.
// Bicubic's a is -0.5 in all three (torch's antialiased cubic is PIL's; -0.75 is its non-antialiased one).
//
// Plain C++ (no torch, no CUDA headers outside nvcc): the CPU tests execute these functions.
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/float_rounding.h"
#include "kernels/host_device.h"

namespace fastpipe::images {

enum class Filter : int32_t { kBilinear = 0, kBicubic = 1, kNearest = 2 };
enum class ResizeAs : int32_t { kPil = 0, kTorchUint8 = 1, kTorchFloat = 2 };

constexpr int kPilPrecision = 22;  // PIL's PRECISION_BITS: 32 - 8 bits of a pixel - 2 guard bits

// One axis of the resampling. Output o samples source position origin + in0 + (start + o + 0.5) * step
// (in pixels of the decoded image, pixel p covering [p, p + 1)); its taps are clamped to source pixels
// [origin, origin + size). Outputs outside [valid_lo, valid_hi) are padding (value 0, no taps). `start`
// is CenterCrop's first resized pixel, kept apart from in0 so that positions round as PIL's do.
struct Axis {
  double in0 = 0.0;
  double step = 1.0;
  int start = 0;
  int origin = 0;
  int size = 0;
  int valid_lo = 0, valid_hi = 0;
  Filter filter = Filter::kBilinear;
  ResizeAs as = ResizeAs::kPil;
  // Bits of the fixed-point weights where the axis is summed in fixed point (fixed_point()); else 0.
  int32_t precision = 0;
};

// Whether the axes are summed in two fixed-point passes rounded to uint8 (bicubic as PIL or torch's uint8
// kernels sum it); else in one float pass.
FASTPIPE_HD inline bool fixed_point(Filter f, ResizeAs as) {
  return f == Filter::kBicubic && as != ResizeAs::kTorchFloat;
}

FASTPIPE_HD inline double filter_scale(const Axis& a) { return a.step > 1.0 ? a.step : 1.0; }

// Half-width of the filter in source pixels (PIL's support * filterscale).
FASTPIPE_HD inline double filter_support(const Axis& a) {
  return a.filter == Filter::kBicubic ? 2.0 * filter_scale(a) : filter_scale(a);
}

// Most taps any output of the axis has (PIL's ksize).
FASTPIPE_HD inline int max_taps(const Axis& a) {
  if (a.filter == Filter::kNearest) return 1;
  return 2 * static_cast<int>(ceil(filter_support(a))) + 1;
}

// The filter at x (in units of the stretched filter), bicubic in the evaluation order of the kernel it
// reproduces (PIL's bicubic_filter, or torch's cubic_convolution1/2): the weights' last bits decide ties
// of the fixed-point sums.
// Each operation rounded as written (mul_rn, add_rn): nvcc would fuse a * b + c on the device, where the
// host rounds twice (-ffp-contract=off), and the weights would differ in their last bits.
FASTPIPE_HD inline double filter_weight(const Axis& a, double x) {
  x = fabs(x);
  if (a.filter == Filter::kBilinear) return x < 1.0 ? 1.0 - x : 0.0;
  const double A = -0.5;
  if (x < 1.0) return add_rn(mul_rn(mul_rn(add_rn(mul_rn(A + 2.0, x), -(A + 3.0)), x), x), 1.0);
  if (x >= 2.0) return 0.0;
  if (a.as == ResizeAs::kPil) return mul_rn(add_rn(mul_rn(add_rn(mul_rn(x - 5.0, x), 8.0), x), -4.0), A);
  return add_rn(mul_rn(add_rn(mul_rn(add_rn(mul_rn(A, x), -5.0 * A), x), 8.0 * A), x), -4.0 * A);
}

// The centre of resized pixel k in source pixels (PIL's center = (k + 0.5) * scale, offset by the crop).
FASTPIPE_HD inline double tap_center(const Axis& a, int k) { return add_rn(a.in0, mul_rn(k + 0.5, a.step)); }

// The source pixel (relative to the origin) a nearest resize takes for resized pixel k.
FASTPIPE_HD inline int nearest_tap(const Axis& a, int k) {
  int i;
  if (a.as == ResizeAs::kPil) {
    double x = a.step * 0.5;  // ImagingScaleAffine: a[2] + a[0] * 0.5, then a[0] added per pixel
    for (int j = 0; j < k; ++j) x += a.step;
    i = static_cast<int>(a.in0 + x);
  } else {
    const float scale = static_cast<float>(a.step);  // torch's scale, in float
    i = static_cast<int>(floorf(static_cast<float>(k) * scale) + static_cast<float>(a.in0));
  }
  return i < 0 ? 0 : (i >= a.size ? a.size - 1 : i);
}

// Resized pixel k's taps as [lo, hi) relative to the axis's origin (PIL's rounding and clamping).
FASTPIPE_HD inline void resized_tap_range(const Axis& a, int k, int* lo, int* hi) {
  if (a.filter == Filter::kNearest) {
    *lo = nearest_tap(a, k);
    *hi = *lo + 1;
    return;
  }
  const double support = filter_support(a);
  const double center = tap_center(a, k);
  const int l = static_cast<int>(center - support + 0.5);
  const int h = static_cast<int>(center + support + 0.5);
  *lo = l < 0 ? 0 : l;
  *hi = h > a.size ? a.size : h;
}

// Output o's taps as [lo, hi) relative to the axis's origin; hi <= lo for padding.
FASTPIPE_HD inline void tap_range(const Axis& a, int o, int* lo, int* hi) {
  if (o < a.valid_lo || o >= a.valid_hi) {
    *lo = *hi = 0;
    return;
  }
  resized_tap_range(a, a.start + o, lo, hi);
}

// A normalised weight as the arithmetic of the axis keeps it: float, or fixed point of `precision` bits
// rounded half away from zero (PIL's normalize_coeffs_8bpc, torch's int16 rescale).
FASTPIPE_HD inline int32_t fixed_weight(double w, int precision) {
  const double v = w * static_cast<double>(1 << precision);
  return v < 0.0 ? static_cast<int32_t>(-0.5 + v) : static_cast<int32_t>(0.5 + v);
}
FASTPIPE_HD inline void put_weight(float* w, double v, int) { *w = static_cast<float>(v); }
FASTPIPE_HD inline void put_weight(int32_t* w, double v, int precision) { *w = fixed_weight(v, precision); }

// Resized pixel k's taps: source pixels a.origin + *first ... of weights w[0, n) (n returned, at most
// max_taps(a)), normalised to sum 1 (all zero where every weight is zero).
template <typename W>
FASTPIPE_HD inline int resized_taps(const Axis& a, int k, int* first, W* w) {
  int lo = 0, hi = 0;
  resized_tap_range(a, k, &lo, &hi);
  *first = lo;
  const int n = hi > lo ? hi - lo : 0;
  if (a.filter == Filter::kNearest) {
    if (n) put_weight(w, 1.0, a.precision);
    return n;
  }
  const double center = tap_center(a, k);
  const double inv = 1.0 / filter_scale(a);
  double sum = 0.0;
  for (int j = 0; j < n; ++j) sum += filter_weight(a, (lo + j - center + 0.5) * inv);
  for (int j = 0; j < n; ++j) {
    const double v = filter_weight(a, (lo + j - center + 0.5) * inv);
    put_weight(w + j, sum != 0.0 ? v / sum : 0.0, a.precision);
  }
  return n;
}

// Output o's taps (resized_taps of its resized pixel); none for padding.
template <typename W>
FASTPIPE_HD inline int output_taps(const Axis& a, int o, int* first, W* w) {
  if (o < a.valid_lo || o >= a.valid_hi) {
    *first = 0;
    return 0;
  }
  return resized_taps(a, a.start + o, first, w);
}

// The fixed-point bits of an axis of `resized` pixels: PIL's 22, or torch's int16 weights' (the most
// bits under which the axis's largest weight, over every resized pixel, still fits in 15).
FASTPIPE_HD inline int fixed_precision(const Axis& a, int resized) {
  if (a.as == ResizeAs::kPil) return kPilPrecision;
  Axis real = a;
  real.filter = Filter::kBicubic;
  double largest = 0.0;
  for (int k = 0; k < resized; ++k) {
    int lo = 0, hi = 0;
    resized_tap_range(real, k, &lo, &hi);
    const double center = tap_center(a, k);
    const double inv = 1.0 / filter_scale(a);
    double sum = 0.0;
    for (int j = lo; j < hi; ++j) sum += filter_weight(real, (j - center + 0.5) * inv);
    if (sum == 0.0) continue;
    for (int j = lo; j < hi; ++j) {
      const double v = filter_weight(real, (j - center + 0.5) * inv) / sum;
      largest = v > largest ? v : largest;
    }
  }
  int bits = 0;
  for (; bits < 22; ++bits) {
    if (static_cast<int>(0.5 + largest * (1 << (bits + 1))) >= (1 << 15)) break;
  }
  return bits;
}

// A fixed-point sum (started at half of its last bit) as a uint8: PIL's clip8, torch's clamp of the shift.
FASTPIPE_HD inline int clip8(int32_t acc, int precision) {
  if (acc <= 0) return 0;
  const int32_t v = acc >> precision;
  return v > 255 ? 255 : v;
}

// A float resample's value as torch's float kernels leave a uint8 image: clamped, rounded half to even.
FASTPIPE_HD inline float torch_float_uint8(float v) { return rintf(v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v)); }

}  // namespace fastpipe::images
