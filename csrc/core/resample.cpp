#include "core/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/resample_rows.h"

namespace fastpipe {
namespace {

using images::ImageTransformParams;
using images::kChannels;
using images::OutDtype;
using resample_rows::axis_taps;
using resample_rows::store_row;

// Four floats in one register: a pixel's R, G, B (and a lane that is ignored). GCC's and clang's
// vector extension: SSE2 on any x86-64, NEON on ARM, no CPU dispatch needed.
using v4 = float __attribute__((vector_size(16)));

inline v4 load4(const float* p) {
  v4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// One output row's vertical taps over the region's whole width (n floats): K source rows weighted and
// summed in registers, one store per value; the compiler vectorises over j. K = 0: `taps` at run time.
template <int K>
void vertical(const float* const* rows, const float* w, int taps, int64_t n, float* __restrict__ out) {
  const int k = K ? K : taps;
  for (int64_t j = 0; j < n; ++j) {
    float acc = 0.0f;
    for (int t = 0; t < k; ++t) acc += w[t] * rows[t][j];
    out[j] = acc;
  }
}

// One output row's horizontal taps: per output pixel, K taps of a whole RGB pixel each (one unaligned
// 4-float load; `row` is padded so that the last pixel's load stays inside), written to the channel
// planes at the output's place (flipped or not).
template <int K>
void horizontal(const float* row, const int* first, const float* weights, int stride, int taps, int ow, bool flip,
                float* __restrict__ r, float* __restrict__ g, float* __restrict__ b) {
  const int k = K ? K : taps;
  for (int ox = 0; ox < ow; ++ox) {
    const float* px = row + 3 * static_cast<int64_t>(first[ox]);
    const float* w = weights + static_cast<int64_t>(ox) * stride;
    v4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int t = 0; t < k; ++t) acc += w[t] * load4(px + 3 * t);
    r[ox] = acc[0];
    g[ox] = acc[1];
    b[ox] = acc[2];
  }
  if (flip) {
    std::reverse(r, r + ow);
    std::reverse(g, g + ow);
    std::reverse(b, b + ow);
  }
}

template <OutDtype D, int KY, int KX>
void resample(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
              const images::Region& r, void* out, ResampleScratch& s) {
  const int oh = p.out_height, ow = p.out_width;
  const int ky = axis_taps(g.y, oh, r.y0, s.y_first, s.y_weights);
  const int kx = axis_taps(g.x, ow, r.x0, s.x_first, s.x_weights);
  const int64_t row_floats = static_cast<int64_t>(r.x1 - r.x0) * kChannels;
  // Padding: the taps past an output's own count (zero weights) and the lane after the last pixel.
  const int64_t padded = row_floats + 3 * static_cast<int64_t>(kx) + 4;
  s.row.resize(static_cast<size_t>(padded + 3 * ow));
  float* row = s.row.data();
  std::fill(row + row_floats, row + padded, 0.0f);
  float* const planes[kChannels] = {row + padded, row + padded + ow, row + padded + 2 * ow};
  // The region as floats, each value converted once (an output row reads up to ky source rows).
  const int rh = r.y1 - r.y0;
  s.region.resize(static_cast<size_t>(std::max<int64_t>(1, rh * row_floats)));
  for (int y = 0; y < rh; ++y) {
    const uint8_t* in = src + y * stride;
    float* f = s.region.data() + y * row_floats;
    for (int64_t j = 0; j < row_floats; ++j) f[j] = static_cast<float>(in[j]);
  }
  const float* rows[64];
  std::vector<const float*> many;
  const float** taps_rows = rows;
  if (ky > 64) {
    many.resize(static_cast<size_t>(ky));
    taps_rows = many.data();
  }
  const bool round = p.filter == images::Filter::kBicubic;  // torch's float bicubic leaves uint8 values
  for (int oy = 0; oy < oh; ++oy) {
    const float* wy = s.y_weights.data() + static_cast<size_t>(oy) * ky;
    if (row_floats > 0 && std::any_of(wy, wy + ky, [](float w) { return w != 0.0f; })) {
      // Rows past this output's own taps have zero weights: any row of the region serves.
      const int first = s.y_first[oy], last = r.y1 - r.y0 - 1;
      for (int t = 0; t < ky; ++t) taps_rows[t] = s.region.data() + std::min(first + t, last) * row_floats;
      vertical<KY>(taps_rows, wy, ky, row_floats, row);
      horizontal<KX>(row, s.x_first.data(), s.x_weights.data(), kx, kx, ow, g.flip, planes[0], planes[1], planes[2]);
      if (round) {
        for (float* pl : planes) std::transform(pl, pl + ow, pl, images::torch_float_uint8);
      }
    } else {  // padding: the whole row is 0 before normalisation
      for (float* pl : planes) std::fill(pl, pl + ow, 0.0f);
    }
    store_row<D>(p, g.erase, oy, planes, out);
  }
}

// The taps per axis are 2 * ceil(max(step, 1)) + 1: 3 when enlarging, 5 for a shrink of up to 2x (the
// common case: DCT scaling leaves less than 2x), 7 up to 3x; others take the run-time count.
template <OutDtype D, int KY>
void resample_kx(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
                 const images::Region& r, void* out, ResampleScratch& s) {
  switch (images::max_taps(g.x)) {
    case 3: return resample<D, KY, 3>(p, g, src, stride, r, out, s);
    case 5: return resample<D, KY, 5>(p, g, src, stride, r, out, s);
    case 7: return resample<D, KY, 7>(p, g, src, stride, r, out, s);
    default: return resample<D, KY, 0>(p, g, src, stride, r, out, s);
  }
}

template <OutDtype D>
void resample_dtype(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
                    const images::Region& r, void* out, ResampleScratch& s) {
  switch (images::max_taps(g.y)) {
    case 3: return resample_kx<D, 3>(p, g, src, stride, r, out, s);
    case 5: return resample_kx<D, 5>(p, g, src, stride, r, out, s);
    case 7: return resample_kx<D, 7>(p, g, src, stride, r, out, s);
    default: return resample_kx<D, 0>(p, g, src, stride, r, out, s);
  }
}

// The augmented uint8 image `img` (3 planes) normalised, converted and erased into `out`, a row at a time.
template <OutDtype D>
void store_augmented(const ImageTransformParams& p, const images::EraseBox& e, const uint8_t* img, void* out,
                     ResampleScratch& s) {
  const int oh = p.out_height, ow = p.out_width;
  const int64_t plane = static_cast<int64_t>(oh) * ow;
  s.row.resize(static_cast<size_t>(3 * ow));
  float* const planes[kChannels] = {s.row.data(), s.row.data() + ow, s.row.data() + 2 * ow};
  for (int oy = 0; oy < oh; ++oy) {
    for (int c = 0; c < kChannels; ++c) {
      const uint8_t* px = img + c * plane + static_cast<int64_t>(oy) * ow;
      for (int x = 0; x < ow; ++x) planes[c][x] = static_cast<float>(px[x]);
    }
    store_row<D>(p, e, oy, planes, out);
  }
}

// The resample of one image in p's dtype and layout, in the arithmetic its filter is summed in.
void resample_any(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
                  const images::Region& region, void* out, ResampleScratch& s) {
  if (images::fixed_point(p.filter, p.resize_as)) return resample_rows::resample_fixed(p, g, src, stride, region, out, s);
  switch (p.out_dtype) {
    case OutDtype::Float32: return resample_dtype<OutDtype::Float32>(p, g, src, stride, region, out, s);
    case OutDtype::Float16: return resample_dtype<OutDtype::Float16>(p, g, src, stride, region, out, s);
    case OutDtype::BFloat16: return resample_dtype<OutDtype::BFloat16>(p, g, src, stride, region, out, s);
    case OutDtype::UInt8: return resample_dtype<OutDtype::UInt8>(p, g, src, stride, region, out, s);
  }
}

// Resized to uint8 (rounded, without the erasing), augmented, then stored as p asks.
void resample_augmented(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
                        const images::Region& region, void* out, ResampleScratch& s) {
  ImageTransformParams resized = p;
  resized.out_dtype = OutDtype::UInt8;
  resized.out_nhwc = false;  // planes
  images::Geometry whole = g;
  whole.erase = images::EraseBox{};
  s.augment.image.resize(static_cast<size_t>(p.out_height) * p.out_width * kChannels);
  resample_any(resized, whole, src, stride, region, s.augment.image.data(), s);
  augment_image(g.ops, p.augment.fill, p.out_height, p.out_width, s.augment);
  const uint8_t* img = s.augment.image.data();
  switch (p.out_dtype) {
    case OutDtype::Float32: return store_augmented<OutDtype::Float32>(p, g.erase, img, out, s);
    case OutDtype::Float16: return store_augmented<OutDtype::Float16>(p, g.erase, img, out, s);
    case OutDtype::BFloat16: return store_augmented<OutDtype::BFloat16>(p, g.erase, img, out, s);
    case OutDtype::UInt8: return store_augmented<OutDtype::UInt8>(p, g.erase, img, out, s);
  }
}

}  // namespace

void resample_image(const ImageTransformParams& p, const images::Geometry& g, const uint8_t* src, int64_t stride,
                    const images::Region& region, void* out, ResampleScratch& s) {
  if (p.augment.stages > 0) return resample_augmented(p, g, src, stride, region, out, s);
  resample_any(p, g, src, stride, region, out, s);
}

}  // namespace fastpipe
