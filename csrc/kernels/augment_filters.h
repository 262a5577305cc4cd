// The per-pixel colour and neighbourhood ops (augment_ops.h): ColorJitter's hue, GaussianBlur's two
// separable passes with reflected borders, and AugMix's mixing.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/augment_types.h"

namespace fastpipe::images {

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

}  // namespace fastpipe::images
