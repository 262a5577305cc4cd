// The geometric ops' sampling per pixel (augment_ops.h): torchvision's affine grid and grid_sample,
// nearest, bilinear and bicubic, with its fill; rot90's source pixel.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/augment_types.h"

namespace fastpipe::images {

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

}  // namespace fastpipe::images
