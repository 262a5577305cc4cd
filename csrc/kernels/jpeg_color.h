// A JPEG decoded on the device into planar YCbCr, each component at its own resolution (nvJPEG's
// NVJPEG_OUTPUT_YUV), and libjpeg-turbo's way from there to RGB, per pixel: its "fancy" (triangle)
// chroma upsampling and its fixed-point YCbCr -> RGB conversion. The resample kernel reads every tap
// through ycc_pixel, so that an image decoded on the GPU gives the host path's RGB values before the
// resample instead of nvJPEG's own upsampling (up to 76 levels off on hard colour edges on an H200).
//
// The rules follow libjpeg-turbo's jdsample.c (jinit_upsampler's choice per component, h2v1/h1v2/h2v2
// fancy, int_upsample's box otherwise), its main controller's edge rows (the row above the first and
// below the last chroma row repeat them) and jdcolor.c's tables. The CPU tests check every pixel of
// ycc_pixel against libjpeg's own decode of the same planes (fastpipe::_jpeg_ycc_model). Plain C++
// outside nvcc.
#pragma once

#include <stdint.h>

#include "kernels/host_device.h"

namespace fastpipe::images {

// How the device's JPEG decoder wrote an image into its staging.
enum class DecodedLayout : int32_t {
  kRgbInterleaved = 0,  // height x width x 3, rows packed (nvJPEG's RGBI: its own chroma upsampling)
  kYccPlanar = 1,       // YccPlanes
};

// Where an image's components lie in its staging, each plane packed (pitch = its width): Y, then Cb,
// then Cr. A grayscale image has Y only; room for full-size chroma planes is kept after it all the same,
// for a decoder that writes neutral chroma there.
struct YccPlanes {
  int32_t height = 0, width = 0;      // Y's: the image's
  int32_t c_height = 0, c_width = 0;  // Cb's and Cr's (libjpeg's downsampled_height and _width)
  int32_t v_ratio = 1, h_ratio = 1;   // Y samples per chroma sample, vertically and horizontally
  int32_t gray = 0;
  int64_t cb_offset = 0, cr_offset = 0;  // bytes from Y's first
};

// The planes of a height x width image whose chroma is sampled 1 in v_ratio rows and 1 in h_ratio columns.
FASTPIPE_HD inline YccPlanes ycc_planes(int height, int width, int v_ratio, int h_ratio, bool gray) {
  YccPlanes p;
  p.height = height;
  p.width = width;
  p.v_ratio = gray ? 1 : v_ratio;
  p.h_ratio = gray ? 1 : h_ratio;
  p.gray = gray;
  p.c_height = (height + p.v_ratio - 1) / p.v_ratio;
  p.c_width = (width + p.h_ratio - 1) / p.h_ratio;
  p.cb_offset = static_cast<int64_t>(height) * width;
  p.cr_offset = p.cb_offset + static_cast<int64_t>(p.c_height) * p.c_width;
  return p;
}

// Bytes of staging the planes take (at most height * width * 3).
FASTPIPE_HD inline int64_t ycc_planes_bytes(const YccPlanes& p) {
  return p.cr_offset + static_cast<int64_t>(p.c_height) * p.c_width;
}

// Chroma plane `c` (c_height x c_width) upsampled to full-resolution pixel (y, x) as libjpeg-turbo does it.
FASTPIPE_HD inline int upsampled_chroma(const uint8_t* c, const YccPlanes& p, int y, int x) {
  const int cw = p.c_width;
  const auto at = [&](int row, int col) { return static_cast<int>(c[static_cast<int64_t>(row) * cw + col]); };
  // libjpeg filters horizontally only where a chroma row has more than 2 samples (else the box below).
  const bool fancy_h = p.h_ratio == 2 && cw > 2;
  if (p.v_ratio == 2 && (p.h_ratio == 1 || fancy_h)) {
    // 3/4 of the nearer chroma row and 1/4 of the other neighbour (above for even rows, below for odd),
    // the edge rows repeated; h1v2 rounds with a bias of 1 above and 2 below (libjpeg-turbo 2.0 on).
    const int r = y >> 1;
    int other = (y & 1) ? r + 1 : r - 1;
    other = other < 0 ? 0 : other >= p.c_height ? p.c_height - 1 : other;
    if (p.h_ratio == 1) return (3 * at(r, x) + at(other, x) + 1 + (y & 1)) >> 2;  // h1v2_fancy_upsample
    // h2v2_fancy_upsample: the same per column, then 3/4 and 1/4 of the column sums, rounding biased
    // alternately (7 and 8 of 16).
    const int cc = x >> 1;
    const auto colsum = [&](int col) { return 3 * at(r, col) + at(other, col); };
    const int t = colsum(cc);
    if (x & 1) return cc == cw - 1 ? (t * 4 + 7) >> 4 : (t * 3 + colsum(cc + 1) + 7) >> 4;
    return cc == 0 ? (t * 4 + 8) >> 4 : (t * 3 + colsum(cc - 1) + 8) >> 4;
  }
  if (p.v_ratio == 1 && fancy_h) {  // h2v1_fancy_upsample: the first and last outputs copy their sample
    const int cc = x >> 1, v = at(y, cc);
    if (x & 1) return cc == cw - 1 ? v : (v * 3 + at(y, cc + 1) + 2) >> 2;
    return cc == 0 ? v : (v * 3 + at(y, cc - 1) + 1) >> 2;
  }
  return at(y / p.v_ratio, x / p.h_ratio);  // full size, or a box (int_upsample, h2v1/h2v2_upsample)
}

FASTPIPE_HD inline int clamp_sample(int v) { return v < 0 ? 0 : v > 255 ? 255 : v; }

// Channel c (0 R, 1 G, 2 B) of jdcolor.c's ycc_rgb_convert: 16-bit fixed point, FIX(x) = x * 65536
// rounded, a half added before the shift (to G's sum of both terms once), the result clamped.
FASTPIPE_HD inline int ycc_to_rgb(int y, int cb, int cr, int c) {
  constexpr int kHalf = 1 << 15;
  if (c == 0) return clamp_sample(y + ((91881 * (cr - 128) + kHalf) >> 16));   // FIX(1.40200)
  if (c == 2) return clamp_sample(y + ((116130 * (cb - 128) + kHalf) >> 16));  // FIX(1.77200)
  return clamp_sample(y + ((-22554 * (cb - 128) + kHalf - 46802 * (cr - 128)) >> 16));  // FIX(0.34414), FIX(0.71414)
}

// Channel c of pixel (y, x) of an image decoded into planes p at `image`: the value libjpeg-turbo's RGB
// decode of the whole image gives (JDCT_ISLOW, fancy upsampling) from the same planes.
FASTPIPE_HD inline int ycc_pixel(const uint8_t* image, const YccPlanes& p, int y, int x, int c) {
  const int luma = image[static_cast<int64_t>(y) * p.width + x];
  if (p.gray) return luma;
  const int cb = c != 0 ? upsampled_chroma(image + p.cb_offset, p, y, x) : 128;
  const int cr = c != 2 ? upsampled_chroma(image + p.cr_offset, p, y, x) : 128;
  return ycc_to_rgb(luma, cb, cr, c);
}

}  // namespace fastpipe::images
